"""The sweep driver and its report: real subprocess cells, a real MLflow SQLite store, a real local Ray cluster."""

from __future__ import annotations

import csv
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from bench import ROOT
from bench.config import ConfigError
from bench.registry import TASKS
from bench.run.report import report
from bench.run.sweep import load_plan, load_spec, run_sweep, variants
from tests.conftest import SMALL


def write_sweep(tmp: Path, name: str, axes: dict, steps: int = 3, **extra) -> Path:
    """A sweep file whose cells are seconds-long tiny-model runs tracked in a store under ``tmp``."""
    overrides = [o for o in SMALL if not o.startswith(("trainer.max_steps", "trainer.progress_bar"))]
    overrides += [
        f"trainer.max_steps={steps}",
        f"tracking.tracking_uri=sqlite:///{tmp / 'mlflow.db'}",
        f"output_dir={tmp / 'runs'}",
        f"cache_dir={tmp / 'cache'}",
    ]
    path = tmp / f"{name}.yaml"
    spec = {"name": name, "axes": axes, "overrides": overrides, "report": {"out": str(tmp / "report")}, **extra}
    path.write_text(yaml.safe_dump(spec))
    return path


def cell_runs(tmp: Path, name: str, all_views: bool = False) -> list:
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}")
    exp = client.get_experiment_by_name(f"sweep-{name}")
    view = ViewType.ALL if all_views else ViewType.ACTIVE_ONLY
    return client.search_runs([exp.experiment_id], "tags.role = 'cell'", run_view_type=view, max_results=1000)


# ---- planning ------------------------------------------------------------------------------------------------------
def test_unknown_sweep_lists_the_available_ones():
    with pytest.raises(ConfigError, match=r"unknown sweep 'defualt'.*Available: .*default.*Did you mean 'default'"):
        load_spec("defualt")


def test_bad_sweep_key_names_it_and_the_nearest(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("axis:\n  seed: [0]\n")
    with pytest.raises(ConfigError, match=r"bad sweep key 'axis'.*Did you mean 'axes'"):
        load_spec(str(p))


def test_a_setting_axis_of_names_first_fails_at_planning_not_after_the_sweep(tmp_path):
    """report.settings' first axis is the x-axis of the setting curves: a categorical one (the task) was accepted and
    failed the report after every cell had run ("could not convert string to float: 'chain'")."""
    p = tmp_path / "s.yaml"
    axes = {"task": ["chain", "delay"], "task.horizon": [4, 8], "seed": [0]}
    p.write_text(yaml.safe_dump({"axes": axes, "report": {"settings": ["task", "task.horizon"]}}))
    with pytest.raises(ConfigError, match=r"report.settings\[0\] = 'task'.*must take numbers.*settings: \[task.h"):
        load_spec(str(p))
    p.write_text(yaml.safe_dump({"axes": axes, "report": {"settings": ["task.horizon"]}}))
    assert load_spec(str(p)).report.settings == ["task.horizon"]


def test_categorical_settings_are_sections_and_the_algorithm_as_a_setting_leaves_the_row_label():
    """conf/sweep/precision.yaml: each precision its own section (DAPO vs GRPO in each), and, with the algorithm as
    the setting, each algorithm its own section whose rows are the precisions (bf16-mixed vs float32, paired)."""
    spec, cells = load_plan("precision")
    assert {c.where for c in cells} == {"countdown trainer.precision=32-true", "countdown trainer.precision=bf16-mixed"}
    assert set(variants(cells, spec.report.settings).values()) == {"grpo", "dapo"}
    spec, cells = load_plan(
        "precision", ["sweep.report.settings=[algorithm]", "sweep.report.baseline=precision=32-true"]
    )
    assert {c.where for c in cells} == {"countdown algorithm=grpo", "countdown algorithm=dapo"}
    assert set(variants(cells, spec.report.settings).values()) == {"precision=32-true", "precision=bf16-mixed"}
    assert spec.report.baseline == "precision=32-true"


def test_plan_crosses_axes_applies_excludes_and_config_keys(tmp_path):
    p = write_sweep(
        tmp_path,
        "grid",
        {"algorithm": ["grpo", "dapo"], "algorithm.clip_eps_high": [0.2, 0.28], "seed": [0, 1]},
        exclude=[{"algorithm": "dapo", "algorithm.clip_eps_high": 0.2}],
    )
    spec, cells = load_plan(str(p))
    assert len(cells) == 2 * 2 * 2 - 2
    assert {(c.cfg.algorithm.name, c.cfg.algorithm.clip_eps_high, c.cfg.seed) for c in cells} == {
        ("grpo", 0.2, 0), ("grpo", 0.2, 1), ("grpo", 0.28, 0), ("grpo", 0.28, 1), ("dapo", 0.28, 0), ("dapo", 0.28, 1),
    }  # fmt: skip
    assert len({c.id for c in cells}) == len(cells)
    # Identity is the resolved config: planning again gives the same ids; a different shared override changes them.
    assert [c.id for c in load_plan(str(p))[1]] == [c.id for c in cells]
    assert not {c.id for c in load_plan(str(p), ["optim.lr=3e-4"])[1]} & {c.id for c in cells}
    # Keys that do not change what a cell computes are not part of its identity.
    assert [c.id for c in load_plan(str(p), ["trainer.num_threads=3"])[1]] == [c.id for c in cells]
    # Nor where the data lies on this machine: a report without BENCH_DATA finds the cells a sweep ran with it.
    assert [c.id for c in load_plan(str(p), ["task.data_root=/elsewhere"])[1]] == [c.id for c in cells]


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "conf" / "sweep").glob("*.yaml")))
def test_shipped_sweeps_plan(name):
    """Every shipped sweep file composes and validates every cell (so it cannot fail halfway through)."""
    spec, cells = load_plan(name)
    assert cells and len({c.id for c in cells}) == len(cells)
    assert {c.cfg.eval.temperature for c in cells} == {cells[0].cfg.eval.temperature}


