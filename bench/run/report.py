"""A sweep's report, read back from MLflow: ``python -m bench report <sweep>`` writes ``results/<sweep>/``:

- ``summary.md`` and ``summary.csv``: per task x variant (the sweep's axes other than task and seed), over seeds:
  final and best held-out value (mean and 95% CI, Student t), area under the eval curve (mean value over training,
  trapezoid), steps and tokens to reach a threshold, mean completion length, throughput and time per step; and a
  plain statement of which differences are within noise (Welch's t-test on the final value, alpha = 0.05).
- ``runs.csv``: the same statistics per run, with the MLflow run id they came from.
- ``curves_{step,samples,tokens}.png``: learning curves, one panel per task, mean over seeds with a min..max band.
All of it is also logged as artifacts of the sweep's parent MLflow run (``report/``).
"""

from __future__ import annotations

import csv
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from bench import ROOT
from bench.config import config_hash
from bench.run.sweep import Cell, Sweep, load_plan

X_AXES = {"step": None, "samples": "eval/at_samples_seen", "tokens": "eval/at_tokens_generated"}
ALPHA = 0.05


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

    @property
    def final(self) -> float:
        return self.curve[max(self.curve)]

    @property
    def best(self) -> float:
        return max(self.curve.values())

    @property
    def auc(self) -> float:
        """Mean held-out value over training: trapezoid area under the curve / step range."""
        steps = sorted(self.curve)
        if len(steps) < 2:
            return self.curve[steps[0]]
        area = sum((b - a) * (self.curve[a] + self.curve[b]) / 2 for a, b in zip(steps, steps[1:], strict=False))
        return area / (steps[-1] - steps[0])

    def to_threshold(self, threshold: float, axis: str) -> float | None:
        """The first evaluation at which the metric reaches ``threshold``, on the given x-axis; None if never."""
        for s in sorted(self.curve):
            if self.curve[s] >= threshold:
                return float(s) if axis == "step" else self.x[axis].get(s)
        return None


@dataclass
class Group:
    task: str
    variant: str
    runs: list[RunStats] = field(default_factory=list)
    planned: int = 0


