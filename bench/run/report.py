"""A sweep's report, read back from MLflow: ``python -m bench report <sweep>`` writes ``results/<sweep>/``.

- ``summary.md`` (renders on GitHub; the copy logged to the sweep's parent run links its images through MLflow's
  artifact endpoint so it renders in the MLflow UI too). At the top, per task, the power sentence: the smallest
  difference the sweep can detect and the seeds a target effect would need. Then what ran (read from the cells'
  resolved configs), and per task: the per-variant table (final, best, AUC, steps and tokens to threshold, cost;
  mean and IQM with rliable's stratified-bootstrap CIs), the differences to the baseline (paired by seed where seeds
  match, with the unpaired interval beside it, multiple-comparison adjusted), the probability of improvement of
  every pair, the noise decomposition (evaluation vs training) and ScaleRL compute-curve fits.
- ``summary.csv`` (per task x variant), ``comparisons.csv`` (per comparison), ``fits.csv``, ``runs.csv`` (per run,
  with its MLflow run id).
- ``curves_{step,samples,tokens}.png`` (mean over seeds, min..max band), ``aggregates.png`` (rliable interval
  estimates), ``profile.png`` (performance profiles), ``improvement.png`` (probability of improvement),
  ``compute_{tokens,samples}.png`` (the fitted sigmoids over the data).

Paired statistics read the per-problem outcomes every evaluation logs (``eval/outcomes/step_<step>.jsonl``); a run
without them (or a metric without a per-problem value) is analysed at the run level (one value per seed).
Estimators: bench/stats.py.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import re
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import numpy as np
from omegaconf import OmegaConf

from bench import ROOT
from bench import stats as S
from bench.config import ConfigError, config_hash
from bench.registry import did_you_mean
from bench.run.plots import natural_key, plot, plot_differences, plot_fits, plot_rliable, plot_settings
from bench.run.sweep import (
    NOT_IN_IDENTITY,
    Cell,
    ReportSpec,
    Sweep,
    SweepSpec,
    load_plan,
    numeric_axis,
    setting_name,
    variants,
)
from bench.tracking import git_commit

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
UI_URL = "http://127.0.0.1:5000"  # where `make ui` serves the embedded store


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


def collect(sweep: Sweep, metric: str) -> tuple[list[RunStats], list[Cell]]:
    """The FINISHED run of every cell, with the histories and per-problem outcomes the report needs; and the cells
    that have none."""
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
        curve = _history(c, rid, metric)
        if not curve:
            missing.append(cell)
            continue
        x = {axis: _history(c, rid, key) for axis, key in X_AXES.items() if key}
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


# ---- analysis per task ---------------------------------------------------------------------------------------------
@dataclass
class Comparison:
    task: str
    variant: str
    baseline: str
    kind: str  # final | auc, or final@<budget> | auc@<budget> (at equal samples seen / tokens generated)
    paired: S.Difference | None  # seeds matched (None: fewer than 2 shared seeds)
    unpaired: S.Difference  # the same seeds, analysed as independent
    p_adjusted: float = math.nan
    budget: tuple[float, float] | None = None  # at equal budget: the common range (lo, hi); final@ is at hi

    @property
    def main(self) -> S.Difference:
        return self.paired if self.paired is not None and not math.isnan(self.paired.se) else self.unpaired

    @property
    def narrowing(self) -> float:
        """How much pairing narrowed the interval: 1 − paired half-width / unpaired half-width."""
        if self.paired is None or not self.unpaired.half_width > 0:
            return math.nan
        return 1.0 - self.paired.half_width / self.unpaired.half_width


def shared_uids(groups: list[Group]) -> list[str] | None:
    """The problems every run of these groups was evaluated on at every step (None: per-problem analysis is not
    possible, e.g. runs without outcome artifacts or with different evaluation sets)."""
    runs = [r for g in groups for r in g.runs]
    if not runs or any(r.problems is None for r in runs):
        return None
    first = runs[0].problems[min(runs[0].problems)]
    uids = list(first)
    for r in runs:
        for vals in r.problems.values():
            if set(vals) != set(uids):
                return None
    return uids


def matrix(g: Group, seeds: list[int], kind: str, uids: list[str] | None) -> np.ndarray:
    """[seeds, problems] per-problem values, or [seeds, 1] run-level values without per-problem outcomes."""
    runs = g.by_seed(seeds)
    if uids is None:
        return np.array([[r.value(kind)] for r in runs])
    return np.stack([r.problem_values(kind, uids) for r in runs])


def _at_step(g: Group, seeds: list[int], step: int, uids) -> np.ndarray:
    """[seeds, problems] per-problem values at one evaluation (run-level [seeds, 1] without outcomes)."""
    rs = g.by_seed(seeds)
    if uids is None:
        return np.array([[r.curve[step]] for r in rs])
    return np.stack([np.array([r.problems[step][u] for u in uids]) for r in rs])


def difference_curves(groups: list[Group], baseline: Group, uids, spec: SweepSpec) -> dict[str, list]:
    """variant -> [(step, paired Difference to the baseline at that evaluation)] over the evaluations all share."""
    out = {}
    for g in groups:
        seeds = sorted(set(g.seeds) & set(baseline.seeds))
        if g is baseline or len(seeds) < 2:
            continue
        steps = sorted(set.intersection(*(set(r.curve) for r in g.by_seed(seeds) + baseline.by_seed(seeds))))
        out[g.variant] = [
            (s, S.difference(_at_step(g, seeds, s, uids), _at_step(baseline, seeds, s, uids), paired=True,
                             alpha=spec.report.alpha))
            for s in steps
        ]  # fmt: skip
    return out


def compare(groups: list[Group], baseline: Group, uids, spec: SweepSpec) -> list[Comparison]:
    rep = spec.report
    out = []
    for g in groups:
        if g is baseline or not g.runs:
            continue
        seeds = sorted(set(g.seeds) & set(baseline.seeds))
        for kind in KINDS:
            if len(seeds) >= 2:
                a, b = matrix(g, seeds, kind, uids), matrix(baseline, seeds, kind, uids)
                kw = dict(alpha=rep.alpha, interval=rep.interval, reps=rep.bootstrap_reps)
                paired, unpaired = S.difference(a, b, paired=True, **kw), S.difference(a, b, paired=False, **kw)
            else:  # no shared seeds: all of each side, unpaired
                a, b = matrix(g, g.seeds, kind, uids), matrix(baseline, baseline.seeds, kind, uids)
                paired, unpaired = None, S.difference(a, b, paired=False, alpha=rep.alpha, interval=rep.interval)
            out.append(Comparison(g.task, g.variant, baseline.variant, kind, paired, unpaired))
    for kind in KINDS:  # one family per task and kind: the comparisons with the baseline
        family = [c for c in out if c.kind == kind]
        for c, p in zip(family, S.adjust([c.main.p for c in family], rep.correction), strict=True):
            c.p_adjusted = p
    return out


BUDGETS = ("samples", "tokens")  # the budget axes of the comparisons at equal budget (RunStats.x)


def budget_curve(r: RunStats, axis: str, uids: list[str] | None) -> tuple[np.ndarray, np.ndarray]:
    """A run's evaluations against its budget: (budgets [E], values [E, problems] or [E, 1] without outcomes)."""
    steps = sorted(s for s in r.curve if s in r.x.get(axis, {}))
    xs = np.maximum.accumulate(np.array([r.x[axis][s] for s in steps], dtype=float))
    if uids is None:
        return xs, np.array([[r.curve[s]] for s in steps], dtype=float)
    return xs, np.array([[r.problems[s][u] for u in uids] for s in steps], dtype=float)


