"""The report's comparisons at equal budget: each run's curve interpolated onto samples seen and tokens generated,
compared over the budget every seed reached, and the variants that win per step but not per sample."""

from __future__ import annotations

import numpy as np

from bench import stats as S
from bench.run.report.compare import Comparison
from bench.run.report.data import KINDS, Group, RunStats
from bench.run.report.sentences import _big, _ci, _mde, _p
from bench.run.sweep import (
    ReportSpec,
    SweepSpec,
)

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
