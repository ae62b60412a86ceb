"""Which change bought how much detectable difference: the minimum detectable effect (MDE) of a sweep recomputed on
its own runs under the settings it replaced, one change at a time (evaluation size, seeds, pairing, AUC vs final).

    python scripts/mde_breakdown.py default [--old-rev REV --old-gain G --old-problems M] [--out FILE]

Every row uses the same runs read back from MLflow (the sweep's finished cells and their per-problem outcomes): a
smaller evaluation is the first M problems of the same evaluations, fewer seeds the first seeds. The MDE is the
report's (bench/run/report/: per-seed SDs from the comparisons with the baseline, their median,
statsmodels' t-test power at α = 0.05, power 0.8). ``--old-rev`` adds the MDE of the report committed at that
revision (its results/<sweep>/runs.csv, read with git show; for the default sweep before 1000-problem evaluation:
cd79227), Welch on the final value as that report tested it; ``--old-gain`` is its gain over the start, which that
report did not print (for cd79227: mean final 0.424 − start 0.383 = 0.041).
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import ROOT  # noqa: E402
from bench import stats as S  # noqa: E402
from bench.run.report.compare import matrix, shared_uids  # noqa: E402
from bench.run.report.data import collect, group  # noqa: E402
from bench.run.sweep import (  # noqa: E402
    Sweep,
    load_plan,
    variants,  # noqa: E402
)


def pooled_mde(groups, baseline, seeds: list[int], uids, kind: str, paired: bool) -> tuple[float, float]:
    """(per-seed SD, MDE) of the median comparison of every other variant with the baseline: each comparison's own
    seed SD with its problem term held fixed (Difference.mde), as the report's power sentence."""
    ds = []
    for g in groups:
        if g is baseline:
            continue
        ds.append(S.difference(matrix(g, seeds, kind, uids), matrix(baseline, seeds, kind, uids), paired=paired))
    mid = sorted(ds, key=lambda d: d.mde())[(len(ds) - 1) // 2]
    return mid.seed_sd, mid.mde()


def old_mde(rev: str, sweep: str) -> tuple[float, float, int, float]:
    """(pooled SD, Welch MDE, seeds, mean final) of the runs.csv committed at ``rev``: each variant's final values,
    unpaired."""
    text = subprocess.run(
        ["git", "show", f"{rev}:results/{sweep}/runs.csv"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    rows = list(csv.DictReader(io.StringIO(text)))
    by = {}
    for r in rows:
        by.setdefault(r["variant"], []).append(float(r["final"]))
    sd = math.sqrt(statistics.fmean(statistics.variance(v) for v in by.values()))
    n = min(len(v) for v in by.values())
    return sd, S.mde(sd, n, paired=False), n, statistics.fmean(float(r["final"]) for r in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep")
    ap.add_argument("--old-rev", help="a git revision whose committed report of this sweep to compare with")
    ap.add_argument("--old-gain", type=float, help="the earlier report's gain over the start, for its ratio")
    ap.add_argument("--old-problems", type=int, help="the earlier report's evaluation size (cd79227: 200)")
    ap.add_argument("--out", type=Path)
    ns = ap.parse_args()
    spec, cells = load_plan(ns.sweep)
    sweep = Sweep(spec, cells)
    runs, _ = collect(sweep, spec.report.metric)
    labels = variants(cells)
    groups = [g for g in group(runs, cells, labels) if g.runs]
    base_name = spec.report.baseline or str(spec.axes["algorithm"][0])
    baseline = next(g for g in groups if g.variant == base_name)
    seeds = sorted(set.intersection(*(set(g.seeds) for g in groups)))
    uids = shared_uids(groups)
    start = statistics.fmean(r.curve[min(r.curve)] for r in runs)
    gain = {
        "final": statistics.fmean(r.final for r in runs) - start,
        "auc": statistics.fmean(r.auc for r in runs) - start,
    }
    ladder = [
        (
            "the old setting on these runs: 3 seeds, 200 problems, unpaired, final",
            seeds[:3],
            uids[:200],
            "final",
            False,
        ),
        ("+ 1000 evaluation problems", seeds[:3], uids, "final", False),
        (f"+ {len(seeds)} seeds", seeds, uids, "final", False),
        ("+ pairing by seed and problem", seeds, uids, "final", True),
        ("+ AUC (mean over training) instead of the final value", seeds, uids, "auc", True),
    ]
    lines = [
        f"# What bought the detectable difference: sweep `{spec.name}`",
        "",
        f"`python scripts/mde_breakdown.py {ns.sweep}"
        + (f" --old-rev {ns.old_rev} --old-gain {ns.old_gain} --old-problems {ns.old_problems}" if ns.old_rev else "")
        + "`",
        "",
        f"The same {len(runs)} runs (MLflow experiment `{sweep.experiment}`), each change applied in turn. MDE: the "
        "smallest difference a two-sided t-test detects at α = 0.05 with power 0.8 (statsmodels), from the per-seed "
        f"SD of the comparisons with {base_name} (their median). Gain: the mean over runs of the final "
        f"value (or the AUC) minus the start ({start:.3f}).",
        "",
        "| setting | seeds | problems | per-seed SD | MDE | gain / MDE |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    if ns.old_rev:
        sd, mde, n, _ = old_mde(ns.old_rev, spec.name)
        ratio = f"{ns.old_gain / mde:.2f}" if ns.old_gain else "–"
        what = f"the report committed at {ns.old_rev} (its own runs, Welch, final)"
        lines.append(f"| {what} | {n} | {ns.old_problems or '–'} | {sd:.4f} | {mde:.3f} | {ratio} |")
    previous = None
    for name, s, u, kind, paired in ladder:
        sd, mde = pooled_mde(groups, baseline, s, u, kind, paired)
        change = "" if previous is None else f" ({mde / previous:.2f}x)"
        lines.append(f"| {name} | {len(s)} | {len(u)} | {sd:.4f} | {mde:.3f}{change} | {gain[kind] / mde:.1f} |")
        previous = mde
    noise = S.noise(np.concatenate([matrix(g, seeds, "final", uids) for g in groups]))
    lines += [
        "",
        f"Gain over the start: final {gain['final']:+.3f}, AUC {gain['auc']:+.3f}. Evaluation noise of one run's final "
        f"value on {len(uids)} problems: SD {noise.eval_sd:.4f} (the seeds x problems interaction: what a finite "
        f"evaluation set adds to the seed-to-seed spread); on 200: {noise.eval_sd * math.sqrt(len(uids) / 200):.4f}. "
        f"One run's SE over its problems, which also counts their difficulty, is {noise.within_run_se:.4f}.",
        "",
    ]
    out = ns.out or ROOT / "results" / spec.name / "mde_breakdown.md"
    out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