def at_budget(r: RunStats, axis: str, uids, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-problem values at budget ``hi`` (linear interpolation between the evaluations around it) and their mean
    over [lo, hi] (trapezoid of the interpolated curve / (hi − lo)): the run at equal samples or tokens."""
    xs, ys = budget_curve(r, axis, uids)
    grid = np.unique(np.concatenate([[lo, hi], xs[(xs > lo) & (xs < hi)]]))
    vals = np.stack([np.interp(grid, xs, ys[:, j]) for j in range(ys.shape[1])], axis=1)  # [grid, problems]
    auc = vals[0] if hi <= lo else np.trapezoid(vals, grid, axis=0) / (hi - lo)
    return vals[-1], auc


def compare_budget(groups: list[Group], baseline: Group, uids, spec: SweepSpec, axis: str) -> list[Comparison]:
    """Each variant against the baseline at equal ``axis`` (samples seen or tokens generated), paired by seed and
    problem: the final value at the largest budget every run of the pair reaches, and the AUC over the budget range
    they all cover. Holm (or BH) within each kind, as at equal steps."""
    rep, out = spec.report, []
    for g in groups:
        seeds = sorted(set(g.seeds) & set(baseline.seeds))
        if g is baseline or len(seeds) < 2:
            continue
        rs = g.by_seed(seeds) + baseline.by_seed(seeds)
        curves = [budget_curve(r, axis, None)[0] for r in rs]
        if any(len(x) < 2 for x in curves):
            continue
        lo, hi = max(float(x[0]) for x in curves), min(float(x[-1]) for x in curves)
        if not hi > lo:
            continue
        a = [at_budget(r, axis, uids, lo, hi) for r in g.by_seed(seeds)]
        b = [at_budget(r, axis, uids, lo, hi) for r in baseline.by_seed(seeds)]
        for i, kind in enumerate(KINDS):
            A, B = np.stack([x[i] for x in a]), np.stack([x[i] for x in b])
            kw = dict(alpha=rep.alpha, interval=rep.interval, reps=rep.bootstrap_reps)
            paired, unpaired = S.difference(A, B, paired=True, **kw), S.difference(A, B, paired=False, **kw)
            out.append(Comparison(g.task, g.variant, baseline.variant, f"{kind}@{axis}", paired, unpaired,
                                  budget=(lo, hi)))  # fmt: skip
    for kind in {c.kind for c in out}:
        family = [c for c in out if c.kind == kind]
        for c, p in zip(family, S.adjust([c.main.p for c in family], rep.correction), strict=True):
            c.p_adjusted = p
    return out


def per_step_not_per_budget(cs: list[Comparison], alpha: float) -> list[str]:
    """Sentences naming each variant that is ahead of the baseline at equal steps (adjusted p < alpha) but not at
    equal samples seen or tokens generated."""
    out = []
    for v in sorted({c.variant for c in cs}):
        ahead = [c for c in cs if c.variant == v and c.kind in KINDS and c.p_adjusted < alpha and c.main.estimate > 0]
        for c in ahead:
            for axis in BUDGETS:
                b = next((x for x in cs if x.variant == v and x.kind == f"{c.kind}@{axis}"), None)
                if b is None or (b.p_adjusted < alpha and b.main.estimate > 0):
                    continue
                what = "final value" if c.kind == "final" else "AUC"
                where = f"at {_big(b.budget[1])} {axis}" if c.kind == "final" else f"over 0-{_big(b.budget[1])} {axis}"
                out.append(f"**{v} wins per step but not per {axis[:-1]}** ({what}): {_ci(c.main)} at equal "
                           f"steps (adjusted p {_p(c.p_adjusted)}), {_ci(b.main)} {where} "
                           f"(adjusted p {_p(b.p_adjusted)}).")  # fmt: skip
    return out


@dataclass
class Power:
    task: str
    kind: str
    seeds: int
    problems: int
    sd: float
    paired: bool
    mde: float
    mde_unpaired: float
    needed: float
    target: float
    mde_noisiest: float = math.nan
    mde_lo: float = math.nan
    mde_hi: float = math.nan
    df: float = math.nan
    comparisons: int = 0
    headline: str = ""
    """The comparison whose detectable difference is the median one (its interval is the one quoted)."""
    floor: float = 0.0
    """The detectable difference with infinitely many seeds: the evaluation set's problem term alone."""


def power(task: str, comparisons: list[Comparison], groups: list[Group], uids, spec: SweepSpec) -> list[Power]:
    """The difference each comparison detects with the report's power (its own seed SD, its problem term held fixed:
    ``Difference.mde``), summarised by the comparison at the median (a collapsing variant's huge spread must not set
    the figure for the others; the noisiest one is kept beside it), with that comparison's χ² interval on its seed SD.
    With a single variant, the SD of its own seeds. And the seeds a ``report.target_effect`` would need, with the
    floor the problem term sets."""
    rep = spec.report
    live = [g for g in groups if g.runs]
    n = min(len(g.runs) for g in live)
    M = len(uids) if uids else 0
    kw = dict(alpha=rep.alpha, power=rep.power)
    out = []
    for kind in KINDS:
        cs = [c for c in comparisons if c.kind == kind]
        paired = [c.paired for c in cs if c.paired and not math.isnan(c.paired.se)]
        unpaired = [c.unpaired for c in cs if not math.isnan(c.unpaired.se)]
        ds, use_paired = (paired, True) if paired else (unpaired, False)
        if not ds:
            sd = statistics.stdev(live[0].values(kind)) if not cs and n >= 2 else math.nan
            m = S.mde(sd, n, paired=False, **kw)
            need = S.seeds_needed(rep.target_effect, sd, paired=False, **kw)
            out.append(Power(task, kind, n, M, sd, False, m, m, need, rep.target_effect))
            continue
        ranked = sorted(ds, key=lambda d: d.mde(**kw))
        mid = ranked[(len(ranked) - 1) // 2]  # the median (the lower middle one of an even count)
        head = next(c.variant for c in cs if mid in (c.paired, c.unpaired))
        lo, hi = mid.mde_interval(**kw)
        mde_u = statistics.median(d.mde(**kw) for d in unpaired) if unpaired else math.nan
        out.append(
            Power(
                task, kind, n, M, mid.seed_sd, use_paired, mid.mde(**kw), mde_u,
                S.seeds_needed(rep.target_effect, mid.seed_sd, paired=use_paired, problem_var=mid.problem_var, **kw),
                rep.target_effect, ranked[-1].mde(**kw), lo, hi, mid.df, len(ds), head,
                S.mde_floor(mid.problem_var, **kw),
            )
        )  # fmt: skip
    return out


def power_sentence(ps: list[Power], baseline: str, metric: str, spec: SweepSpec, gain: float) -> str:
    """The sentence at the top of a task's report: the difference this sweep detects with the report's power (what it
    is: the median comparison's, with its interval), the seeds a target effect needs and the floor the evaluation
    set sets, and how the gain over the start compares with the detectable difference."""
    final, auc = ps
    if final.sd == 0:
        return (
            f"**{final.task}**: every variant's final `{metric}` minus {baseline}'s was the same on every seed, so "
            "the variance of the paired differences, which sets the smallest detectable difference, is zero and "
            "cannot be estimated from this sweep."
        )
    if math.isnan(final.mde):
        return (
            f"**{final.task}**: with {final.seeds} seed(s) this sweep cannot estimate the smallest difference it can "
            "detect (a t-test needs at least 2 seeds per variant)."
        )
    rep = spec.report
    problems = f"{final.problems} evaluation problems" if final.problems else "run-level values"
    ci = lambda p: "" if math.isnan(p.mde_lo) else f" [95% CI {p.mde_lo:.3f}, {p.mde_hi:.3f}]"  # noqa: E731
    if final.comparisons:
        how = (f"paired by seed against {baseline}; " if final.paired else "unpaired; ") + (
            f"the median of {final.comparisons} comparisons, {final.headline}'s; each one's own is in its differences "
            f"table"
            if final.comparisons > 1
            else f"{final.headline} against {baseline}"
        )
        if final.paired and not math.isnan(final.mde_unpaired):
            how += f"; {final.mde_unpaired:.3f} unpaired"
        how += f". The interval is that of the seed SD on {final.df:.0f} degrees of freedom"
    else:
        how = "one variant: the SD of its own seeds, unpaired"
    noisiest = (f" The noisiest comparison detects only {final.mde_noisiest:.3f}."
                if final.mde_noisiest > 1.5 * final.mde else "")  # fmt: skip
    floor = ""
    if final.floor > 0:
        floor = (f" The evaluation set's problem term does not shrink with seeds: with any number of seeds nothing "
                 f"below {final.floor:.3f} (final) or {auc.floor:.3f} (AUC) is detected with this power.")  # fmt: skip

    def need(p: Power) -> str:
        if p.needed == math.inf:
            return f"no number of seeds (the floor is {p.floor:.3f})" if p.target <= p.floor else "more than 100,000"
        return f"{p.needed:.0f} seeds per variant" if p is final else f"{p.needed:.0f}"

    ratio = (f" The median variant's gain over the start (final − step 0) is {gain:+.3f}, {gain / final.mde:.1f}x the "
             "detectable difference." if math.isfinite(gain) else "")  # fmt: skip
    return (
        f"**{final.task}**: with {final.seeds} seeds and {problems}, a difference of **{final.mde:.3f}**{ci(final)} "
        f"in the final `{metric}` is detected with power {rep.power:g} at α = {rep.alpha:g} (two-sided); smaller ones "
        f"may be missed ({how}). Over training (AUC): {auc.mde:.3f}{ci(auc)}.{noisiest} Detecting a difference of "
        f"{final.target:g} would take {need(final)} (final) or {need(auc)} (AUC).{floor}{ratio}"
    )


@dataclass
class NoiseRow:
    task: str
    variant: str
    kind: str
    noise: S.Noise


def noise_rows(groups: list[Group], uids) -> list[NoiseRow]:
    out = []
    for g in groups:
        if len(g.runs) >= 2 and uids:
            for kind in KINDS:
                out.append(NoiseRow(g.task, g.variant, kind, S.noise(matrix(g, g.seeds, kind, uids))))
    return out


def fits(groups: list[Group], axis: str, R0: float, reps: int) -> dict[str, S.CurveFit | None]:
    """The ScaleRL sigmoid per variant; none for a metric outside [0, 1] (the fit's bounds assume a pass rate)."""
    out = {}
    if any(not 0 <= v <= 1 for g in groups for r in g.runs for v in r.curve.values()):
        return {g.variant: None for g in groups}
    for g in groups:
        curves = [
            (
                np.array([r.x[axis].get(s, math.nan) for s in sorted(r.curve)]),
                np.array([r.curve[s] for s in sorted(r.curve)]),
            )
            for r in g.runs
        ]
        curves = [(c[np.isfinite(c)], v[np.isfinite(c)]) for c, v in curves]
        out[g.variant] = S.fit_compute_curve(curves, R0, reps=reps) if curves else None
    return out


# ---- text -----------------------------------------------------------------------------------------------------------
def _fmt(m: float, ci: float, digits: int = 3) -> str:
    if m is None or math.isnan(m):
        return "–"
    return f"{m:.{digits}f}" + ("" if ci is None or math.isnan(ci) else f" ± {ci:.{digits}f}")


def _big(v: float) -> str:
    return "–" if v is None or math.isnan(v) else f"{v:,.0f}"


def _ci(d: S.Difference | None, digits: int = 3) -> str:
    if d is None or math.isnan(d.lo):
        return "–"
    return f"{d.estimate:+.{digits}f} [{d.lo:+.{digits}f}, {d.hi:+.{digits}f}]"


def _mde(c: Comparison, rep: ReportSpec) -> str:
    """The difference this comparison detects with the report's power (its own seed SD and problem term)."""
    d = c.main
    m = d.mde(alpha=rep.alpha, power=rep.power) if not math.isnan(d.se) else math.nan
    return "–" if math.isnan(m) else f"{m:.3f}"


def _p(p: float) -> str:
    return "–" if math.isnan(p) else ("< 0.001" if p < 0.001 else f"{p:.3f}")


def what_ran(cells: list[Cell], uids: list[str] | None) -> str:
    """The settings a task's cells actually used, read from their resolved configs (a key that differs between
    cells shows every value)."""

    def v(path: str) -> str:
        vals = sorted({str(OmegaConf.select(c.cfg, path)) for c in cells})
        return " | ".join(vals)

    c0 = cells[0].cfg
    seeds = sorted({int(c.cfg.seed) for c in cells})
    init = v("init")
    if init == "sft":
        shared = v("warm_start.seed")
        whose = "a per-seed" if shared == "None" else f"one (seed {shared}, shared by every seed)"
        init = f"sft ({whose} SFT warm start of {v('warm_start.max_steps')} steps)"
    sampled = ""
    if any(c.cfg.eval.samples_per_problem for c in cells):
        sampled = (
            f", plus {v('eval.samples_per_problem')} samples per problem at temperature {v('eval.temperature')} "
            f"(top-p {v('eval.top_p')})"
        )
    problems = len(uids) if uids else v("task.num_eval")
    return (
        f"model `{v('model.name')}` ({v('model.name_or_path')}), init {init}; {v('trainer.max_steps')} rollout steps "
        f"of {v('rollout.prompts_per_step')} prompts x {v('rollout.group_size')} completions, at most "
        f"{v('rollout.max_new_tokens')} new tokens at temperature {v('rollout.temperature')}, lr {v('optim.lr')}; "
        f"held-out: greedy pass@1 on {problems} problems of the `{c0.task.eval_split}` split every "
        f"{v('trainer.eval_every')} steps{sampled}; seeds {', '.join(map(str, seeds))}."
    )


COLUMNS = [
    ("variant", "variant", lambda r: r["variant"]),
    ("seeds", "seeds", lambda r: f"{r['seeds']}/{r['planned']}"),
    ("final", "final (95% CI)", lambda r: _fmt(r["final_mean"], r["final_ci95"])),
    ("iqm", "final IQM [95% CI]", lambda r: _agg(r, "final_iqm")),
    ("best", "best", lambda r: _fmt(r["best_mean"], r["best_ci95"])),
    ("auc", "AUC (mean over training)", lambda r: _fmt(r["auc_mean"], r["auc_ci95"])),
    ("gain", "gain over start", lambda r: _fmt(r["gain_mean"], r["gain_ci95"])),
    ("steps", "steps to thr.", lambda r: f"{_big(r['step_to_threshold_mean'])} ({r['reached']}/{r['seeds']})"),
    ("tokens", "tokens to thr.", lambda r: _big(r["tokens_to_threshold_mean"])),
    ("len", "completion len", lambda r: _fmt(r["completion_len_mean"], math.nan, 1)),
    ("tps", "tokens/s", lambda r: _big(r["tokens_per_s_mean"])),
    ("sps", "s/step", lambda r: _fmt(r["s_per_step_mean"], math.nan, 2)),
]


def _agg(r: dict, key: str) -> str:
    if math.isnan(r.get(key, math.nan)):
        return "–"
    return f"{r[key]:.3f} [{r[key + '_lo']:.3f}, {r[key + '_hi']:.3f}]"


def statistics_rows(groups: list[Group], threshold: dict[str, float], agg: dict) -> list[dict]:
    rows = []
    for g in groups:
        rs = g.runs
        row = {"task": g.task, "variant": g.variant, "seeds": len(rs), "planned": g.planned}
        for name, vals in (
            ("final", [r.final for r in rs]),
            ("best", [r.best for r in rs]),
            ("auc", [r.auc for r in rs]),
            ("gain", [r.final - r.curve[min(r.curve)] for r in rs]),
            ("completion_len", [r.completion_len for r in rs]),
            ("tokens_per_s", [r.tokens_per_s for r in rs]),
            ("s_per_step", [r.s_per_step for r in rs]),
        ):
            row[f"{name}_mean"], row[f"{name}_ci95"] = mean_ci(vals)
        for kind in KINDS:
            for stat in ("mean", "iqm"):
                point, lo, hi = agg.get((g.task, g.variant), {}).get(kind, {}).get(stat, (math.nan,) * 3)
                row[f"{kind}_{stat}"], row[f"{kind}_{stat}_lo"], row[f"{kind}_{stat}_hi"] = point, lo, hi
        for axis in ("step", "samples", "tokens"):
            reached = [h for h in (r.to_threshold(threshold[g.task], axis) for r in rs) if h is not None]
            row[f"{axis}_to_threshold_mean"] = statistics.fmean(reached) if reached else math.nan
        row["reached"] = sum(r.to_threshold(threshold[g.task], "step") is not None for r in rs)
        row["threshold"] = threshold[g.task]
        rows.append(row)
    return rows


def difference_sentences(cs: list[Comparison], spec: SweepSpec, metric: str) -> list[str]:
    """Plain sentences: which variants differ from the baseline beyond noise, and which cannot be told apart."""
    out = []
    method = {"holm": "Holm", "bh": "Benjamini-Hochberg"}[spec.report.correction]
    for kind in KINDS:
        family = [c for c in cs if c.kind == kind]
        if not family:
            continue
        what = "final value" if kind == "final" else "mean over training (AUC)"
        beyond = [c for c in family if c.p_adjusted < spec.report.alpha]
        within = [c for c in family if not c.p_adjusted < spec.report.alpha and not math.isnan(c.main.se)]
        untestable = [c for c in family if math.isnan(c.main.se)]
        base = family[0].baseline
        parts = []
        for c in beyond:
            d = c.main
            word = "higher" if d.estimate > 0 else "lower"
            parts.append(
                f"{c.variant} is {word} than {base} by {abs(d.estimate):.3f} ({_ci(d)}, adjusted p {_p(c.p_adjusted)})"
            )
        text = f"{what[0].upper()}{what[1:]}: " + ("; ".join(parts) + ". " if parts else "")
        alone = [c for c in within if not c.main.lo <= 0 <= c.main.hi]  # excludes 0 alone, not after adjustment
        held = [c for c in within if c not in alone]
        if held:
            text += (
                f"{', '.join(c.variant for c in held)} cannot be told apart from {base} "
                f"({'each interval holds 0' if len(held) > 1 else 'the interval holds 0'}). "
            )
        for c in alone:
            text += (
                f"{c.variant} − {base} = {_ci(c.main)} excludes 0 on its own, but not after {method}'s adjustment for "
                f"{len(family)} comparisons (adjusted p {_p(c.p_adjusted)}): suggestive, not established. "
            )
        if untestable:
            text += f"Not testable (fewer than 2 seeds): {', '.join(c.variant for c in untestable)}."
        out.append(text.strip())
    return out


def _out_dir(spec: SweepSpec, overrides: list[str], out: Path | None) -> tuple[Path, str | None]:
    """results/<name>/ unless the overrides change what ran or what the report says: then beside it, under a name
    that shows them (--out always wins). Returns (directory, the note to print when it moved)."""
    base = Path(spec.report.out) if spec.report.out else ROOT / "results" / spec.name
    if out is not None:
        return Path(out), None
    changing = [o for o in overrides if not o.startswith(RUN_ONLY_KEYS)]
    if not changing:
        return base, None
    slug = re.sub(r"[^A-Za-z0-9_.=,-]+", "_", ",".join(changing))
    if len(slug) > 60:
        slug = slug[:48] + "-" + hashlib.sha1(slug.encode()).hexdigest()[:8]
    moved = base.with_name(f"{base.name}+{slug}")
    return moved, (
        f"the sweep's committed report {base} is left as it is: these overrides change what ran or what the report "
        f"says ({' '.join(changing)}), so this report goes to {moved} (pass --out to choose)"
    )


def report(name: str, overrides: list[str] = (), *, x_axis: str | None = None, out: Path | None = None) -> Path:
    spec, cells = load_plan(name, overrides)
    sweep = Sweep(spec, cells)
    rep = spec.report
    metric, axis = rep.metric, x_axis or rep.x_axis
    if axis not in X_AXES:
        raise ConfigError(f"x-axis {axis!r}: choose one of {', '.join(X_AXES)}")
    if rep.correction not in ("holm", "bh"):
        raise ConfigError(f"report.correction {rep.correction!r}: choose holm or bh")
    if rep.interval not in ("t", "bootstrap"):
        raise ConfigError(f"report.interval {rep.interval!r}: choose t or bootstrap")
    runs, missing = collect(sweep, metric)
    if not runs:
        raise FileNotFoundError(
            f"sweep {spec.name}: no finished runs in MLflow experiment {sweep.experiment!r} at {sweep.uri}; "
            f"run it first: python -m bench sweep {name}"
        )
    out, moved = _out_dir(spec, list(overrides), out)
    if moved:
        print(f"[report] {moved}")
    out.mkdir(parents=True, exist_ok=True)
    labels = variants(cells, rep.settings)
    groups = group(runs, cells, labels)
    tasks = sorted({g.task for g in groups}, key=natural_key)
    algo_order = [str(a) for a in spec.axes.get("algorithm", [])]
    threshold = {
        t: rep.threshold
        if rep.threshold is not None
        else round(statistics.fmean(r.curve[min(r.curve)] for r in runs if r.cell.where == t) + 0.05, 3)
        for t in tasks
    }
    # rliable aggregates per task and over tasks
    agg: dict = {}
    scores = {k: {} for k in KINDS}
    for t in tasks:
        for g in (g for g in groups if g.task == t and g.runs):
            res = {k: S.aggregates({"v": np.array(g.values(k))[:, None]}, reps=rep.bootstrap_reps)["v"] for k in KINDS}
            agg[(t, g.variant)] = res
    live = [g for g in groups if g.runs]
    variants_all = sorted({g.variant for g in live})
    across = {}
    for v in variants_all:
        gs = {g.task: g for g in live if g.variant == v}
        if len(gs) == len(tasks):
            n = min(len(g.runs) for g in gs.values())
            for k in KINDS:
                scores[k][v] = np.array([[gs[t].values(k)[i] for t in tasks] for i in range(n)])  # [runs, tasks]
    if scores["final"]:
        across = {k: S.aggregates(scores[k], reps=rep.bootstrap_reps) for k in KINDS}
    agg_by_variant = {v: {k: (across[k][v]["mean"], across[k][v]["iqm"]) for k in KINDS} for v in scores["final"]}
    agg_by_variant = {v: {k: [x[0], x[1]] for k, x in d.items()} for v, d in agg_by_variant.items()}
    pairs = {}
    names = [v for v in variants_all if v in scores["final"]]
    for i, x in enumerate(names):
        for y in names[i + 1 :]:
            point = S.probability_of_improvement(scores["final"][x], scores["final"][y], reps=rep.bootstrap_reps)
            pairs[f"{x},{y}"] = (*point, S.improvement_test(scores["final"][x], scores["final"][y]))
    for k, adj in zip(list(pairs), S.adjust([v[3] for v in pairs.values()], rep.correction), strict=True):
        pairs[k] = (*pairs[k], adj)
    rows = statistics_rows(groups, threshold, agg)
    # per task: comparisons, power, noise, fits
    comparisons, powers, noises, fitted, uid_sets, diff_curves = [], {}, [], {"tokens": {}, "samples": {}}, {}, {}
    for t in tasks:
        tg = [g for g in groups if g.task == t and g.runs]
        uids = shared_uids(tg)
        uid_sets[t] = uids
        base_name = rep.baseline or (algo_order[0] if algo_order else tg[0].variant)
        baseline = next((g for g in tg if g.variant == base_name), None)
        if baseline is None:
            avail = ", ".join(g.variant for g in tg)
            raise ConfigError(
                f"report.baseline {base_name!r} has no finished runs on {t}; variants: {avail}"
                + did_you_mean(base_name, [g.variant for g in tg])
                + " (set it with sweep.report.baseline=<variant> or in the sweep file)"
            )
        cs = compare(tg, baseline, uids, spec)
        comparisons += cs + [c for axis in BUDGETS for c in compare_budget(tg, baseline, uids, spec, axis)]
        diff_curves[t] = (baseline.variant, difference_curves(tg, baseline, uids, spec))
        powers[t] = power(t, cs, tg, uids, spec)
        noises += noise_rows(tg, uids)
        steps0 = [r.curve[min(r.curve)] for g in tg for r in g.runs]
        for ax_name in ("tokens", "samples"):
            fitted[ax_name][t] = fits(tg, ax_name, statistics.fmean(steps0), rep.fit_reps)
    _write_csvs(out, rows, runs, labels, threshold, comparisons, fitted)
    for a in X_AXES:
        plot(groups, a, metric, out / f"curves_{a}.png")
    for ax_name in ("tokens", "samples"):
        plot_fits(groups, fitted[ax_name], ax_name, metric, out / f"compute_{ax_name}.png")
    images = plot_rliable(scores, agg_by_variant, pairs, metric, out) if scores["final"] else []
    points = setting_points(groups, rows, rep.settings) if rep.settings else []
    if points:
        knob = setting_name(rep.settings[0])
        plot_settings(points, knob, metric, out / f"settings_{knob}.png")
        images.append(f"settings_{knob}.png")
        with (out / "settings.csv").open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(points[0]))
            w.writeheader()
            w.writerows(points)
    if any(curves for _, curves in diff_curves.values()):
        plot_differences(diff_curves, metric, out / "differences.png")
        images.append("differences.png")
    parent = sweep.runs(role="sweep")
    driver = float(parent[0].data.tags.get("sweep.wall_clock_s", "nan")) if parent else math.nan
    text = _summary(spec, cells, runs, groups, rows, tasks, threshold, comparisons, powers, noises, fitted, pairs,
                    across, missing, uid_sets, metric, axis, images, overrides, driver, points)  # fmt: skip
    (out / "summary.md").write_text(text)
    if parent:
        pid = parent[0].info.run_id
        files = ["summary.csv", "comparisons.csv", "fits.csv", "runs.csv", *(f"curves_{a}.png" for a in X_AXES)]
        files += ["compute_tokens.png", "compute_samples.png", *images] + ["settings.csv"] * bool(points)
        for f in files:
            sweep.client.log_artifact(pid, str(out / f), "report")
        # MLflow's markdown viewer shows only absolute http(s) images (relative links and data: URIs are dropped), so
        # the MLflow copy links its images through the server's artifact endpoint at report.ui_url.
        ui = (rep.ui_url or (sweep.uri if sweep.uri.startswith(("http://", "https://")) else UI_URL)).rstrip("/")
        linked = re.sub(
            r"\]\(([\w.-]+\.png)\)",
            lambda m: f"]({ui}/get-artifact?path={quote('report/' + m.group(1))}&run_uuid={pid})",
            text,
        )
        sweep.client.log_text(pid, linked, "report/summary.md")
    return out / "summary.md"


def _write_csvs(out, rows, runs, labels, threshold, comparisons, fitted) -> None:
    with (out / "summary.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    with (out / "runs.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["task", "variant", "seed", "cell", "run_id", "final", "best", "auc", "steps_to_threshold",
                    "tokens_to_threshold", "completion_len", "tokens_per_s", "s_per_step", "wall_clock_s"])  # fmt: skip
        for r in runs:
            t = r.cell.where
            w.writerow([t, labels[r.cell.id], r.cell.cfg.seed, r.cell.id, r.run_id, r.final, r.best, r.auc,
                        r.to_threshold(threshold[t], "step"), r.to_threshold(threshold[t], "tokens"),
                        r.completion_len, r.tokens_per_s, r.s_per_step, r.wall_clock_s])  # fmt: skip
    with (out / "comparisons.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["task", "variant", "baseline", "kind", "estimate", "paired_lo", "paired_hi", "paired_se",
                    "paired_p", "unpaired_lo", "unpaired_hi", "unpaired_se", "unpaired_p", "p_adjusted", "narrowing",
                    "seeds", "problems", "method", "seed_var", "problem_var", "mde", "budget_lo",
                    "budget_hi"])  # fmt: skip
        for c in comparisons:
            p, u, m = c.paired, c.unpaired, c.main
            w.writerow([c.task, c.variant, c.baseline, c.kind, m.estimate,
                        p.lo if p else "", p.hi if p else "", p.se if p else "", p.p if p else "",
                        u.lo, u.hi, u.se, u.p, c.p_adjusted, c.narrowing, m.seeds[0], m.problems,
                        m.method, m.seed_var, m.problem_var, m.mde() if not math.isnan(m.se) else "",
                        *(c.budget or ("", ""))])  # fmt: skip
    with (out / "fits.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["axis", "task", "variant", "A", "A_lo", "A_hi", "B", "B_lo", "B_hi", "C_mid", "C_mid_lo",
                    "C_mid_hi", "R0", "determined", "reason", "points"])  # fmt: skip
        for ax_name, per_task in fitted.items():
            for t, per_variant in per_task.items():
                for v, fit in per_variant.items():
                    if fit is None:
                        continue
                    lo_hi = [x for k in ("A", "B", "C_mid") for x in fit.ci.get(k, (math.nan, math.nan))]
                    w.writerow([ax_name, t, v, fit.A, *lo_hi[0:2], fit.B, *lo_hi[2:4], fit.C_mid, *lo_hi[4:6], fit.R0,
                                fit.determined, fit.reason, fit.points])  # fmt: skip


