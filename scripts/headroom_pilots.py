"""Held-out accuracy against RL step for the headroom pilots (results/headroom/README.md, rounds five and six).

    python scripts/headroom_pilots.py      # the default groups, from the MLflow experiment pilot-headroom
    python scripts/headroom_pilots.py --group "G = 16=headroom-demo0.5-G16P8" --out /tmp/pilots.png

A group is ``label=prefix[,prefix...]``: the runs named ``<prefix>-s<seed>``. Left: every seed (thin) and the mean
over seeds (thick) per group. Right: each run's gain by its last evaluation against its SFT start.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the package, not scripts/bench.py
from bench.tracking import tracking_uri  # noqa: E402

GROUPS = [
    "demo_error_rate 0.5 (default), 200 steps=headroom-demo0.5,demo_err0.5",
    "demo_error_rate 0.6=headroom-demo0.6",
    "demo_error_rate 0.7=headroom-demo0.7,demo_err0.7",
    "G = 16 x 8 prompts=headroom-demo0.5-G16P8",
    "300 steps (adopted)=headroom-demo0.5-300steps",
]


def curves(client: MlflowClient, experiment: str, prefixes: list[str]) -> dict[int, dict[int, float]]:
    """seed -> {step: eval/accuracy} for the finished runs named <prefix>-s<seed>."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise SystemExit(f"no MLflow experiment {experiment!r} at {client.tracking_uri}: run the pilots first")
    out: dict[int, dict[int, float]] = {}
    for run in client.search_runs([exp.experiment_id], "attributes.status = 'FINISHED'", max_results=1000):
        for prefix in prefixes:
            m = re.fullmatch(re.escape(prefix) + r"-s(\d+)", run.info.run_name or "")
            if m:
                hist = client.get_metric_history(run.info.run_id, "eval/accuracy")
                out[int(m.group(1))] = {h.step: h.value for h in hist}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experiment", default="pilot-headroom")
    ap.add_argument("--group", action="append", help="label=prefix[,prefix...] (repeatable; default: rounds 5-6)")
    ap.add_argument("--out", type=Path, default=Path("results/headroom/pilots.png"))
    args = ap.parse_args()
    client = MlflowClient(tracking_uri(None))
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    for i, spec in enumerate(args.group or GROUPS):
        label, _, prefixes = spec.rpartition("=")  # a label may hold "=", a run name not
        runs = curves(client, args.experiment, prefixes.split(","))
        if not runs:
            print(f"{label}: no finished runs named {prefixes}-s<seed>; left out")
            continue
        color = f"C{i}"
        for hist in runs.values():
            steps = sorted(hist)
            ax.plot(steps, [hist[s] for s in steps], color=color, alpha=0.25, lw=0.8)
        common = sorted(set.intersection(*(set(h) for h in runs.values())))
        mean = [np.mean([h[s] for h in runs.values()]) for s in common]
        # earlier groups wider, so a group that repeats another's runs (300 steps: the 200-step runs up to step 200)
        # leaves both visible
        ax.plot(common, mean, color=color, lw=max(1.2, 3.6 - 0.6 * i), label=f"{label} ({len(runs)} seeds)")
        starts = [h[0] for h in runs.values()]
        gains = [h[max(h)] - h[0] for h in runs.values()]
        bx.scatter(starts, gains, color=color, s=28)
        print(f"{label}: {len(runs)} seeds, start {np.mean(starts):.3f}, gain {np.mean(gains):+.3f}")
    ax.set(
        xlabel="RL step",
        ylabel="held-out greedy accuracy (1000 problems)",
        title="Headroom pilots: GRPO from the SFT warm start",
    )
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    bx.axhline(0.15, color="grey", ls="--", lw=1)
    bx.text(bx.get_xlim()[0], 0.152, " the +0.15 aim", color="grey", fontsize=8, va="bottom")
    bx.set(xlabel="SFT start (step 0)", ylabel="gain by the last evaluation", title="Each run: gain against its start")
    bx.grid(alpha=0.3)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