def test_an_exclude_value_may_be_a_list_of_axis_values(tmp_path):
    """{algorithm: rloo, seed: [2, 3]} skips rloo's seeds 2 and 3 and nothing else (extra seeds for one setting)."""
    p = write_sweep(
        tmp_path,
        "extra_seeds",
        {"algorithm": ["grpo", "rloo"], "seed": [0, 1, 2, 3]},
        exclude=[{"algorithm": "rloo", "seed": [2, 3]}],
    )
    _, cells = load_plan(str(p))
    assert sorted((c.cfg.algorithm.name, c.cfg.seed) for c in cells) == [
        ("grpo", 0), ("grpo", 1), ("grpo", 2), ("grpo", 3), ("rloo", 0), ("rloo", 1),
    ]  # fmt: skip


def test_report_labels_show_only_the_axes_that_vary_for_an_algorithm(tmp_path):
    from bench.run.report import variants

    p = write_sweep(
        tmp_path,
        "labels",
        {"algorithm": ["grpo", "gtpo"], "algorithm.dynamic_sampling": [False, True], "seed": [0, 1]},
        exclude=[{"algorithm": "grpo", "algorithm.dynamic_sampling": True}],
    )
    _, cells = load_plan(str(p))
    assert sorted(set(variants(cells).values())) == [
        "grpo",
        "gtpo dynamic_sampling=False",
        "gtpo dynamic_sampling=True",
    ]


def test_named_variants_run_an_algorithm_with_overrides_under_their_own_name(tmp_path):
    """variants: {grpo_partial: {algorithm: grpo, overrides: [task.reward=partial]}} on the algorithm axis: its cells
    run GRPO with the override, are labelled grpo_partial in the report, and share GRPO's SFT warm start (chain's
    task.reward is RL-only: the warm start is trained at its default)."""
    from bench.run.report import variants
    from bench.task import sft_task

    p = write_sweep(
        tmp_path,
        "named",
        {"algorithm": ["grpo", "grpo_partial"], "task": ["chain"], "seed": [0]},
        variants={"grpo_partial": {"algorithm": "grpo", "overrides": ["task.reward=partial"]}},
    )
    _, cells = load_plan(str(p))
    by = {c.axes["algorithm"]: c for c in cells}
    assert by["grpo_partial"].cfg.algorithm.name == "grpo" and by["grpo_partial"].cfg.task.reward == "partial"
    assert by["grpo"].cfg.task.reward == "outcome" and by["grpo"].id != by["grpo_partial"].id
    assert sorted(variants(cells).values()) == ["grpo", "grpo_partial"]
    assert by["grpo_partial"].name == "chain-grpo_partial-s0"
    assert sft_task(by["grpo"].cfg.task) == sft_task(by["grpo_partial"].cfg.task)
    assert sft_task(by["grpo_partial"].cfg.task)["reward"] == "outcome"
    bad = write_sweep(tmp_path, "named_bad", {"algorithm": ["grpo_p"]},
                      variants={"grpo_p": {"algorithm": "grpoo", "overrides": []}})  # fmt: skip
    with pytest.raises(ConfigError, match=r"unknown algorithm 'grpoo'.*Did you mean 'grpo'"):
        load_plan(str(bad))


def test_named_task_settings_run_a_task_with_overrides_as_tasks_of_their_own(tmp_path):
    """tasks: {rg_sum: {task: reasoning_gym, overrides: [task.dataset=chain_sum, ...]}} on the task axis: its cells run
    that task with those overrides, the report groups them under the setting's name, and warm_start.seed shares one
    SFT warm start across seeds (its key names that seed, not the run's)."""
    p = write_sweep(
        tmp_path,
        "named_tasks",
        {"algorithm": ["grpo"], "task": ["rg_sum", "rg_gcd", "countdown"], "seed": [0, 1]},
        tasks={"rg_sum": {"task": "reasoning_gym", "overrides": ["task.dataset=chain_sum", "task.params.min_terms=2"]},
               "rg_gcd": {"task": "reasoning_gym", "overrides": ["task.dataset=gcd"]}},
    )  # fmt: skip
    _, cells = load_plan(str(p), ["warm_start.seed=7"])
    by = {(c.axes["task"], c.cfg.seed): c for c in cells}
    assert by[("rg_sum", 0)].cfg.task.name == "reasoning_gym" and by[("rg_sum", 0)].cfg.task.dataset == "chain_sum"
    assert by[("rg_sum", 0)].cfg.task.params == {"min_terms": 2}
    assert by[("rg_gcd", 1)].cfg.task.dataset == "gcd" and by[("countdown", 0)].cfg.task.name == "countdown"
    assert {c.where for c in cells} == {"rg_sum", "rg_gcd", "countdown"}
    assert by[("rg_sum", 0)].name == "rg_sum-grpo-s0" and by[("rg_sum", 0)].id != by[("rg_gcd", 0)].id
    assert {c.cfg.warm_start.seed for c in cells} == {7}
    bad = write_sweep(tmp_path, "named_tasks_bad", {"algorithm": ["grpo"], "task": ["x"]},
                      tasks={"x": {"task": "countdwn", "overrides": []}})  # fmt: skip
    with pytest.raises(ConfigError, match=r"unknown task 'countdwn'.*Did you mean 'countdown'"):
        load_plan(str(bad))


