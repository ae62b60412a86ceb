"""Drop-in tasks: the README's example task, written to a temporary directory and passed with --include, trains."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from bench import ROOT
from bench.tracking import WARM_START_EXPERIMENT


def readme_example(name: str, lang: str = "python") -> str:
    """The code block between <!-- example-NAME --> and <!-- /example-NAME --> in README.md or a page of docs/."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    text = "\n".join(p.read_text() for p in pages)
    blocks = re.findall(rf"<!-- example-{name} -->\s*```{lang}\n(.*?)```\s*<!-- /example-{name} -->", text, re.S)
    assert len(blocks) == 1, f"README.md and docs/ hold {len(blocks)} examples named {name}, not one"
    return blocks[0]


def test_readme_example_task_trains_two_steps_via_include(tmp_path, store):
    """The README's `reverse` task, dropped into a directory given with --include, warm-starts with SFT and trains
    2 GRPO steps through the real CLI in a subprocess; the MLflow run is FINISHED with the task's tag."""
    d = tmp_path / "mytasks"
    d.mkdir()
    (d / "reverse.py").write_text(readme_example("task"))
    args = [
        sys.executable,
        "-m",
        "bench",
        "train",
        "--include",
        str(d),
        "algorithm=grpo",
        "task=reverse",
        "init=sft",
        "warm_start.max_steps=5",
        "trainer.max_steps=2",
        "trainer.eval_every=100",
        "trainer.progress_bar=false",
        "task.num_eval=8",
        "rollout.prompts_per_step=4",
        "rollout.group_size=4",
        "rollout.max_new_tokens=8",
        "model.hidden_size=32",
        "model.num_layers=2",
        "model.num_heads=2",
        "model.intermediate_size=64",
        *store["args"],
    ]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    run_id = re.search(r"MLflow run (\w+)", proc.stdout).group(1)
    run = MlflowClient(tracking_uri=store["uri"]).get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["task"] == "reverse", (run.info.status, run.data.tags)
    listing = subprocess.run(
        [sys.executable, "-m", "bench", "list", "--include", str(d)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "reverse" in listing.stdout and "Spell a random word backwards" in listing.stdout, listing.stdout


def test_the_environment_example_trains_two_gigpo_steps_via_include(tmp_path, store):
    """docs/environments.md's `guess` environment, dropped in with --include, warm-starts on its demonstrations
    (whole episodes) and trains 2 GiGPO steps through the CLI; the run logs its turns, and the environment contract
    (demonstrations score 1, hostile actions are ordinary turns) holds for it."""
    d = tmp_path / "envtasks"
    d.mkdir()
    (d / "guess.py").write_text(readme_example("environment"))
    args = [sys.executable, "-m", "bench", "train", "--include", str(d), "algorithm=gigpo", "task=guess", "init=sft",
            "warm_start.max_steps=5", "trainer.max_steps=2", "trainer.eval_every=2", "trainer.progress_bar=false",
            "task.num_eval=8", "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_turns=6",
            "rollout.turn_tokens=4", "rollout.max_new_tokens=48", "model.hidden_size=32", "model.num_layers=2",
            "model.num_heads=2", "model.intermediate_size=64", *store["args"]]  # fmt: skip
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    run_id = re.search(r"MLflow run (\w+)", proc.stdout).group(1)
    run = MlflowClient(tracking_uri=store["uri"]).get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["task"] == "guess"
    assert 1.0 <= run.data.metrics["rollout/turns_mean"] <= 6.0 and "reward/guesses" in run.data.metrics
    from bench.registry import TASKS
    from tests.test_tasks_contract import (
        test_environment_demonstrations_reach_one_and_hostile_actions_are_ordinary_turns,
    )

    TASKS.include(d)
    try:
        test_environment_demonstrations_reach_one_and_hostile_actions_are_ordinary_turns("guess", tmp_path)
    finally:
        TASKS.dirs.remove(d.resolve())
        TASKS._classes = None


def test_unknown_task_error_lists_available(tmp_path):
    """An unknown task name exits with code 2 and an error listing the available tasks and a did-you-mean."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "train", "algorithm=grpo", "task=countdonw"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.returncode
    assert "unknown task 'countdonw'" in proc.stderr and "Did you mean 'countdown'" in proc.stderr, proc.stderr


def test_readme_example_choice_trains_via_include(tmp_path, store):
    """The README's `median_grpo.py`, dropped into a directory given with --include, registers a new advantage value
    and an algorithm that uses it: the algorithm trains 2 steps from a warm start through the real CLI and its MLflow
    run carries the new value as a param and a choice tag; GRPO accepts the value as an override (its config
    validates), and a misspelt value fails at start-up with the available values and the nearest."""
    d = tmp_path / "mychoices"
    d.mkdir()
    (d / "median_grpo.py").write_text(readme_example("choice"))
    base = [sys.executable, "-m", "bench", "train", "--include", str(d), "task=countdown", "init=sft",
            "warm_start.max_steps=50", "trainer.max_steps=2", "trainer.eval_every=100", "trainer.progress_bar=false",
            "task.num_eval=8", "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=12",
            "model.hidden_size=32", "model.num_layers=2", "model.num_heads=2", "model.intermediate_size=64",
            *store["args"]]  # fmt: skip
    client = MlflowClient(tracking_uri=store["uri"])
    for selection in (["algorithm=median_grpo"],):  # GRPO with the override: the same path (a choice value)
        proc = subprocess.run(base + selection, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        run = client.get_run(re.search(r"MLflow run (\w+)", proc.stdout).group(1))
        assert run.info.status == "FINISHED", run.info.status
        assert run.data.params["algorithm.advantage"] == run.data.tags["choice.advantage"] == "group_median"
        assert len(client.get_metric_history(run.info.run_id, "loss/total")) == 2
    show = [sys.executable, "-m", "bench", "config", "--include", str(d), "algorithm=grpo", "task=countdown"]
    cfg = subprocess.run(
        show + ["algorithm.advantage=group_median"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert cfg.returncode == 0 and "advantage: group_median" in cfg.stdout, cfg.stdout[-1500:] + cfg.stderr[-1500:]
    bad = subprocess.run(base + ["algorithm=grpo", "algorithm.advantage=group_medain"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 2, bad.returncode
    assert "advantage='group_medain' is not a registered choice" in bad.stderr, bad.stderr[-2000:]
    assert "Did you mean 'group_median'" in bad.stderr and "rloo" in bad.stderr, bad.stderr[-2000:]


def _dropins(tmp_path) -> Path:
    """The README's task (with its YAML of defaults) and algorithm, side by side in one directory."""
    d = tmp_path / "dropins"
    d.mkdir()
    (d / "reverse.py").write_text(readme_example("task"))
    (d / "reverse.yaml").write_text(readme_example("task-yaml", "yaml"))
    (d / "median_grpo.py").write_text(readme_example("choice"))
    return d


def test_a_dropped_in_task_brings_its_config_defaults(tmp_path):
    """reverse.yaml beside reverse.py sets the task's length and the warm start's steps, as conf/task/<name>.yaml
    does for a built-in task; the command line still wins (was: no way for a drop-in to declare them)."""
    d = _dropins(tmp_path)
    show = [sys.executable, "-m", "bench", "config", "--include", str(d), "algorithm=grpo", "task=reverse"]
    out = subprocess.run(show, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    cfg = yaml.safe_load(out.stdout)
    assert cfg["task"]["length"] == 5 and cfg["warm_start"]["max_steps"] == 7, (cfg["task"], cfg["warm_start"])
    out = subprocess.run(show + ["warm_start.max_steps=9"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert yaml.safe_load(out.stdout)["warm_start"]["max_steps"] == 9


@pytest.mark.slow
def test_a_sweep_over_a_dropped_in_task_and_algorithm(tmp_path):
    """python -m bench sweep FILE --include DIR over the README's dropped-in algorithm and task: every warm start and
    cell process is started with the include (was: each child failed with "unknown task 'reverse'", exit 2), the
    cells finish in MLflow, and the warm start trained the 7 steps reverse.yaml asks for."""
    d = _dropins(tmp_path)
    sweep = tmp_path / "dropped.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "dropped", "axes": {"algorithm": ["median_grpo", "grpo"], "task": ["reverse"], "seed": [0]},
        "overrides": ["init=sft", "trainer.max_steps=2", "trainer.eval_every=100", "task.num_eval=8",
                      "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=8",
                      "model.hidden_size=32", "model.num_layers=2", "model.num_heads=2", "model.intermediate_size=64",
                      f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}", f"output_dir={tmp_path / 'runs'}",
                      f"cache_dir={tmp_path / 'cache'}"],
        "report": {"out": str(tmp_path / "report")}, "workers": 2,
    }))  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "bench", "sweep", str(sweep), "--include", str(d)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("sweep-dropped")
    cells = client.search_runs([exp.experiment_id], "tags.role = 'cell'")
    assert sorted(r.data.tags["axis.algorithm"] for r in cells) == ["grpo", "median_grpo"]
    assert all(r.info.status == "FINISHED" and r.data.tags["task"] == "reverse" for r in cells)
    warm = client.get_experiment_by_name(WARM_START_EXPERIMENT)
    (ws,) = client.search_runs([warm.experiment_id], "tags.role = 'warm_start'")
    assert ws.data.params["trainer.max_steps"] == "7" and ws.data.params["task.length"] == "5"
    assert (tmp_path / "report" / "summary.md").exists()