def mean_ci(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% confidence interval (Student t, n − 1 dof); nan half-width for n < 2."""
    from scipy import stats

    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return math.nan, math.nan
    m = statistics.fmean(vals)
    if len(vals) < 2:
        return m, math.nan
    return m, float(stats.t.ppf(0.975, len(vals) - 1)) * statistics.stdev(vals) / math.sqrt(len(vals))


def welch_p(a: list[float], b: list[float]) -> float:
    """Two-sided Welch t-test p-value; 1.0 for two identical constant samples, nan when undefined (n < 2)."""
    from scipy import stats

    if len(a) < 2 or len(b) < 2:
        return math.nan
    if statistics.pvariance(a) == 0 and statistics.pvariance(b) == 0:
        return 1.0 if statistics.fmean(a) == statistics.fmean(b) else 0.0
    return float(stats.ttest_ind(a, b, equal_var=False).pvalue)


def _history(client, run_id: str, key: str) -> dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


def collect(sweep: Sweep, metric: str) -> tuple[list[RunStats], list[Cell]]:
    """The FINISHED run of every cell, with the histories the report needs; and the cells that have none."""
    finished = {}
    for r in sweep.runs(role="cell"):
        if r.info.status == "FINISHED":
            finished.setdefault(r.data.tags.get("sweep.cell"), r)
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
            )
        )
    return out, missing


def eval_settings(cell: Cell) -> str:
    """What decides a held-out number: the eval section and the task's evaluation split and size."""
    task = cell.cfg.task
    keys = ("eval_split", "num_eval", "data_root", "source", "corpus")
    return config_hash({"eval": cell.cfg.eval} | {k: task.get(k) for k in keys}) + str(cell.cfg.rollout.max_new_tokens)


def variants(cells: list[Cell]) -> dict[str, str]:
    """Cell id -> its row label: the algorithm, plus each other axis (not task or seed) whose value varies among that
    algorithm's cells (an axis held fixed for an algorithm by the excludes says nothing about it)."""

    def algo(c: Cell) -> str:
        return str(c.axes.get("algorithm", c.cfg.algorithm.name))

    varying = {
        a: [k for k in cells[0].axes if k not in ("task", "seed", "algorithm")
            and len({str(c.axes[k]) for c in cells if algo(c) == a}) > 1]
        for a in {algo(c) for c in cells}
    }  # fmt: skip
    return {c.id: " ".join([algo(c), *(f"{k.split('.')[-1]}={c.axes[k]}" for k in varying[algo(c)])]) for c in cells}


def group(runs: list[RunStats], cells: list[Cell], labels: dict[str, str]) -> list[Group]:
    groups: dict[tuple[str, str], Group] = {}
    for c in cells:
        key = (c.cfg.task.name, labels[c.id])
        groups.setdefault(key, Group(*key)).planned += 1
    for r in runs:
        groups[(r.cell.cfg.task.name, labels[r.cell.id])].runs.append(r)
    return list(groups.values())


def _fmt(m: float, ci: float, digits: int = 3) -> str:
    if math.isnan(m):
        return "–"
    return f"{m:.{digits}f}" + ("" if math.isnan(ci) else f" ± {ci:.{digits}f}")


def _big(v: float) -> str:
    return "–" if v is None or math.isnan(v) else f"{v:,.0f}"


def statistics_rows(groups: list[Group], threshold: dict[str, float]) -> list[dict]:
    rows = []
    for g in groups:
        rs = g.runs
        row = {"task": g.task, "variant": g.variant, "seeds": len(rs), "planned": g.planned}
        for name, vals in (
            ("final", [r.final for r in rs]),
            ("best", [r.best for r in rs]),
            ("auc", [r.auc for r in rs]),
            ("completion_len", [r.completion_len for r in rs]),
            ("tokens_per_s", [r.tokens_per_s for r in rs]),
            ("s_per_step", [r.s_per_step for r in rs]),
        ):
            row[f"{name}_mean"], row[f"{name}_ci95"] = mean_ci(vals)
        for axis in ("step", "tokens"):
            reached = [h for h in (r.to_threshold(threshold[g.task], axis) for r in rs) if h is not None]
            row[f"{axis}_to_threshold_mean"] = statistics.fmean(reached) if reached else math.nan
        row["reached"] = sum(r.to_threshold(threshold[g.task], "step") is not None for r in rs)
        row["threshold"] = threshold[g.task]
        rows.append(row)
    return rows


def noise_statement(task: str, groups: list[Group]) -> str:
    """Which differences in the final value are within noise, against the best variant of the task."""
    gs = sorted(
        (g for g in groups if g.task == task and g.runs), key=lambda g: -statistics.fmean(r.final for r in g.runs)
    )
    if len(gs) < 2:
        return ""
    best = gs[0]
    b = [r.final for r in best.runs]
    within, below, unknown = [], [], []
    for g in gs[1:]:
        p = welch_p(b, [r.final for r in g.runs])
        if math.isnan(p):
            unknown.append(g.variant)
        elif p >= ALPHA:
            within.append(f"{g.variant} (p = {p:.2f})")
        else:
            below.append(f"{g.variant} (p = {p:.3f})")
    text = f"**{task}**: highest mean final value: {best.variant} ({statistics.fmean(b):.3f}, {len(b)} seeds). "
    if within:
        text += f"Its difference to {', '.join(within)} is **within noise** (Welch t-test, p ≥ {ALPHA}). "
    if below:
        text += f"Lower beyond noise (p < {ALPHA}): {', '.join(below)}. "
    if unknown:
        text += f"Not testable (fewer than 2 seeds): {', '.join(unknown)}. "
    if within and not below:
        text += "No variant is distinguishable from the best at this number of seeds."
    return text


def plot(groups: list[Group], axis: str, metric: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({g.task for g in groups if g.runs})
    fig, axes = plt.subplots(1, len(tasks), figsize=(7 * len(tasks), 5), squeeze=False)
    colours = plt.get_cmap("tab20").colors
    styles = ["-", "--", ":", "-."]
    for ax, task in zip(axes[0], tasks, strict=True):
        for i, g in enumerate(sorted((g for g in groups if g.task == task and g.runs), key=lambda g: g.variant)):
            steps = sorted(set.intersection(*(set(r.curve) for r in g.runs)))
            ys = [[r.curve[s] for s in steps] for r in g.runs]
            if axis == "step":
                xs = steps
            else:
                xs = [statistics.fmean(r.x[axis].get(s, math.nan) for r in g.runs) for s in steps]
            mean = [statistics.fmean(col) for col in zip(*ys, strict=True)]
            colour = colours[(2 * i) % 20 if i < 10 else (2 * i + 1) % 20]
            ax.plot(xs, mean, styles[(i // 10) % 4], color=colour, label=f"{g.variant} (n={len(g.runs)})")
            ax.fill_between(
                xs,
                [min(c) for c in zip(*ys, strict=True)],
                [max(c) for c in zip(*ys, strict=True)],
                color=colour,
                alpha=0.12,
            )
        ax.set_title(task)
        ax.set_xlabel({"step": "rollout step", "samples": "samples generated", "tokens": "tokens generated"}[axis])
        ax.set_ylabel(f"held-out {metric} (mean over seeds; band min..max)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


COLUMNS = [
    ("variant", "variant", lambda r: r["variant"]),
    ("seeds", "seeds", lambda r: f"{r['seeds']}/{r['planned']}"),
    ("final", "final (95% CI)", lambda r: _fmt(r["final_mean"], r["final_ci95"])),
    ("best", "best", lambda r: _fmt(r["best_mean"], r["best_ci95"])),
    ("auc", "AUC (mean over training)", lambda r: _fmt(r["auc_mean"], r["auc_ci95"])),
    ("steps", "steps to thr.", lambda r: f"{_big(r['step_to_threshold_mean'])} ({r['reached']}/{r['seeds']})"),
    ("tokens", "tokens to thr.", lambda r: _big(r["tokens_to_threshold_mean"])),
    ("len", "completion len", lambda r: _fmt(r["completion_len_mean"], math.nan, 1)),
    ("tps", "tokens/s", lambda r: _big(r["tokens_per_s_mean"])),
    ("sps", "s/step", lambda r: _fmt(r["s_per_step_mean"], math.nan, 2)),
]


def report(name: str, overrides: list[str] = (), *, x_axis: str | None = None, out: Path | None = None) -> Path:
    spec, cells = load_plan(name, overrides)
    sweep = Sweep(spec, cells)
    metric, axis = spec.report.metric, x_axis or spec.report.x_axis
    if axis not in X_AXES:
        raise ValueError(f"x-axis {axis!r}: choose one of {', '.join(X_AXES)}")
    runs, missing = collect(sweep, metric)
    if not runs:
        raise FileNotFoundError(
            f"sweep {spec.name}: no finished runs in MLflow experiment {sweep.experiment!r} at {sweep.uri}; "
            f"run it first: python -m bench sweep {name}"
        )
    out = Path(out or spec.report.out or ROOT / "results" / spec.name)
    out.mkdir(parents=True, exist_ok=True)
    labels = variants(cells)
    groups = group(runs, cells, labels)
    tasks = sorted({g.task for g in groups})
    threshold = {
        t: spec.report.threshold
        if spec.report.threshold is not None
        else round(statistics.fmean(r.curve[min(r.curve)] for r in runs if r.cell.cfg.task.name == t) + 0.05, 3)
        for t in tasks
    }
    rows = statistics_rows(groups, threshold)
    with (out / "summary.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    with (out / "runs.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["task", "variant", "seed", "cell", "run_id", "final", "best", "auc", "steps_to_threshold",
                    "tokens_to_threshold", "completion_len", "tokens_per_s", "s_per_step", "wall_clock_s"])  # fmt: skip
        for r in runs:
            t = r.cell.cfg.task.name
            w.writerow([t, labels[r.cell.id], r.cell.cfg.seed, r.cell.id, r.run_id, r.final, r.best, r.auc,
                        r.to_threshold(threshold[t], "step"), r.to_threshold(threshold[t], "tokens"),
                        r.completion_len, r.tokens_per_s, r.s_per_step, r.wall_clock_s])  # fmt: skip
    for a in X_AXES:
        plot(groups, a, metric, out / f"curves_{a}.png")
    wall = sum(r.wall_clock_s for r in runs)
    parent = sweep.runs(role="sweep")
    driver = float(parent[0].data.tags.get("sweep.wall_clock_s", "nan")) if parent else math.nan
    lines = [
        f"# Sweep `{spec.name}`",
        "",
        spec.description.strip(),
        "",
        f"Held-out metric: `{metric}` on each task's fixed evaluation set (greedy, the same settings for every cell). "
        f"{len(runs)} of {len(cells)} cells finished; MLflow experiment `{sweep.experiment}`. "
        f"Sweep wall-clock {driver / 60:.1f} min (sum over cells {wall / 60:.1f} min, process start-up included). "
        "Mean ± 95% CI over seeds (Student t). "
        f"AUC is the mean held-out value over training. Thresholds: "
        + ", ".join(f"{t} {v:.3f}" for t, v in threshold.items())
        + " (steps/tokens to threshold: mean over the seeds that reached it, reached/seeds).",
        "",
    ]
    for t in tasks:
        lines += [f"## {t}", ""]
        settings = {eval_settings(c) for c in cells if c.cfg.task.name == t}
        if len(settings) > 1:
            lines += [f"**Warning: the cells of {t} use {len(settings)} different evaluation settings; their "
                      "held-out numbers are not comparable.**", ""]  # fmt: skip
        lines += ["| " + " | ".join(c[1] for c in COLUMNS) + " |"]
        lines.append("|" + "|".join("---" if c[0] == "variant" else "---:" for c in COLUMNS) + "|")
        for row in sorted((r for r in rows if r["task"] == t), key=lambda r: -(r["final_mean"] or 0)):
            lines.append("| " + " | ".join(c[2](row) for c in COLUMNS) + " |")
        lines += ["", noise_statement(t, groups), ""]
    if missing:
        lines += ["Cells without a finished run (not in the table): " + ", ".join(c.label for c in missing), ""]
    lines += [f"![learning curves]({f'curves_{axis}.png'})", ""]
    lines += ["Other x-axes: " + ", ".join(f"[{a}](curves_{a}.png)" for a in X_AXES if a != axis), ""]
    (out / "summary.md").write_text("\n".join(lines))
    if parent:
        for f in ("summary.md", "summary.csv", "runs.csv", *(f"curves_{a}.png" for a in X_AXES)):
            sweep.client.log_artifact(parent[0].info.run_id, str(out / f), "report")
    return out / "summary.md"