def test_plan_rejects_a_bad_axis_key_naming_the_axis(tmp_path):
    p = write_sweep(tmp_path, "bad", {"algorithm": ["grpo"], "algorithm.clip_eps_hihg": [0.2]})
    with pytest.raises(ConfigError, match=r"axis 'algorithm.clip_eps_hihg' is not a config key.*clip_eps_high"):
        load_plan(str(p))


def test_axis_values_that_resolve_to_the_same_run_run_once(tmp_path):
    p = write_sweep(tmp_path, "dup", {"algorithm": ["grpo"], "algorithm.clip_eps_high": [0.2, 0.2]})
    assert len(load_plan(str(p))[1]) == 1


# ---- a real sweep: report numbers, skip on rerun --------------------------------------------------------------------
@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory):
    """Four cells on the coin test task (tests/conftest.py) with 4 samples per problem at temperature 1: eval/mean_at_4
    then differs between seeds and problems, so the report's numbers and verdicts below have something to get wrong
    (on countdown every value of a random model is 0, or 16 tokens long)."""
    from bench.registry import TASKS
    from tests.conftest import COIN

    tmp = tmp_path_factory.mktemp("sweep")
    (tmp / "tasks").mkdir()
    (tmp / "tasks" / "coin.py").write_text(COIN)
    TASKS.include(tmp / "tasks")  # the cells get it too (include_args)
    path = write_sweep(tmp, "small", {"algorithm": ["grpo", "reinforce"], "task": ["coin"], "seed": [0, 1]}, steps=3,
                       workers=2)  # fmt: skip
    spec = yaml.safe_load(path.read_text())
    spec["overrides"] += ["eval.samples_per_problem=4", "eval.temperature=1.0", "eval.pass_k=[1]", "optim.lr=5e-2"]
    path.write_text(yaml.safe_dump(spec))
    yield tmp, path, run_sweep(str(path))
    TASKS.dirs.remove((tmp / "tasks").resolve())
    TASKS._classes = None


def test_sweep_runs_every_cell_once_nested_and_tagged(finished_sweep):
    tmp, path, out = finished_sweep
    assert out["failed"] == [] and out["cells"] == 4
    runs = cell_runs(tmp, "small")
    assert len(runs) == 4 and all(r.info.status == "FINISHED" for r in runs)
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}")
    exp = client.get_experiment_by_name("sweep-small")
    (parent,) = client.search_runs([exp.experiment_id], "tags.role = 'sweep'")
    assert parent.info.status == "FINISHED"
    for r in runs:
        tags = r.data.tags
        assert tags["mlflow.parentRunId"] == parent.info.run_id
        assert tags["axis.algorithm"] == tags["algorithm"] and tags["axis.seed"] == tags["seed"]
        assert float(tags["sweep.wall_clock_s"]) > 0
    assert {(r.data.tags["algorithm"], r.data.tags["seed"]) for r in runs} == {
        ("grpo", "0"),
        ("grpo", "1"),
        ("reinforce", "0"),
        ("reinforce", "1"),
    }
    # One warm start per seed would be shared; this sweep trains from scratch, so none ran.
    assert not client.search_runs([exp.experiment_id], "tags.role = 'warm_start'")
    # Rerunning a finished sweep starts nothing; the parent run records each invocation's overrides.
    again = run_sweep(str(path), ["sweep.workers=1"])
    assert again["failed"] == [] and len(cell_runs(tmp, "small", all_views=True)) == 4
    parent = client.get_run(parent.info.run_id)
    assert parent.data.tags["sweep.overrides"] == '["sweep.workers=1"]'
    invocations = client.list_artifacts(parent.info.run_id, "invocations")
    assert len(invocations) == 2 and all(a.path.endswith(".json") for a in invocations)