def setting_points(groups: list[Group], rows: list[dict], settings: list[str]) -> list[dict]:
    """One point per (task, other settings, variant, value of the first setting axis): the final value with its 95% t
    interval and the samples to the threshold, for the setting curves (e.g. accuracy against the credit horizon).
    With more than one setting axis (staleness x sampler precision), ``panel`` holds the task and the other axes'
    values, so each combination gets its own curves instead of two points at one x under one label."""
    knob, others = settings[0], settings[1:]
    if not numeric_axis([v for g in groups for r in g.runs[:1] for v in [r.cell.axes.get(knob)] if v is not None]):
        return []  # a categorical setting (trainer.precision): sections of their own, no curve against it
    by_key = {(r["task"], r["variant"]): r for r in rows}
    out = []
    for g in groups:
        if not g.runs or knob not in g.runs[0].cell.axes:
            continue
        c, r = g.runs[0].cell, by_key[(g.task, g.variant)]
        panel = c.cfg.task.name + "".join(f" {setting_name(k)}={c.axes[k]}" for k in others if k in c.axes)
        out.append({"task": c.cfg.task.name, "panel": panel, "variant": g.variant, "x": float(c.axes[knob]),
                    "seeds": r["seeds"], "final": r["final_mean"], "final_ci95": r["final_ci95"], "auc": r["auc_mean"],
                    "auc_ci95": r["auc_ci95"], "samples_to_threshold": r["samples_to_threshold_mean"],
                    "reached": r["reached"], "threshold": r["threshold"]})  # fmt: skip
    return sorted(out, key=lambda p: (p["panel"], p["variant"], p["x"]))


