"""The report's data: each finished run read back from MLflow (its curve, budget axes and per-problem outcomes) and the
runs grouped by task and variant."""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench import stats as S
from bench.config import config_hash
from bench.run.sweep import (
    NOT_IN_IDENTITY,
    Cell,
    Sweep,
)

X_AXES = {"step": None, "samples": "eval/at_samples_seen", "tokens": "eval/at_tokens_generated"}

KINDS = ("final", "auc")

# Sweep keys that change how cells are run, not what they compute or what the report says.
RUN_ONLY_KEYS = (
    "sweep.workers",
    "sweep.launcher",
    "sweep.max_retries",
    "sweep.ray_address",
    "sweep.resources",
    "sweep.report.ui_url",
    *NOT_IN_IDENTITY,  # where things lie (cache, store, outputs) and run switches: not what a cell computes
)


def per_problem(metric: str) -> Callable[[dict], float] | None:
    """The per-problem value of a held-out metric in an outcomes row, or None when the metric has none."""
    fixed = {
        "eval/accuracy": lambda r: float(r["correct"]),
        "eval/reward_mean": lambda r: float(r["score"]),
        "eval/completion_len_mean": lambda r: float(r["length"]),
        "eval/sampled_reward_mean": lambda r: float(r["score_mean"]),
        "eval/sampled_len_mean": lambda r: float(r["length_mean"]),
    }
    if metric in fixed:
        return fixed[metric]
    if m := re.fullmatch(r"eval/mean_at_(\d+)", metric):
        return lambda r: r["n_correct"] / r["n"]
    if m := re.fullmatch(r"eval/pass_at_(\d+)", metric):
        k = int(m.group(1))
        return lambda r: float(S.pass_at_k(r["n"], r["n_correct"], k))
    return None


@dataclass
class RunStats:
    cell: Cell
    run_id: str
    curve: dict[int, float]  # eval step -> metric
    x: dict[str, dict[int, float]]  # x-axis -> eval step -> value
    completion_len: float
    tokens_per_s: float
    s_per_step: float
    wall_clock_s: float
    problems: dict[int, dict[str, float]] | None = None  # eval step -> uid -> per-problem value
    commit: str = "unknown"  # the git commit the run trained at

    @property
    def seed(self) -> int:
        return int(self.cell.cfg.seed)

    @property
    def final(self) -> float:
        return self.curve[max(self.curve)]

    @property
    def best(self) -> float:
        return max(self.curve.values())

    @property
    def auc(self) -> float:
        """Mean held-out value over training: trapezoid area under the curve / step range."""
        return _trapezoid_mean(self.curve)

    def value(self, kind: str) -> float:
        return self.final if kind == "final" else self.auc

    def problem_values(self, kind: str, uids: list[str]) -> np.ndarray:
        """[M] per-problem values in ``uids`` order: at the last evaluation, or averaged over training like ``auc``."""
        steps = sorted(self.problems)
        if kind == "final":
            return np.array([self.problems[steps[-1]][u] for u in uids])
        per_step = {s: np.array([self.problems[s][u] for u in uids]) for s in steps}
        return _trapezoid_mean(per_step)

    def to_threshold(self, threshold: float, axis: str) -> float | None:
        """The first evaluation at which the metric reaches ``threshold``, on the given x-axis; None if never."""
        for s in sorted(self.curve):
            if self.curve[s] >= threshold:
                return float(s) if axis == "step" else self.x[axis].get(s)
        return None


def _trapezoid_mean(curve: dict):
    """The mean of a curve {step: value (or an array of per-problem values)} over its steps: trapezoid area / range."""
    steps = sorted(curve)
    if len(steps) < 2:
        return curve[steps[0]]
    return np.trapezoid(np.array([curve[s] for s in steps]), steps, axis=0) / (steps[-1] - steps[0])


@dataclass
class Group:
    task: str
    variant: str
    runs: list[RunStats] = field(default_factory=list)
    planned: int = 0

    @property
    def seeds(self) -> list[int]:
        return sorted(r.seed for r in self.runs)

    def by_seed(self, seeds: list[int]) -> list[RunStats]:
        index = {r.seed: r for r in self.runs}
        return [index[s] for s in seeds]

    def values(self, kind: str) -> list[float]:
        return [r.value(kind) for r in self.by_seed(self.seeds)]


