"""The report's summary.md, assembled from its sentences, tables and figures."""

from __future__ import annotations

import math
import statistics

from bench.run.report.budget import budget_lines
from bench.run.report.data import KINDS, RUN_ONLY_KEYS, X_AXES, eval_settings
from bench.run.report.sentences import (
    _ci,
    _fit_lines,
    _mde,
    _p,
    _setting_lines,
    difference_sentences,
    power_sentence,
    what_ran,
)
from bench.run.report.tables import COLUMNS
from bench.run.sweep import (
    setting_name,
)
from bench.tracking import git_commit


def _summary(spec, cells, runs, groups, rows, tasks, threshold, comparisons, powers, noises, fitted, pairs, across,
             missing, uid_sets, metric, axis, images, overrides, driver, points=(), joined=()) -> str:  # fmt: skip
    rep = spec.report
    method = {"holm": "Holm", "bh": "Benjamini-Hochberg"}[rep.correction]
    baseline_of = {c.task: c.baseline for c in comparisons}
    lines = [f"# Sweep `{spec.name}`", "",
             "Headline differences are at equal training steps (the same optimizer steps for every variant); each "
             "task's \"at equal budget\" table compares the same variants at equal samples seen and at equal tokens "
             "generated, and names any variant that wins per step but not per sample.", ""]  # fmt: skip
    if rep.until_step is not None:
        lines += [f"**Read up to step {rep.until_step}** (`report.until_step`): every run is cut there, so \"final\" "
                  f"is the value at the last evaluation at or before step {rep.until_step} and the AUC covers the "
                  "steps up to it; the runs went on beyond it.", ""]  # fmt: skip
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
    for other, n, names in joined:
        lines += [f"- Joined from sweep `{other}` (`report.join`: its finished cells on these tasks, paired by seed): "
                  f"{n} runs of {', '.join(names)}."]  # fmt: skip
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
        "all its invocations (warm starts included; one killed outright counts up to its last finished cell"
        + ("; invocations with other overrides, which ran other cells, count too" if changing else "")
        + ").",
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