def _setting_lines(points: list[dict], knob: str, metric: str) -> list[str]:
    """The setting curves as tables: per task, variants down, the knob's values across."""
    lines = [f"## Against {knob}", "", f"Final held-out {metric}, mean over seeds [95% t interval], and in brackets "
             "the mean samples until the threshold (n/N seeds that reached it). Each setting's own section below "
             "compares the variants with the baseline, paired by seed; the picture is "
             f"[settings_{knob}.png](settings_{knob}.png).", ""]  # fmt: skip
    for task in sorted({p["panel"] for p in points}):
        mine = [p for p in points if p["panel"] == task]
        xs = sorted({p["x"] for p in mine})
        thr = mine[0]["threshold"]
        head = " | ".join(f"{knob}={x:g}" for x in xs)
        lines += [f"**{task}** (threshold {thr:g})", "", f"| variant | {head} |", "|---|" + "---:|" * len(xs)]
        for v in sorted({p["variant"] for p in mine}):
            at = {p["x"]: p for p in mine if p["variant"] == v}
            cells_ = []
            for x in xs:
                p = at.get(x)
                if p is None:
                    cells_.append("–")
                    continue
                lo, hi = p["final"] - p["final_ci95"], p["final"] + p["final_ci95"]
                ci = "" if math.isnan(p["final_ci95"]) else f" [{lo:.2f}, {hi:.2f}]"
                sam = _big(p["samples_to_threshold"])
                cells_.append(f"{p['final']:.3f}{ci} ({sam}, {p['reached']}/{p['seeds']})")
            lines.append(f"| {v} | " + " | ".join(cells_) + " |")
        lines.append("")
    lines += [f"![final value and samples to threshold against {knob}](settings_{knob}.png)", ""]
    return lines