def mean_ci(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% confidence interval (Student t, n − 1 dof); nan half-width for n < 2."""
    from scipy import stats

    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return math.nan, math.nan
    m = statistics.fmean(vals)
    if len(vals) < 2:
        return m, math.nan
    return m, float(stats.t.ppf(0.975, len(vals) - 1) * stats.sem(vals))


def _history(client, run_id: str, key: str) -> dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


def _until(history: dict[int, float], step: int | None) -> dict[int, float]:
    return history if step is None else {s: v for s, v in history.items() if s <= step}


def _outcomes(client, run_id: str, steps: list[int], value: Callable[[dict], float] | None) -> dict | None:
    """Per-problem values at every evaluation step of a run, from its outcome artifacts; None if any is missing."""
    if value is None:
        return None
    names = {a.path.rsplit("/", 1)[-1] for a in client.list_artifacts(run_id, "eval/outcomes")}
    if not all(f"step_{s:06d}.jsonl" in names for s in steps):
        return None
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"  # one bar per run would flood the console
        local = Path(client.download_artifacts(run_id, "eval/outcomes", tmp))
        for s in steps:
            with (local / f"step_{s:06d}.jsonl").open() as f:
                out[s] = {row["uid"]: value(row) for row in map(json.loads, f)}
    return out


def collect(sweep: Sweep, metric: str, until_step: int | None = None) -> tuple[list[RunStats], list[Cell]]:
    """The FINISHED run of every cell, with the histories and per-problem outcomes the report needs (up to
    ``until_step`` when given: ``report.until_step``); and the cells that have none."""
    finished = {}
    for r in sweep.runs(role="cell"):
        if r.info.status == "FINISHED":
            finished.setdefault(r.data.tags.get("sweep.cell"), r)
    value = per_problem(metric)
    out, missing = [], []
    for cell in sweep.cells:
        run = finished.get(cell.id)
        if run is None:
            missing.append(cell)
            continue
        rid, c = run.info.run_id, sweep.client
        curve = _until(_history(c, rid, metric), until_step)
        if not curve:
            missing.append(cell)
            continue
        x = {axis: _until(_history(c, rid, key), until_step) for axis, key in X_AXES.items() if key}
        step_time = list(_history(c, rid, "time/step").values())
        lengths = list(_history(c, rid, "rollout/completion_len_mean").values())
        tokens = run.data.metrics.get("rollout/tokens_generated", math.nan)
        out.append(
            RunStats(
                cell=cell,
                run_id=rid,
                curve=curve,
                x=x,
                completion_len=statistics.fmean(lengths) if lengths else math.nan,
                tokens_per_s=tokens / sum(step_time) if step_time else math.nan,
                s_per_step=statistics.fmean(step_time) if step_time else math.nan,
                wall_clock_s=float(
                    run.data.tags.get("sweep.wall_clock_s") or ((run.info.end_time or 0) - run.info.start_time) / 1000
                ),
                problems=_outcomes(c, rid, sorted(curve), value),
                commit=run.data.tags.get("git_commit", "unknown"),
            )
        )
    return out, missing


def eval_settings(cell: Cell) -> str:
    """What decides a held-out number: the eval section and the task's evaluation split and size."""
    task = cell.cfg.task
    keys = ("eval_split", "num_eval", "data_root", "source", "corpus", "test_share", "gen_seed")
    return config_hash({"eval": cell.cfg.eval} | {k: task.get(k) for k in keys}) + str(cell.cfg.rollout.max_new_tokens)


def group(runs: list[RunStats], cells: list[Cell], labels: dict[str, str]) -> list[Group]:
    groups: dict[tuple[str, str], Group] = {}
    for c in cells:
        key = (c.where, labels[c.id])
        groups.setdefault(key, Group(*key)).planned += 1
    for r in runs:
        groups[(r.cell.where, labels[r.cell.id])].runs.append(r)
    return list(groups.values())
