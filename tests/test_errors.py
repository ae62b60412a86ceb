"""The error paths a newcomer meets, through the real command line: each ends in one `error:` line that names the
problem and the fix, exit status 2, and no traceback."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import ROOT
from bench.registry import TASKS

HUB_CASES = [("gsm8k", []), ("math", []), ("summarization", ["task.corpus=xsum"])]
HUB_CASES += [("summarization", ["task.corpus=dialogsum"])]


def bench_cli(*args: str, store: Path) -> subprocess.CompletedProcess:
    full = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{store}/mlflow.db"}
    return subprocess.run(
        [sys.executable, "-m", "bench", *args], capture_output=True, text=True, cwd=ROOT, env=full, timeout=300
    )


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The run failed with status 2 and its stderr ends in one `error:` line, with no traceback before it."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert proc.stderr.rstrip().endswith(lines[0]), proc.stderr[-3000:]
    return lines[0]


def offline_env(tmp_path: Path) -> dict:
    """No data root, the hub in offline mode and an empty hub cache: the hub cannot be reached."""
    env = {k: v for k, v in os.environ.items() if k != "BENCH_DATA"}
    return {**env, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}


def test_every_hub_task_is_covered() -> None:
    """The offline cases below cover every registered task that declares a hub dataset (a new one must be added)."""
    with_hub = {name for name, cls in TASKS.classes().items() if cls.hub_dataset}
    assert with_hub == {name for name, _ in HUB_CASES}, with_hub


needs_datasets = pytest.mark.skipif(
    importlib.util.find_spec("datasets") is None, reason="datasets is not installed (make install brings it)"
)


@needs_datasets
def test_gsm8k_without_data_root_and_hub_unreachable_says_so(tmp_path: Path) -> None:
    """The issue's command: `bench train task=gsm8k` with no data root and no hub ends in the missing-data message,
    saying that the hub was tried, not in the hub's ConnectionError traceback."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "train", "task=gsm8k", "trainer.max_steps=1"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**offline_env(tmp_path), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db"},
        timeout=300,
    )
    line = one_error_line(proc)
    for part in ("<data root>/gsm8k/train.jsonl", "openai/gsm8k was tried", "could not be reached", "BENCH_DATA"):
        assert part in line, line


@needs_datasets
def test_every_hub_task_offline_gives_the_missing_data_message(tmp_path: Path) -> None:
    """Every task with a hub dataset, hub unreachable: FileNotFoundError naming the expected file under the data
    root, the hub dataset that was tried, and BENCH_DATA. One subprocess, so the offline switches hold from the
    first import of datasets."""
    script = f"""
import json
from omegaconf import OmegaConf
from bench.config import compose
from bench.registry import TASKS
out = []
for name, extra in {HUB_CASES!r}:
    cfg = OmegaConf.to_object(compose([f"task={{name}}", "algorithm=grpo", *extra]).task)
    task = TASKS.get(name)(cfg)
    try:
        task.examples("train")
        out.append([name, extra, "loaded", ""])
    except Exception as e:
        out.append([name, extra, type(e).__name__, str(e)])
print(json.dumps(out))
"""
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, env=offline_env(tmp_path), timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(rows) == len(HUB_CASES), rows
    tried = {"gsm8k": {"openai/gsm8k"}, "math": {"HuggingFaceH4/MATH-500", "DigitalLearningGmbH/MATH-lighteval"}}
    tried |= {"task.corpus=xsum": {"EdinburghNLP/xsum"}, "task.corpus=dialogsum": {"knkarthick/dialogsum"}}
    for name, extra, kind, msg in rows:
        assert kind == "FileNotFoundError", (name, extra, kind, msg)
        assert "<data root>/" in msg and "BENCH_DATA" in msg and "could not be reached" in msg, (name, msg)
        dataset = msg.split("the hub dataset ")[1].split(" was tried instead")[0]
        assert dataset in tried[extra[0] if extra else name], (name, extra, msg)


def test_unknown_sweep_names_the_available_and_the_nearest(tmp_path: Path) -> None:
    line = one_error_line(bench_cli("sweep", "defualt", store=tmp_path))
    assert "unknown sweep 'defualt'" in line and "Available:" in line and "Did you mean 'default'?" in line, line