def _summary(spec, cells, runs, groups, rows, tasks, threshold, comparisons, powers, noises, fitted, pairs, across,
             missing, uid_sets, metric, axis, images, overrides, driver, points=()) -> str:  # fmt: skip
    rep = spec.report
    method = {"holm": "Holm", "bh": "Benjamini-Hochberg"}[rep.correction]
    baseline_of = {c.task: c.baseline for c in comparisons}
    lines = [f"# Sweep `{spec.name}`", "",
             "Headline differences are at equal training steps (the same optimizer steps for every variant); each "
             "task's \"at equal budget\" table compares the same variants at equal samples seen and at equal tokens "
             "generated, and names any variant that wins per step but not per sample.", ""]  # fmt: skip
    for t in tasks:
        gains = [statistics.fmean(r.final - r.curve[min(r.curve)] for r in g.runs) for g in groups
                 if g.task == t and g.runs]  # fmt: skip
        gain = statistics.median(gains) if gains else math.nan
        lines += [power_sentence(powers[t], baseline_of.get(t, ""), metric, spec, gain), ""]
    lines += ["## What ran", ""]
    if spec.description.strip():
        lines += [f"Purpose (sweep file): {spec.description.strip()}", ""]
    for t in tasks:
        tc = [c for c in cells if c.where == t]
        lines += [f"- **{t}** (from the cells' resolved configs): {what_ran(tc, uid_sets[t])}"]
    changing = [o for o in overrides if not o.startswith(RUN_ONLY_KEYS)]
    if changing:
        lines += [f"- Command-line overrides of the sweep file: `{' '.join(changing)}`."]
    commits = ", ".join(sorted({r.commit[:12] for r in runs}))
    again = f"python -m bench sweep {spec.name}" + "".join(f" {o}" for o in changing)
    lines += [
        f"- Reproduce: `{again}` (runs the missing cells, then this report); `python -m bench report {spec.name}` "
        f"rewrites the report from MLflow. Cells trained at git commit {commits}; report written at "
        f"{git_commit()[:12]}."
    ]
    wall = sum(r.wall_clock_s for r in runs)
    lines += [
        f"- {len(runs)} of {len(cells)} cells finished (MLflow experiment `sweep-{spec.name}`); sum of the cells' "
        f"wall-clock {wall / 60:.1f} min (process start-up included); the sweep driver ran {driver / 60:.1f} min over "
        "all its invocations (warm starts included; one killed outright counts up to its last finished cell).",
        "",
        "**How to read this report.** Final and AUC (the mean held-out value over training, a trapezoid) are means "
        "over seeds with 95% Student-t intervals; IQM is the interquartile mean with rliable's stratified-bootstrap "
        "interval. Differences to the baseline pair each seed with the same seed of the baseline (the same SFT warm "
        "start and prompt stream) and the problems with the same problems; the interval is Student t on a variance "
        "with a seed part and a problem part (bench/stats.py; it covers 94-97% at 3-5 seeds in simulation, "
        f"where the percentile bootstrap covers 87-93%). p-values are {method}-adjusted within one family: the "
        "comparisons with the baseline in one task (or setting) and one metric, the final value and the AUC being "
        'two families. "Cannot be told apart" means the interval holds 0: a difference may exist, smaller than the '
        "comparison's detectable one (its own column in the differences table).",
        "",
    ]
    if points:
        lines += _setting_lines(list(points), setting_name(spec.report.settings[0]), metric)
    for t in tasks:
        lines += [f"## {t}", ""]
        settings = {eval_settings(c) for c in cells if c.where == t}
        if len(settings) > 1:
            lines += [f"**Warning: the cells of {t} use {len(settings)} different evaluation settings; their "
                      "held-out numbers are not comparable.**", ""]  # fmt: skip
        lines += ["| " + " | ".join(c[1] for c in COLUMNS) + " |"]
        lines.append("|" + "|".join("---" if c[0] == "variant" else "---:" for c in COLUMNS) + "|")
        for row in sorted((r for r in rows if r["task"] == t), key=lambda r: -(r["final_mean"] or 0)):
            lines.append("| " + " | ".join(c[2](row) for c in COLUMNS) + " |")
        lines += [
            "",
            f"Threshold {threshold[t]:.3f} (steps/tokens to threshold: mean over the seeds that reached it).",
            "",
        ]
        cs = [c for c in comparisons if c.task == t]
        if cs:
            base = cs[0].baseline
            lines += [f"### Differences to {base}", ""]
            pw = f"{100 * rep.power:g}%"
            lines += [f"| variant | Δ final, paired [95% CI] | adj. p | detectable ({pw}) | unpaired [95% CI] | "
                      f"pairing narrowed | Δ AUC, paired [95% CI] | adj. p | detectable ({pw}) | unpaired [95% CI] | "
                      "pairing narrowed |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
            for v in sorted({c.variant for c in cs}):
                f_, a_ = (next(c for c in cs if c.variant == v and c.kind == k) for k in KINDS)
                nar = lambda c: "–" if math.isnan(c.narrowing) else f"{100 * c.narrowing:.0f}%"  # noqa: E731
                lines.append(f"| {v} | {_ci(f_.paired)} | {_p(f_.p_adjusted)} | {_mde(f_, rep)} | {_ci(f_.unpaired)} | "
                             f"{nar(f_)} | {_ci(a_.paired)} | {_p(a_.p_adjusted)} | {_mde(a_, rep)} | "
                             f"{_ci(a_.unpaired)} | {nar(a_)} |")  # fmt: skip
            lines += [""] + difference_sentences([c for c in cs if c.kind in KINDS], spec, metric) + [""]
            lines += budget_lines(cs, rep)
        ns = [n for n in noises if n.task == t]
        if ns:
            lines += ["### Noise: evaluation vs training", "",
                      "Seed-to-seed SD of each variant's value, split into evaluation noise and training noise (the "
                      "rest) by the two-way layout of seeds x problems: evaluation noise is the seed x problem "
                      "interaction over the number of problems. Problem difficulty is common to every seed (all answer "
                      "the same problems), so it is not part of the seed-to-seed spread; one run's SE over its "
                      "problems counts it, and is shown beside for comparison only.", "",
                      "| variant | value | seed-to-seed SD | evaluation SD | training SD | evaluation share | "
                      "one run's SE over problems |", "|---|---|---:|---:|---:|---:|---:|"]  # fmt: skip
            for n in sorted(ns, key=lambda n: (n.variant, n.kind)):
                x = n.noise
                share = "–" if math.isnan(x.eval_share) else f"{100 * min(x.eval_share, 1):.0f}%"
                lines.append(f"| {n.variant} | {n.kind} | {x.observed_sd:.4f} | {x.eval_sd:.4f} | {x.train_sd:.4f} | "
                             f"{share} | {x.within_run_se:.4f} |")  # fmt: skip
            lines.append("")
        lines += _fit_lines(t, fitted)
    if len(tasks) > 1 and across:
        lines += ["## Across tasks", "",
                  "rliable aggregates over runs x tasks (stratified bootstrap: runs resampled within each task).", "",
                  "| variant | mean final | IQM final | mean AUC | IQM AUC |", "|---|---:|---:|---:|---:|"]  # fmt: skip
        for v in sorted(across["final"]):
            cells_ = ["{:.3f} [{:.3f}, {:.3f}]".format(*across[k][v][s]) for k in KINDS for s in ("mean", "iqm")]
            lines.append(f"| {v} | {cells_[0]} | {cells_[1]} | {cells_[2]} | {cells_[3]} |")
        lines.append("")
    if pairs:
        scope = "over all tasks" if len(tasks) > 1 else f"on {tasks[0]}"
        lines += [f"## Probability of improvement ({scope}, final value)", "",
                  "P(X > Y): the chance that a run of X beats a run of Y (Mann-Whitney U / (n_X n_Y), ties count one "
                  "half), with rliable's stratified-bootstrap 95% interval, which is descriptive only: at 5 runs a "
                  "side it excludes 0.5 in about 7.5% of trials with no difference (tests/test_stats.py). A claim "
                  f"rests on the permutation test of P(X > Y) = 0.5 (exact Mann-Whitney for one task), {method}-"
                  f"adjusted over the {len(pairs)} pairs.", "",
                  "| X | Y | P(X > Y) [95% CI] | p | adj. p |", "|---|---|---:|---:|---:|"]  # fmt: skip
        for k, (p, lo, hi, pv, padj) in pairs.items():
            x, y = k.split(",")
            lines.append(f"| {x} | {y} | {p:.2f} [{lo:.2f}, {hi:.2f}] | {_p(pv)} | {_p(padj)} |")
        lines.append("")
    if missing:
        lines += ["Cells without a finished run (not in the tables): " + ", ".join(c.label for c in missing), ""]
    lines += [f"![learning curves](curves_{axis}.png)", ""]
    lines += ["Other x-axes: " + ", ".join(f"[{a}](curves_{a}.png)" for a in X_AXES if a != axis), ""]
    for img, title in (("differences.png", "paired differences to the baseline at every evaluation"),
                       ("aggregates.png", "rliable interval estimates"), ("profile.png", "performance profiles"),
                       ("improvement.png", "probability of improvement")):  # fmt: skip
        if img in images:
            lines += [f"![{title}]({img})", ""]
    lines += ["![compute-curve fits, tokens](compute_tokens.png)", "",
              "Against samples: [compute_samples.png](compute_samples.png)", ""]  # fmt: skip
    return "\n".join(lines)


def budget_lines(cs: list[Comparison], rep: ReportSpec) -> list[str]:
    """The task's comparisons at equal samples seen and equal tokens generated: a table and the per-step-only
    sentences."""
    bs = [c for c in cs if c.budget is not None]
    if not bs:
        return []
    pw = f"{100 * rep.power:g}%"
    lines = [f"### Differences to {bs[0].baseline} at equal budget", "",
             "Each run's curve interpolated on the budget axis (linearly between its evaluations, per problem); the "
             "final value is compared at the largest budget every run of the pair reaches, the AUC over the budget "
             "range they all cover; paired by seed and problem, the same intervals, adjustment (per axis and metric) "
             "and detectable difference as at equal steps.", "",
             f"| variant | axis | compared at | Δ final, paired [95% CI] | adj. p | detectable ({pw}) | AUC over | "
             f"Δ AUC, paired [95% CI] | adj. p | detectable ({pw}) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for v in sorted({c.variant for c in bs}):
        for axis in BUDGETS:
            f_ = next((c for c in bs if c.variant == v and c.kind == f"final@{axis}"), None)
            a_ = next((c for c in bs if c.variant == v and c.kind == f"auc@{axis}"), None)
            if f_ is None or a_ is None:
                continue
            lo, hi = f_.budget
            f_cells = f"{_big(hi)} | {_ci(f_.paired)} | {_p(f_.p_adjusted)} | {_mde(f_, rep)}"
            a_cells = f"{_big(lo)}-{_big(hi)} | {_ci(a_.paired)} | {_p(a_.p_adjusted)} | {_mde(a_, rep)}"
            lines.append(f"| {v} | {axis} | {f_cells} | {a_cells} |")
    lines.append("")
    named = per_step_not_per_budget(cs, rep.alpha)
    if named:
        lines += named + [""]
    else:
        ahead = any(c.kind in KINDS and c.p_adjusted < rep.alpha and c.main.estimate > 0 for c in cs)
        lines += [("Every variant ahead at equal steps is ahead at equal samples and tokens too." if ahead else
                   "No variant is ahead of the baseline at equal steps, so none wins per step only."), ""]  # fmt: skip
    return lines


def _fit_lines(t: str, fitted: dict) -> list[str]:
    lines = ["### Compute efficiency (ScaleRL sigmoid)", "",
             "R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B) fitted to every seed's evaluations against tokens generated "
             "(R0 fixed to the mean start; the start itself left out), 95% CIs from refitting on resampled seeds. A is "
             "the asymptote, B the efficiency exponent, C_mid the compute at half the gain.", "",
             "| variant | A [95% CI] | B [95% CI] | C_mid tokens [95% CI] | C_mid samples | determined |",
             "|---|---:|---:|---:|---:|---|"]  # fmt: skip
    tok, sam = fitted["tokens"].get(t, {}), fitted["samples"].get(t, {})
    for v in sorted(tok):
        f, s = tok[v], sam.get(v)
        if f is None:
            lines.append(f"| {v} | – | – | – | – | too few points |")
            continue
        ci = (
            {
                k: f" [{lo:.{d}f}, {hi:.{d}f}]"
                for (k, d), (lo, hi) in ((("A", 3), f.ci.get("A", (0, 0))), (("B", 2), f.ci.get("B", (0, 0))))
            }
            if f.ci
            else {}
        )
        cm = "" if "C_mid" not in f.ci else f" [{f.ci['C_mid'][0]:,.0f}, {f.ci['C_mid'][1]:,.0f}]"
        sm = "–" if s is None or math.isnan(s.C_mid) else f"{s.C_mid:,.0f}"
        det = "yes" if f.determined else f"**no**: {f.reason}"
        lines.append(
            f"| {v} | {f.A:.3f}{ci.get('A', '')} | {f.B:.2f}{ci.get('B', '')} | {f.C_mid:,.0f}{cm} | {sm} | {det} |"
        )
    return lines + [""]
