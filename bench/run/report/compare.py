"""The report's comparisons at equal steps: each variant against the baseline (paired by seed, adjusted for
multiple comparisons), the power of the sweep, the noise decomposition and the compute-curve fits (estimators:
bench/stats.py)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np

from bench import stats as S
from bench.run.report.data import KINDS, Group
from bench.run.sweep import (
    SweepSpec,
)


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