def test_report_numbers_match_mlflow(finished_sweep, tmp_path):
    tmp, path, _ = finished_sweep
    metric = "eval/mean_at_4"  # varies by seed and problem on the coin task
    summary = report(str(path), [f"sweep.report.metric={metric}"], out=tmp_path)
    for f in ("summary.md", "summary.csv", "runs.csv", "curves_step.png", "curves_samples.png", "curves_tokens.png"):
        assert (tmp_path / f).stat().st_size > 0, f
    assert (tmp_path / "curves_step.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}")
    per_run = list(csv.DictReader((tmp_path / "runs.csv").open()))
    assert len(per_run) == 4
    finals: dict[str, list[float]] = {}
    for row in per_run:
        hist = sorted((m.step, m.value) for m in client.get_metric_history(row["run_id"], metric))
        assert float(row["final"]) == pytest.approx(hist[-1][1])
        assert float(row["best"]) == pytest.approx(max(v for _, v in hist))
        steps, vals = zip(*hist, strict=True)
        auc = sum((steps[i + 1] - steps[i]) * (vals[i] + vals[i + 1]) / 2 for i in range(len(steps) - 1))
        assert float(row["auc"]) == pytest.approx(auc / (steps[-1] - steps[0]))
        step_time = [m.value for m in client.get_metric_history(row["run_id"], "time/step")]
        assert float(row["s_per_step"]) == pytest.approx(statistics.fmean(step_time))
        finals.setdefault(row["variant"], []).append(hist[-1][1])
    summary_rows = {r["variant"]: r for r in csv.DictReader((tmp_path / "summary.csv").open())}
    assert set(summary_rows) == {"grpo", "reinforce"}
    for variant, vals in finals.items():
        row = summary_rows[variant]
        assert float(row["final_mean"]) == pytest.approx(statistics.fmean(vals))
        half = 12.706204736 * statistics.stdev(vals) / math.sqrt(2)  # t_{0.975, 1 dof}
        assert float(row["final_ci95"]) == pytest.approx(half, abs=1e-9)
    text = summary.read_text()
    assert "| grpo | 2/2 |" in text, text
    all_finals = [v for vals in finals.values() for v in vals]
    assert len(set(all_finals)) > 1, all_finals  # the seeds differ, so the power sentence has variances to use
    assert "with 2 seeds and 8 evaluation problems" in text, text
    # The verdict is the one comparisons.csv's numbers call for, and those numbers are the runs' own: the estimate is
    # the mean over seeds of reinforce's final minus grpo's (paired by seed).
    (cmp,) = [r for r in csv.DictReader((tmp_path / "comparisons.csv").open()) if r["kind"] == "final"]
    seeds = {(r["variant"], r["seed"]): float(r["final"]) for r in per_run}
    paired = [seeds[("reinforce", s)] - seeds[("grpo", s)] for s in ("0", "1")]
    assert float(cmp["estimate"]) == pytest.approx(statistics.fmean(paired))
    lo, hi, p_adj = float(cmp["paired_lo"]), float(cmp["paired_hi"]), float(cmp["p_adjusted"])
    if p_adj < 0.05:
        word = "higher" if float(cmp["estimate"]) > 0 else "lower"
        verdict = f"reinforce is {word} than grpo by {abs(float(cmp['estimate'])):.3f}"
    elif lo <= 0 <= hi:
        verdict = "reinforce cannot be told apart from grpo"
    else:
        verdict = "reinforce − grpo = "
    assert verdict in text, (verdict, cmp, text)
    # The report is also logged to the sweep's parent run.
    exp = client.get_experiment_by_name("sweep-small")
    (parent,) = client.search_runs([exp.experiment_id], "tags.role = 'sweep'")
    logged = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/summary.md", "report/summary.csv", "report/curves_step.png"} <= logged


def test_export_then_import_carries_the_finished_cells_to_a_fresh_store(finished_sweep, tmp_path):
    """`bench export` / `bench import`: the four finished cells and the parent, recreated in another store with the
    same params, tags, metric histories, statuses and outcome artifacts, nested under that store's parent; the sweep
    there has nothing left to run, its report gives the same numbers, a second import adds nothing, and a cell that
    was stopped is not exported (a store that received it would skip a cell that never finished)."""
    from bench.run.carry import export_runs, import_runs
    from bench.run.sweep import Sweep

    tmp, path, _ = finished_sweep
    spec, cells = load_plan(str(path))
    src = Sweep(spec, cells)
    assert export_runs(src, tmp_path / "runs") == 5
    uri = f"sqlite:///{tmp_path / 'other.db'}"
    dst = Sweep(spec, cells, uri=uri)
    assert import_runs(dst, tmp_path / "runs") == (5, 0)
    assert import_runs(dst, tmp_path / "runs") == (0, 4)
    (parent,) = dst.runs(role="sweep")
    carried = {r.data.tags["carried_from"]: r for r in dst.runs(role="cell")}
    assert len(carried) == 4
    for r in src.runs(role="cell"):
        c = carried[r.info.run_id]
        assert c.info.status == r.info.status == "FINISHED" and c.data.params == r.data.params
        assert c.data.tags["mlflow.parentRunId"] == parent.info.run_id
        same = {k: v for k, v in c.data.tags.items() if k not in ("mlflow.parentRunId", "carried_from")}
        assert same == {k: v for k, v in r.data.tags.items() if k != "mlflow.parentRunId"}
        for key in r.data.metrics:
            hist = [(m.step, m.value) for m in src.client.get_metric_history(r.info.run_id, key)]
            assert [(m.step, m.value) for m in dst.client.get_metric_history(c.info.run_id, key)] == hist, key
        for step in (0, 3):
            a = src.client.download_artifacts(r.info.run_id, f"eval/outcomes/step_{step:06d}.jsonl", str(tmp_path))
            text = Path(a).read_text()
            b = dst.client.download_artifacts(c.info.run_id, f"eval/outcomes/step_{step:06d}.jsonl", str(tmp_path))
            assert Path(b).read_text() == text
    again = run_sweep(str(path), [f"tracking.tracking_uri={uri}", "sweep.workers=1"])
    assert again["failed"] == [] and len(dst.runs(role="cell")) == 4  # nothing ran
    # what the report reads (bench.run.report.data.collect): the same curves, x-axes, costs and per-problem values
    from bench.run.report.data import collect

    def read(sweep):
        runs, missing = collect(sweep, "eval/mean_at_4")
        return missing, sorted((r.cell.id, r.curve, r.x, r.s_per_step, r.wall_clock_s, r.problems) for r in runs)

    assert read(dst) == read(src) and not read(dst)[0]
    one = next(iter(carried.values()))
    dst.client.set_terminated(one.info.run_id, "KILLED")
    assert export_runs(dst, tmp_path / "again") == 4  # 3 finished cells and the parent
    # under their first ids: exporting a store that imported them again rewrites the same folders, adds none
    assert {d.name for d in (tmp_path / "again").iterdir()} < {d.name for d in (tmp_path / "runs").iterdir()}


