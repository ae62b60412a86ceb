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

The parts, each readable on its own: ``data`` (runs read back from MLflow, grouped), ``compare`` (differences at
equal steps, power, noise, fits), ``budget`` (differences at equal samples and tokens), ``sentences`` (the plain
sentences and number formats), ``tables`` (rows and CSV files), ``summary`` (summary.md); figures are
bench/run/plots.py. This module runs them in order (``report``).
"""

from __future__ import annotations

import csv
import hashlib
import math
import re
import statistics
from pathlib import Path
from urllib.parse import quote

import numpy as np

from bench import ROOT
from bench import stats as S
from bench.config import ConfigError
from bench.registry import did_you_mean
from bench.run.plots import natural_key, plot, plot_differences, plot_fits, plot_rliable, plot_settings
from bench.run.report.budget import BUDGETS, compare_budget
from bench.run.report.compare import compare, difference_curves, fits, noise_rows, power, shared_uids
from bench.run.report.data import KINDS, RUN_ONLY_KEYS, X_AXES, collect, group
from bench.run.report.summary import _summary
from bench.run.report.tables import _write_csvs, setting_points, statistics_rows
from bench.run.sweep import (
    Sweep,
    SweepSpec,
    load_plan,
    setting_name,
    variants,  # noqa: F401 (re-exported: the report's row labels)
)

UI_URL = "http://127.0.0.1:5000"  # where `make ui` serves the embedded store


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
    runs, missing = collect(sweep, metric, rep.until_step)
    joined = []  # (sweep, runs, variants) for the summary
    where_, own = {c.where for c in cells}, {c.id for c in cells}
    for other in rep.join:  # finished cells of other sweeps on this sweep's tasks, as further variants
        spec_j, cells_j = load_plan(other, [o for o in overrides if o.startswith(RUN_ONLY_KEYS)])
        cells_j = [c for c in cells_j if c.where in where_ and c.id not in own]
        if not cells_j:
            raise ConfigError(f"report.join: sweep {other!r} has no cells on this sweep's tasks {sorted(where_)}")
        found, _ = collect(Sweep(spec_j, cells_j, uri=sweep.uri), metric, rep.until_step)
        if not found:
            raise ConfigError(
                f"report.join: sweep {other!r} has no finished runs on {sorted(where_)} in {sweep.uri}; run it there "
                f"first (python -m bench sweep {other}) or point tracking.tracking_uri at the store that holds it"
            )
        runs += found
        cells = cells + [r.cell for r in found]
        joined.append((other, len(found), sorted({str(r.cell.axes.get("algorithm")) for r in found})))
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
    # A setting with no finished run yet (a sweep part-way through) is left out; its cells are listed as missing.
    tasks = sorted({g.task for g in groups if g.runs}, key=natural_key)
    groups = [g for g in groups if g.task in tasks]
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
                    across, missing, uid_sets, metric, axis, images, overrides, driver, points, joined)  # fmt: skip
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
