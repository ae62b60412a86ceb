"""Shared fixtures: a small config for end-to-end runs of the tiny model, and a session-wide MLflow SQLite store."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

from bench import ROOT

# make test runs the suite in several processes (pytest-xdist): each gets its share of the cores, so that their torch
# thread pools do not oversubscribe them (subprocesses inherit it). An explicit OMP_NUM_THREADS wins.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1 and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // _WORKERS))

# CI draws the same examples on every run (a red CI is then reproducible, never a lucky draw); locally each run
# explores new examples. Select with HYPOTHESIS_PROFILE=ci (set by .ci/run).
# deadline=None: hypothesis' default 200 ms per example is a machine-speed assertion, and this machine is shared
settings.register_profile("ci", derandomize=True, print_blob=True, deadline=None)
settings.register_profile("dev", print_blob=True, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

SMALL = [
    "model.hidden_size=32",
    "model.num_layers=2",
    "model.num_heads=2",
    "model.intermediate_size=64",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=16",
    "task.num_eval=8",
    "eval.batch_size=8",
    "eval.samples_logged=4",
    "train.batch_size=8",
    "trainer.max_steps=2",
    "trainer.eval_every=1",
    "trainer.progress_bar=false",
    "warm_start.max_steps=4",
]


@pytest.fixture(scope="session")
def store(tmp_path_factory) -> dict:
    """A real MLflow tracking store (SQLite) and output/cache directories shared by the session's runs."""
    d = tmp_path_factory.mktemp("bench")
    cache = d / "cache"
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # The test processes share one warm-start cache, as one process would: the cache's lock lets one train a warm
        # start while the others wait for it and reuse it (the contract tests of two files share one).
        cache = tmp_path_factory.getbasetemp().parent / "shared-cache"
    return {
        "dir": d,
        "cache": cache,
        "uri": f"sqlite:///{d / 'mlflow.db'}",
        "args": [
            f"tracking.tracking_uri=sqlite:///{d / 'mlflow.db'}",
            f"output_dir={d / 'runs'}",
            f"cache_dir={cache}",
        ],
    }


@pytest.fixture
def small(store) -> list[str]:
    """Overrides for a seconds-long run of the tiny model, tracked in the session store."""
    return SMALL + store["args"]


def data_root(holds: str = "") -> Path | None:
    """The one way the tests find the data: BENCH_DATA, else ../shared/data beside the checkout (as the Makefile
    does); None when that folder (or ``holds`` under it, e.g. "gsm8k/test.jsonl") is not there."""
    root = Path(os.environ.get("BENCH_DATA") or ROOT.parent / "shared" / "data")
    return root if root.is_dir() and (root / holds).exists() else None


# A bare `pytest` finds the data the Makefile would point at: the configs the tests compose read BENCH_DATA too.
if "BENCH_DATA" not in os.environ and data_root() is not None:
    os.environ["BENCH_DATA"] = str(data_root())


# ---- make gpu-check: a GPU test that skips is a failure there ------------------------------------------------------
def pytest_addoption(parser):
    parser.addoption(
        "--gpu-strict",
        action="store_true",
        help="a gpu-marked test that skips (no CUDA, no CUDA vLLM, too few GPUs) fails instead (make gpu-check)",
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and item.config.getoption("--gpu-strict") and item.get_closest_marker("gpu"):
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"make gpu-check needs this test to run, and it skipped: {reason}"


COIN = '''
from bench.task import RewardResult
from tasks.countdown import Countdown


class Coin(Countdown):
    """Countdown's prompts; a completion scores 1 when its first character has an even code point (a test task)."""

    def reward(self, example, completion):
        score = float(bool(completion) and ord(completion[0]) % 2 == 0)
        return RewardResult(score=score, components={"correct": score})
'''


@pytest.fixture
def coin(tmp_path):
    """A dropped-in task (COIN) on which even a random model's rewards vary, so every group carries a gradient."""
    from bench.registry import TASKS

    d = tmp_path / "pooltasks"
    d.mkdir()
    (d / "coin.py").write_text(COIN)
    TASKS.include(d)
    yield ["task=coin"]
    TASKS.dirs.remove(d.resolve())
    TASKS._classes = None