def test_import_of_an_empty_folder_says_how_to_export(finished_sweep, tmp_path):
    from bench.run.carry import import_runs
    from bench.run.sweep import Sweep

    _, path, _ = finished_sweep
    spec, cells = load_plan(str(path))
    with pytest.raises(ConfigError, match=r"no exported runs .*python -m bench export small --runs"):
        import_runs(Sweep(spec, cells, uri=f"sqlite:///{tmp_path / 'x.db'}"), tmp_path)


# ---- what a user sees in the MLflow UI ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def warm_sweep(tmp_path_factory):
    """A real sweep with SFT warm starts, run through the command line (as `make sweep` does)."""
    tmp = tmp_path_factory.mktemp("warm")
    path = write_sweep(tmp, "warm", {"algorithm": ["grpo", "rloo"], "seed": [0]}, steps=3, workers=2,
                       **{"overrides": None})  # fmt: skip
    spec = yaml.safe_load(path.read_text())
    overrides = [o for o in SMALL if not o.startswith(("trainer.max_steps", "trainer.progress_bar"))]
    spec["overrides"] = overrides + [
        "trainer.max_steps=3", "trainer.eval_every=1", "init=sft", "warm_start.max_steps=3",
        f"tracking.tracking_uri=sqlite:///{tmp / 'mlflow.db'}", f"output_dir={tmp / 'runs'}",
        f"cache_dir={tmp / 'cache'}",
    ]  # fmt: skip
    path.write_text(yaml.safe_dump(spec))
    proc = subprocess.run([sys.executable, "-m", "bench", "sweep", str(path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp, proc.stdout, MlflowClient(tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}")


@pytest.mark.slow
def test_warm_starts_live_in_their_own_experiment_and_cells_link_to_them(warm_sweep):
    """Warm starts are not among a sweep's runs (their 600-step curves squashed the RL charts): their own experiment,
    not nested, tagged; each cell names the warm start it started from."""
    from bench.tracking import WARM_START_EXPERIMENT

    tmp, _, client = warm_sweep
    sweep_exp = client.get_experiment_by_name("sweep-warm")
    assert not client.search_runs([sweep_exp.experiment_id], "tags.role = 'warm_start'")
    warm_exp = client.get_experiment_by_name(WARM_START_EXPERIMENT)
    (warm,) = client.search_runs([warm_exp.experiment_id], "tags.role = 'warm_start'")
    assert "mlflow.parentRunId" not in warm.data.tags and warm.data.tags["sweep"] == "warm"
    assert warm.data.tags["warm_start.key"]
    cells = cell_runs(tmp, "warm")
    assert len(cells) == 2
    # The one warm start runs alone before the cells: it gets the cores the 2 workers split (it had half of them).
    from bench.run.sweep import share_cores

    assert warm.data.params["trainer.num_threads"] == str(share_cores(1)) == str(os.cpu_count())
    for r in cells:
        assert r.data.params["trainer.num_threads"] == str(share_cores(2))
        assert r.data.tags["warm_start.run_id"] == warm.info.run_id, r.data.tags
        assert Path(r.data.tags["warm_start.path"]).name.endswith(warm.data.tags["warm_start.key"])


def test_ensure_experiment_survives_losing_the_creation_race(tmp_path):
    """A sweep's two parallel warm starts on a fresh store both find no `creditbench-warm-starts` and both create it:
    the loser got MLflow's UNIQUE-constraint error and its warm start failed. Here another real client creates the
    experiment between this client's lookup and its create, the loser's window; ensure_experiment returns the
    winner's id."""
    from bench.tracking import EXPERIMENT_KIND, ensure_experiment

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    winner = MlflowClient(uri)

    class LosesTheRace(MlflowClient):
        looked = 0

        def get_experiment_by_name(self, name):
            self.looked += 1
            if self.looked == 1:  # it looks, finds nothing; the other process creates it now
                found = super().get_experiment_by_name(name)
                winner.create_experiment(name)
                return found
            return super().get_experiment_by_name(name)

    loser = LosesTheRace(uri)
    exp_id = ensure_experiment(loser, "race", uri)
    assert exp_id == winner.get_experiment_by_name("race").experiment_id
    assert len([e for e in winner.search_experiments() if e.name == "race"]) == 1
    assert winner.get_experiment(exp_id).tags["mlflow.experimentKind"] == EXPERIMENT_KIND


_RACER = """
import sys, time
from pathlib import Path
from bench.tracking import ensure_experiment, open_client
uri, go = sys.argv[1], Path(sys.argv[2])
import mlflow.tracking  # noqa: F401 (imported before the start, so the processes reach the store together)
Path(sys.argv[3]).touch()  # ready
while not go.exists():
    time.sleep(0.001)
print(ensure_experiment(open_client(uri), "race", uri))
"""


def test_runs_started_together_on_a_fresh_store_all_open_it(tmp_path):
    """Two `bench train` started at once on a fresh SQLite store: MLflow builds the store's tables with alembic
    migrations, and the process that lost that race failed ("Online migration expected to match one row"). Here four
    real processes are released together onto one fresh store; each must open it and get the same experiment."""
    import subprocess
    import sys
    import time

    uri, go = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, uri, str(go), str(tmp_path / f"ready{i}")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"ready{i}").exists() for i in range(4)) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
    assert len({out.strip() for out, _ in outs}) == 1
    assert [e.name for e in MlflowClient(uri).search_experiments()].count("race") == 1


@pytest.mark.slow
def test_experiments_open_on_their_runs_table(warm_sweep):
    """MLflow 3 opens an experiment without ``mlflow.experimentKind`` on its GenAI traces overview."""
    from bench.tracking import EXPERIMENT_KIND, WARM_START_EXPERIMENT

    _, _, client = warm_sweep
    for name in ("sweep-warm", WARM_START_EXPERIMENT):
        assert client.get_experiment_by_name(name).tags.get("mlflow.experimentKind") == EXPERIMENT_KIND, name


@pytest.mark.slow
def test_budget_matched_eval_curves_lie_on_a_grid_the_seeds_share(warm_sweep):
    """eval_vs_samples/ and eval_vs_tokens/accuracy are logged on a grid every seed shares (budget_grid, from the
    config), each grid point the linear interpolation of eval/accuracy between the evaluations around it: the seeds'
    token counts differ, so at the evaluations' own budgets MLflow's grouped mean (equal steps only) zigzagged."""
    import numpy as np

    tmp, _, client = warm_sweep
    steps = {}
    for r in cell_runs(tmp, "warm"):
        rid = r.info.run_id
        acc = {m.step: m.value for m in client.get_metric_history(rid, "eval/accuracy")}
        assert len(acc) == 4
        for axis, prefix in (("samples_seen", "eval_vs_samples"), ("tokens_generated", "eval_vs_tokens")):
            at = {m.step: m.value for m in client.get_metric_history(rid, f"eval/at_{axis}")}
            got = {m.step: m.value for m in client.get_metric_history(rid, f"{prefix}/accuracy")}
            xs = [at[s] for s in sorted(acc)]
            ys = [acc[s] for s in sorted(acc)]
            grid = sorted(got)
            gap = grid[1] - grid[0]
            assert grid == list(range(0, int(xs[-1]) + 1, gap)), (axis, grid, xs)  # every grid point to the end
            assert [got[g] for g in grid] == pytest.approx(list(np.interp(grid, xs, ys)), abs=1e-9), axis
            steps.setdefault(axis, set()).add(tuple(grid[: len(grid) - 1]))  # all but a last point past a shorter run
    for axis, grids in steps.items():  # whatever each run's own counts, the grids agree point for point
        shortest = min(grids, key=len)
        assert all(g[: len(shortest)] == shortest for g in grids), (axis, grids)


@pytest.mark.slow
def test_run_constants_are_params_and_no_metric_repeats_accuracy(warm_sweep):
    tmp, _, client = warm_sweep
    for r in cell_runs(tmp, "warm"):
        assert "data/test_examples" in r.data.params and "data/train_examples" in r.data.params, r.data.params
        assert r.data.params["data/task_version"] == TASKS.get(r.data.params["task.name"]).version, r.data.params
        assert not [k for k in r.data.metrics if k.startswith("data/")], sorted(r.data.metrics)
        assert "eval/correct" not in r.data.metrics and "eval/accuracy" in r.data.metrics


@pytest.mark.slow
def test_sweep_output_shows_warm_start_progress_and_how_to_open_the_ui(warm_sweep):
    _, out, client = warm_sweep
    assert "1 SFT warm start(s) to train or reuse" in out, out[-2000:]  # stdout: the driver's lines
    assert "warm start 1/1 (countdown tiny seed 0): trained in" in out, out[-2000:]
    exp_id = client.get_experiment_by_name("sweep-warm").experiment_id
    last = [line for line in out.splitlines() if line.strip()][-1]
    url = f"http://127.0.0.1:5000/#/experiments/{exp_id}?workflowType=machine_learning"  # opens on the runs table
    # this sweep's store is not the project's, so the line names it (make ui serves only the project's store)
    tmp = warm_sweep[0]
    assert f"MLFLOW_TRACKING_URI=sqlite:///{tmp / 'mlflow.db'} {sys.executable} -m bench ui" in last, last
    assert url in last, last


# ---- kill and resume -------------------------------------------------------------------------------------------------
def _alive(marker: str) -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if marker in (p / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(p.name))
            except OSError:
                pass
    return pids


@pytest.mark.slow
def test_sigkill_mid_cell_then_restart_ends_with_exactly_one_finished_run_per_cell(tmp_path):
    path = write_sweep(tmp_path, "killme", {"algorithm": ["grpo", "rloo"], "seed": [0, 1]}, steps=6, workers=2)
    cmd = [sys.executable, "-m", "bench", "sweep", str(path)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    driver = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    deadline = time.time() + 240
    mid_cell = False
    # Wait until the driver has counted a finished cell (its time is recorded) and another cell is training.
    while time.time() < deadline and not mid_cell:
        time.sleep(0.5)
        exp = client.get_experiment_by_name("sweep-killme")
        parents = client.search_runs([exp.experiment_id], "tags.role = 'sweep'") if exp else []
        if not any("sweep.wall_clock_s" in p.data.tags for p in parents):
            continue
        for r in client.search_runs([exp.experiment_id], "tags.role = 'cell' and attributes.status = 'RUNNING'"):
            if client.get_metric_history(r.info.run_id, "time/step"):
                mid_cell = True
    assert mid_cell, "no cell finished while another was training within 240 s"
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    cells_dir = str(tmp_path / "runs" / "sweeps" / "killme")
    for _ in range(50):  # the cell processes die with the driver
        if not _alive(cells_dir):
            break
        time.sleep(0.2)
    assert not _alive(cells_dir), "cell processes outlived the SIGKILLed driver"
    stale = [r for r in cell_runs(tmp_path, "killme") if r.info.status == "RUNNING"]
    assert stale, "the kill should have left at least one run RUNNING"
    (parent,) = client.search_runs([exp.experiment_id], "tags.role = 'sweep'")
    killed_s = float(parent.data.tags["sweep.wall_clock_s"])  # the killed driver's time, to its last finished cell
    assert killed_s > 0

    rc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert rc.returncode == 0, rc.stdout[-3000:] + rc.stderr[-3000:]
    runs = cell_runs(tmp_path, "killme")
    by_cell: dict[str, list] = {}
    for r in runs:
        by_cell.setdefault(r.data.tags["sweep.cell"], []).append(r)
    assert len(by_cell) == 4
    for cell, rs in by_cell.items():
        assert [r.info.status for r in rs] == ["FINISHED"], (cell, [r.info.status for r in rs])
        steps = [m.step for m in client.get_metric_history(rs[0].info.run_id, "time/step")]
        assert sorted(steps) == list(range(6)), steps  # every step logged exactly once
    # The runs the kill left behind were superseded (deleted), not left to be mistaken for results.
    deleted = {r.info.run_id for r in cell_runs(tmp_path, "killme", all_views=True)} - {r.info.run_id for r in runs}
    assert {r.info.run_id for r in stale} <= deleted
    (parent,) = client.search_runs([exp.experiment_id], "tags.role = 'sweep'")
    assert float(parent.data.tags["sweep.wall_clock_s"]) > killed_s  # both invocations' time


@pytest.mark.slow
def test_sigterm_stops_cells_at_a_step_boundary_and_restart_resumes_the_same_runs(tmp_path):
    path = write_sweep(tmp_path, "termme", {"algorithm": ["grpo"], "seed": [0, 1]}, steps=8, workers=2)
    cmd = [sys.executable, "-m", "bench", "sweep", str(path)]
    driver = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    deadline = time.time() + 240
    while time.time() < deadline:
        time.sleep(1)
        runs = cell_runs(tmp_path, "termme") if client.get_experiment_by_name("sweep-termme") else []
        if len(runs) == 2 and all(client.get_metric_history(r.info.run_id, "time/step") for r in runs):
            break
    driver.send_signal(signal.SIGTERM)
    out, _ = driver.communicate(timeout=120)
    assert driver.returncode != 0, out[-2000:]
    killed = cell_runs(tmp_path, "termme")
    assert {r.info.status for r in killed} <= {"KILLED", "FINISHED"} and "KILLED" in {r.info.status for r in killed}
    # A stopped cell resumes on this invocation's share of the cores, not the share saved with it (2 workers, then 1).
    from bench.run.sweep import Sweep

    spec, cells = load_plan(str(path))
    sweep = Sweep(spec, cells)
    stopped = {r.data.tags["sweep.cell"] for r in killed if r.info.status == "KILLED"}
    argv = sweep.prepare(next(c for c in cells if c.id in stopped), threads=3)
    assert argv[-2].startswith("resume=") and argv[-1] == "trainer.num_threads=3", argv
    rc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert rc.returncode == 0, rc.stdout[-3000:]
    runs = cell_runs(tmp_path, "termme", all_views=True)
    assert {r.info.run_id for r in runs} == {r.info.run_id for r in killed}  # resumed in place, nothing new
    for r in runs:
        assert r.info.status == "FINISHED"
        steps = [m.step for m in client.get_metric_history(r.info.run_id, "time/step")]
        assert sorted(steps) == list(range(8)), steps


@pytest.mark.slow
def test_ray_launcher_runs_a_two_cell_sweep_on_a_local_cluster(tmp_path):
    pytest.importorskip("ray")
    path = write_sweep(
        tmp_path, "onray", {"algorithm": ["grpo"], "seed": [0, 1]}, steps=2, launcher="ray",
        resources={"cpus_per_cell": 1},
    )  # fmt: skip
    out = run_sweep(str(path))
    assert out["failed"] == []
    runs = cell_runs(tmp_path, "onray")
    assert sorted(r.data.tags["seed"] for r in runs) == ["0", "1"]
    assert all(r.info.status == "FINISHED" for r in runs)


def test_schedule_eta_counts_running_work_and_the_last_round():
    """Hand value: jobs of 10 s on 2 workers, two running for 4 s and 8 s, three queued: the slots free at 2 and 6,
    the queued ones end at 12, 16 and 22, so 22 s (mean x remaining / workers said 25; after 2 of 5 warm starts of
    409 s on 2 workers it said 10.2 min where 13.6 remained)."""
    from bench.run.sweep import schedule_eta

    assert schedule_eta(10.0, [4.0, 8.0], 3, 2) == 22.0
    assert schedule_eta(409.0, [], 3, 2) == 818.0  # two rounds, not 1.5
    assert schedule_eta(10.0, [12.0], 0, 2) == 0.0  # overdue: no negative time
    assert schedule_eta(10.0, [], 0, 4) == 0.0


def test_warm_start_heartbeat_reads_the_running_logs(tmp_path):
    """While warm starts train, the driver's line names each running one's step (from the [progress] lines its run
    prints) and an ETA from their seconds per step: 2 running of 4 on 2 workers, one at step 200/800 and one at 100/800,
    both 1.5 s/step: the running ones need 900 s and 1050 s more, then the queued two 1200 s each, so 2250 s."""
    from bench.run.sweep import Progress, WarmStartProgress

    progress = Progress("hb", 10, 0, 2)
    wp = WarmStartProgress(progress, 4, 2, {}, every_s=3600)
    try:
        for name, step in (("a", 200), ("b", 100)):
            log = tmp_path / f"{name}.log"
            lines = [f"[progress] step {s}/800 s/step 1.50 ETA 1.0 min\n" for s in [*range(40, step, 40), step]]
            log.write_text("".join(lines))
            wp.started(tmp_path / f"{name}.yaml", log)
        line = wp.heartbeat()
    finally:
        wp.close()
    assert "warm starts 0/4 done" in line and "a step 200/800" in line and "b step 100/800" in line, line
    assert line.endswith(f"ETA {2250 / 60:.1f} min"), line


def test_warm_start_lines_name_the_setting_so_two_settings_of_one_task_differ():
    """Two named task settings of one task (rg_legs, rg_arith: both reasoning_gym) train two warm starts; the
    progress lines name each by its setting, not by the task both share."""
    from bench.run.sweep import Cell, Progress, WarmStartProgress

    def cell(where):
        cfg = OmegaConf.create({"task": {"name": "reasoning_gym"}, "model": {"name": "smollm2-135m"}, "seed": 0})
        return Cell({}, cfg, where, where, where)

    paths = {Path(f"{w}.yaml"): cell(w) for w in ("rg_legs", "rg_arith")}
    wp = WarmStartProgress(Progress("hb", 10, 0, 2), 2, 2, paths, every_s=3600)
    try:
        names = [wp._where(p) for p in paths]
    finally:
        wp.close()
    assert names == ["rg_legs smollm2-135m seed 0", "rg_arith smollm2-135m seed 0"]


@pytest.mark.slow
def test_warm_start_runs_print_their_progress_to_the_sweep_logs(warm_sweep):
    """A run without a progress bar (every sweep child) prints [progress] lines, the last at its final step."""
    tmp, _, _ = warm_sweep
    logs = list((tmp / "runs" / "sweeps" / "warm" / "logs").glob("warm_start-*.log"))
    assert logs
    for log in logs:
        assert "[progress] step 3/3 s/step" in log.read_text(), log.read_text()[-2000:]


def test_share_cores_divides_the_machine_among_the_jobs_running_at_once(monkeypatch):
    """Hand values on an 8-core machine: 2 jobs get 4 threads each, 3 jobs of 2 processes 1 each (8 // 6), no job
    counts as one; never below one thread (a 1-core machine, 4 jobs)."""
    from bench.run.sweep import share_cores

    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert [share_cores(1), share_cores(2), share_cores(3, 2), share_cores(0)] == [8, 4, 1, 8]
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert share_cores(4) == 1


def test_a_stopped_local_launcher_starts_no_more_cells(tmp_path):
    """stop() and a cell's launch are serialised: a cell whose launch comes after the stop never starts (one that
    raced it once started after the SIGTERM was sent to the running ones, and trained on)."""
    import signal
    import sys
    from types import SimpleNamespace

    from bench.run.sweep import LocalLauncher

    spec = SimpleNamespace(resources=SimpleNamespace(devices_per_cell=1), workers=1)
    launcher = LocalLauncher(spec)
    marker = tmp_path / "ran"
    argv = [sys.executable, "-c", f"import pathlib; pathlib.Path({str(marker)!r}).write_text('ran')"]
    assert launcher.run(argv, tmp_path / "a.log", 1, 0, {}) == 0 and marker.exists()  # runs while not stopped
    marker.unlink()
    launcher.stop()
    assert launcher.run(argv, tmp_path / "b.log", 1, 0, {}) == -signal.SIGTERM
    assert not marker.exists() and not launcher.procs