def test_bad_sweep_axis_names_the_axis_and_the_nearest_key(tmp_path: Path) -> None:
    """An axis that is not a config key (a misspelt dotted key) is named as the axis, with the nearest valid keys,
    before any cell runs; a misspelt top-level sweep key gets one suggestion, not two."""
    sweep = tmp_path / "typo.yaml"
    sweep.write_text("axes:\n  algorithm: [grpo]\n  task: [countdown]\n  algorithm.clip_eps_hgh: [0.2, 0.3]\n")
    line = one_error_line(bench_cli("sweep", str(sweep), store=tmp_path))
    assert "axis 'algorithm.clip_eps_hgh' is not a config key" in line, line
    assert "'algorithm.clip_eps_high'" in line and "Rename the axis" in line, line
    line = one_error_line(bench_cli("sweep", str(sweep), "sweep.axez.seed=[1]", store=tmp_path))
    assert "bad sweep key 'axez'" in line and line.count("Did you mean") == 1 and "'axes'" in line, line


def test_resume_of_a_missing_run_directory(tmp_path: Path) -> None:
    line = one_error_line(bench_cli("train", f"resume={tmp_path / 'runs' / 'nope'}", store=tmp_path))
    assert "no such directory" in line and "resume= takes the run directory that train printed" in line, line
    (tmp_path / "runs" / "half").mkdir(parents=True)
    line = one_error_line(bench_cli("train", f"resume={tmp_path / 'runs' / 'half'}", store=tmp_path))
    assert "not a run that can be resumed" in line and "start a new run" in line, line


def test_model_path_that_does_not_exist(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    line = one_error_line(bench_cli("train", f"model.name_or_path={missing}", "trainer.max_steps=1", store=tmp_path))
    assert f"model.name_or_path='{missing}': no such directory" in line and "model=tiny" in line, line


def test_include_file_with_a_syntax_error(tmp_path: Path) -> None:
    (tmp_path / "broken_task.py").write_text("from bench.task import Task\n\nclass Broken(Task:\n    pass\n")
    line = one_error_line(bench_cli("--include", str(tmp_path), "list", store=tmp_path))
    assert "broken_task.py failed to import: SyntaxError" in line and "line 3" in line, line
    assert f"take it out of {tmp_path}" in line, line


@needs_datasets
def test_unreachable_hub_fails_at_once_and_leaves_no_run_behind(tmp_path: Path) -> None:
    """No data root, no offline switch, the hub's host refusing connections (HF_ENDPOINT on a closed local port): one
    error line and no hub retries (was: 80-110 s of retry warnings, twice, before it), and neither an MLflow run (was:
    one left RUNNING) nor a run directory is created, because the data is checked before either."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    env = {k: v for k, v in os.environ.items() if k not in ("BENCH_DATA", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    env |= {"HF_ENDPOINT": f"http://127.0.0.1:{port}", "HF_HOME": str(tmp_path / "hf"),
            "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db"}  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "train", "task=gsm8k", "algorithm=grpo", "init=sft",
         f"output_dir={tmp_path / 'runs'}", f"cache_dir={tmp_path / 'cache'}"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300,
    )  # fmt: skip
    line = one_error_line(proc)
    assert f"127.0.0.1:{port} did not accept a connection" in line and "<data root>/gsm8k/" in line, line
    assert "retry" not in proc.stderr.lower() and "warning" not in proc.stderr.lower(), proc.stderr[-3000:]
    assert not (tmp_path / "runs").exists() and not (tmp_path / "cache").exists()
    if (tmp_path / "mlflow.db").exists():
        from mlflow.tracking import MlflowClient

        client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
        runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
        assert not runs, [(r.info.run_name, r.info.status) for r in runs]


def test_a_run_that_fails_after_it_started_ends_failed_not_running(tmp_path: Path) -> None:
    """A dropped-in task whose data_stats raises (a bug in the user's file) fails after its MLflow run exists and
    before Lightning takes over: the run ends FAILED with the error as a tag (was: left RUNNING for good)."""
    from mlflow.tracking import MlflowClient

    from tests.test_dropin import readme_example

    d = tmp_path / "broken"
    d.mkdir()
    source = readme_example("task").replace("class Reverse(Task):", "class Broken(Task):")
    source = source.replace('name: str = "reverse"', 'name: str = "broken"')
    source += "\n    def data_stats(self):\n        raise RuntimeError('a bug in data_stats')\n"
    (d / "broken.py").write_text(source)
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "train", "--include", str(d), "task=broken", "algorithm=grpo",
         "trainer.max_steps=1", "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
         "model.intermediate_size=64", f"tracking.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
         f"output_dir={tmp_path / 'runs'}", f"cache_dir={tmp_path / 'cache'}"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert proc.returncode != 0 and "a bug in data_stats" in proc.stderr, proc.stderr[-2000:]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FAILED", run.info.status
    assert run.data.tags["error"] == "RuntimeError: a bug in data_stats", run.data.tags.get("error")
