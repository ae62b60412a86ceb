"""The report's tables: the per-variant statistics rows, the setting points of a setting axis, and the CSV files."""

from __future__ import annotations

import csv
import math
import statistics

from bench.run.report.data import KINDS, Group, mean_ci
from bench.run.report.sentences import _big, _fmt
from bench.run.sweep import (
    numeric_axis,
    setting_name,
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
