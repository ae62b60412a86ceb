"""The report's pictures: learning curves, compute-curve fits over the data, and rliable's interval estimates,
performance profiles and probability of improvement. Each function writes one PNG."""

from __future__ import annotations

import math
import re
import statistics
from pathlib import Path

import numpy as np

from bench import stats as S

KINDS = ("final", "auc")


def kind_of(metric: str) -> str:
    """How an axis names a metric: held-out for the evaluation's (eval/...), training for a rollout's (reward/...)."""
    return "held-out" if metric.startswith("eval") else "training"


def natural_key(text: str) -> list:
    """Sort key that orders numbers by value: "chain horizon=2" before "chain horizon=16"."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text)]


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _style(i: int):
    plt = _plt()
    colours = plt.get_cmap("tab20").colors
    return colours[(2 * i) % 20 if i < 10 else (2 * i + 1) % 20], ["-", "--", ":", "-."][(i // 10) % 4]


def _panels(n: int, width: float = 7, height: float = 5, per_row: int = 4):
    """A figure of n panels, at most ``per_row`` per row (a sweep with many settings wraps instead of growing wide)."""
    plt = _plt()
    cols = min(n, per_row)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _legend(ax, fontsize: int = 7, ncol: int = 2, **kw) -> None:
    """The panel's legend: inside the axes while its labels are short; to their right, one label per line, when a
    label is long (a sweep with several config axes), so that it neither covers the curves nor runs off the figure."""
    handles, labels = kw.pop("handles", None), kw.pop("labels", None)
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    outside = max((len(t) for t in labels), default=0) > 40
    if outside:
        kw |= {"loc": "upper left", "bbox_to_anchor": (1.02, 1.0), "ncol": 1, "borderaxespad": 0.0}
    else:
        kw.setdefault("ncol", ncol)
    ax.legend(handles, labels, fontsize=fontsize, **kw).beside = outside  # _save widens the figure for it


def _save(fig, path: Path) -> None:
    """tight_layout and write; a figure with legends beside its axes first grows by the widest row's legends, so
    that the axes keep their size."""
    beside = [ax.get_legend() for ax in fig.axes if getattr(ax.get_legend(), "beside", False)]
    if beside:
        fig.canvas.draw()
        rows: dict[float, float] = {}
        for lg in beside:
            row = round(lg.axes.get_position().y0, 3)
            rows[row] = rows.get(row, 0.0) + lg.get_window_extent().width / fig.dpi + 0.3
        w, h = fig.get_size_inches()
        fig.set_size_inches(w + max(rows.values()), h)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # tight: a legend beside the axes is kept, not cropped
    _plt().close(fig)


def plot(groups: list, axis: str, metric: str, path: Path) -> None:
    tasks = sorted({g.task for g in groups if g.runs}, key=natural_key)
    fig, axes = _panels(len(tasks))
    for ax, task in zip(axes, tasks, strict=True):
        for i, g in enumerate(sorted((g for g in groups if g.task == task and g.runs), key=lambda g: g.variant)):
            steps = sorted(set.intersection(*(set(r.curve) for r in g.runs)))
            ys = [[r.curve[s] for s in steps] for r in g.runs]
            if axis == "step":
                xs = steps
            else:
                xs = [statistics.fmean(r.x[axis].get(s, math.nan) for r in g.runs) for s in steps]
            mean = [statistics.fmean(col) for col in zip(*ys, strict=True)]
            colour, style = _style(i)
            ax.plot(xs, mean, style, color=colour, label=f"{g.variant} (n={len(g.runs)})")
            lo, hi = [min(c) for c in zip(*ys, strict=True)], [max(c) for c in zip(*ys, strict=True)]
            ax.fill_between(xs, lo, hi, color=colour, alpha=0.12)
        ax.set_title(task)
        ax.set_xlabel({"step": "rollout step", "samples": "samples generated", "tokens": "tokens generated"}[axis])
        ax.set_ylabel(f"{kind_of(metric)} {metric} (mean over seeds; band min..max)")
        ax.grid(alpha=0.3)
        _legend(ax)
    _save(fig, path)


def plot_fits(groups: list, fitted: dict[str, dict], axis: str, metric: str, path: Path) -> None:
    """Each seed's evaluations and the fitted sigmoid per variant, compute on a log axis (as ScaleRL draws them; the
    start at C = 0 is the dashed line R0)."""
    tasks = sorted({g.task for g in groups if g.runs}, key=natural_key)
    fig, axes = _panels(len(tasks))
    for ax, task in zip(axes, tasks, strict=True):
        r0 = None
        for i, g in enumerate(sorted((g for g in groups if g.task == task and g.runs), key=lambda g: g.variant)):
            colour, style = _style(i)
            for r in g.runs:
                pts = [(r.x[axis].get(s), r.curve[s]) for s in sorted(r.curve) if (r.x[axis].get(s) or 0) > 0]
                if pts:
                    ax.scatter(*zip(*pts, strict=True), s=8, color=colour, alpha=0.4)
            f = fitted[task].get(g.variant)
            label = g.variant
            if f is not None and math.isfinite(f.A):
                cmax = max(max(r.x[axis].values()) for r in g.runs)
                cs = np.geomspace(cmax / 50, cmax * 3, 200)
                ax.plot(cs, S.sigmoid(cs, f.A, f.B, f.C_mid, f.R0), style, color=colour)
                label += f" (A={f.A:.2f}, B={f.B:.2f}{'' if f.determined else ', not determined'})"
                r0 = f.R0
            ax.plot([], [], style, color=colour, label=label)
        if r0 is not None:
            ax.axhline(r0, color="grey", linestyle="--", linewidth=0.8, label=f"R0 (start) {r0:.3f}")
        ax.set_xscale("log")
        ax.set_title(f"{task}: R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B)")
        ax.set_xlabel({"samples": "samples generated", "tokens": "tokens generated"}[axis] + " (log scale)")
        ax.set_ylabel(f"{kind_of(metric)} {metric} (each dot one seed's evaluation)")
        ax.grid(alpha=0.3, which="both")
        _legend(ax, ncol=1)
    _save(fig, path)


def plot_rliable(scores: dict[str, dict[str, np.ndarray]], agg: dict, pairs: dict, metric: str, out: Path) -> list[str]:
    """rliable's interval-estimate, performance-profile and probability-of-improvement plots (over all tasks)."""
    from rliable import library as rly
    from rliable import plot_utils

    plt = _plt()
    written = []
    algos = sorted(agg)
    if not algos:
        return written
    # metrics in the order mean final, mean AUC, IQM final, IQM AUC; agg[a][kind] = [(mean, lo, hi), (iqm, lo, hi)]
    order = [(j, k) for j in (0, 1) for k in KINDS]
    point = {a: np.array([agg[a][k][j][0] for j, k in order]) for a in algos}
    ci = {a: np.array([[agg[a][k][j][1] for j, k in order], [agg[a][k][j][2] for j, k in order]]) for a in algos}
    names = [f"{stat} {k}" for stat in ("mean", "IQM") for k in ("final", "AUC")]
    colours = {a: _style(i)[0] for i, a in enumerate(algos)}  # each algorithm the colour of its learning curve
    fig, _ = plot_utils.plot_interval_estimates(
        point, ci, metric_names=names, algorithms=algos, colors=colours,
        xlabel=f"{metric} (95% stratified-bootstrap CIs)",
        xlabel_y_coordinate=-0.45 / max(len(algos), 1) ** 0.5,
    )  # fmt: skip
    fig.savefig(out / "aggregates.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    written.append("aggregates.png")
    final = {a: scores["final"][a] for a in algos}
    lo = min(float(v.min()) for v in final.values())
    hi = max(float(v.max()) for v in final.values())
    taus = np.linspace(lo - 0.01, hi + 0.01, 81)
    np.random.seed(0)
    prof, prof_ci = rly.create_performance_profile(final, taus, reps=500)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    labels = dict(xlabel=f"final {metric} (τ)", ylabel="fraction of runs with score > τ")
    plot_utils.plot_performance_profiles(prof, taus, performance_profile_cis=prof_ci, ax=ax, colors=colours, **labels)
    handles = [plt.Line2D([0], [0], color=colours[a]) for a in algos]
    _legend(ax, fontsize=8, ncol=1, handles=handles, labels=list(algos))
    _save(fig, out / "profile.png")
    written.append("profile.png")
    if pairs:
        est = {k: v[0] for k, v in pairs.items()}
        ints = {k: np.array([[v[1]], [v[2]]]) for k, v in pairs.items()}
        ax = plot_utils.plot_probability_of_improvement(est, ints, figsize=(5, 0.5 + 0.45 * len(pairs)))
        ax.figure.savefig(out / "improvement.png", dpi=110, bbox_inches="tight")
        plt.close(ax.figure)
        written.append("improvement.png")
    return written


def plot_differences(curves: dict[str, tuple[str, dict]], metric: str, path: Path) -> None:
    """Per task, each variant minus the baseline at every evaluation, paired by seed and problem, with its 95%
    interval: where the curves of `curves_step.png` overlap, this shows whether the gap is real."""
    tasks = sorted((t for t, (_, c) in curves.items() if c), key=natural_key)
    fig, axes = _panels(len(tasks))
    for ax, task in zip(axes, tasks, strict=True):
        baseline, per_variant = curves[task]
        # the baseline keeps its place in the order: each variant takes the colour it has in the other plots
        names = sorted({baseline, *per_variant})
        for variant, points in sorted(per_variant.items()):
            colour, style = _style(names.index(variant))
            steps = [s for s, _ in points]
            ax.plot(steps, [d.estimate for _, d in points], style, color=colour, label=variant)
            ax.fill_between(steps, [d.lo for _, d in points], [d.hi for _, d in points], color=colour, alpha=0.15)
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_title(f"{task}: variant − {baseline} (paired by seed and problem, 95% CI)")
        ax.set_xlabel("rollout step")
        ax.set_ylabel(f"Δ {kind_of(metric)} {metric}")
        ax.grid(alpha=0.3)
        _legend(ax, ncol=1)
    _save(fig, path)


def plot_settings(points: list[dict], knob: str, metric: str, path: Path) -> None:
    """Credit-horizon curves: per task, the final held-out value (mean over seeds, 95% t interval) and the samples
    to the threshold (mean over the seeds that reached it; the share that did beside each point) against the
    setting ``knob`` (e.g. horizon), one line per variant."""
    from matplotlib.transforms import ScaledTranslation

    # a panel is a task, with the other setting axes' values when there are several
    tasks = sorted({p["panel"] for p in points}, key=natural_key)
    fig, axes = _panels(2 * len(tasks), width=6.5, height=4.5, per_row=2)  # one row per panel
    for j, task in enumerate(tasks):
        ax_f, ax_s = axes[2 * j], axes[2 * j + 1]
        mine = [p for p in points if p["panel"] == task]
        names = sorted({p["variant"] for p in mine})
        for i, v in enumerate(names):
            colour, style = _style(i)
            ps = sorted((p for p in mine if p["variant"] == v), key=lambda p: p["x"])
            xs = [p["x"] for p in ps]
            # intervals side by side: each variant shifted a few points left or right of its x (display space)
            dodge = ScaledTranslation((i - (len(names) - 1) / 2) * 5 / 72, 0, fig.dpi_scale_trans)
            bars = ax_f.errorbar(xs, [p["final"] for p in ps], yerr=[p["final_ci95"] for p in ps], fmt="o" + style,
                                 color=colour, capsize=3, label=v)  # fmt: skip
            for artist in bars.get_children():  # shifted after autoscaling, which reads the data transform
                artist.set_transform(artist.get_transform() + dodge)
            reached = [p for p in ps if p["reached"] > 0]
            ax_s.plot([p["x"] for p in reached], [p["samples_to_threshold"] for p in reached], "o" + style,
                      color=colour, label=v)  # fmt: skip
            for p in reached:
                if p["reached"] < p["seeds"]:
                    ax_s.annotate(f"{p['reached']}/{p['seeds']}", (p["x"], p["samples_to_threshold"]), fontsize=6,
                                  color=colour, xytext=(3, 3), textcoords="offset points")  # fmt: skip
        xs = sorted({p["x"] for p in mine})
        for ax in (ax_f, ax_s):
            # a log axis for a geometric knob (K = 1, 2, 4, 8); 0 (e.g. staleness 0) sits on a linear stretch to 1
            ax.set_xscale("log", base=2) if xs[0] > 0 else ax.set_xscale("symlog", base=2, linthresh=1)
            ax.set_xticks(xs, [f"{x:g}" for x in xs])
            ax.set_xlabel(f"{knob} (log scale{'' if xs[0] > 0 else ', linear below 1'})")
            ax.grid(alpha=0.3, which="both")
            _legend(ax, ncol=1)
        thr = mine[0]["threshold"]
        ax_f.set_title(f"{task}\nfinal {kind_of(metric)} {metric} (95% CI over seeds)", fontsize=10)
        ax_f.set_ylabel(f"final {metric}")
        ax_s.set_title(f"{task}\nsamples until {metric} >= {thr:g} (n/N: seeds that got there)", fontsize=10)
        ax_s.set_ylabel("samples generated")
        ax_s.set_yscale("log")
    _save(fig, path)
