"""One run on 2 processes against 1 (Lightning DDP and FSDP, gloo on CPU): step time and the share of the step in
collectives.

    python scripts/bench_ddp.py [--steps 12] [--reps 2] [--out results/perf]     (make bench runs it after bench.py)

Each repetition trains GRPO on Countdown from the same config three times, with ``trainer.devices=1`` and with
``trainer.devices=2`` (Lightning's own launcher) under ``trainer.strategy=ddp`` and ``fsdp``, rotating which goes
first, and reads the per-step times back from the runs' MLflow store: time/step, time/generation, time/update and, on
2 processes, time/collectives (each rank's seconds inside bench/dist.py's gathers, sums, gradient all-reduce and FSDP's
once-a-step gathering of the whole weights for the rollout; rank 0's are logged; FSDP's per-layer gathers and
reduce-scatters inside the update's forwards and backwards are in time/update). The first steps are warm-up. Both
use the same global batch, so the ratio is the speed-up of one step. The threads per process are set so
that both runs use the same cores (1 process x T threads against 2 x T/2).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {
    "tiny": ["model=tiny", "rollout.prompts_per_step=8", "rollout.group_size=8", "rollout.max_new_tokens=64"],
}


VARIANTS = [(1, "auto"), (2, "ddp"), (2, "fsdp")]  # (processes, trainer.strategy)


def run(config: str, devices: int, strategy: str, steps: int, threads: int, store: Path, cache: Path) -> dict:
    args = [sys.executable, "-m", "bench", "train", "algorithm=grpo", "task=countdown", *CONFIGS[config],
            f"trainer.max_steps={steps}", f"trainer.eval_every={10 * steps}", "task.num_eval=8", "eval.batch_size=8",
            f"trainer.devices={devices}", f"trainer.strategy={strategy}", "trainer.accelerator=cpu",
            f"trainer.num_threads={threads // devices}",
            "trainer.progress_bar=false", f"tracking.tracking_uri=sqlite:///{store / 'mlflow.db'}",
            f"tracking.run_name=ddp-bench-{config}-{devices}-{strategy}", f"output_dir={store / 'runs'}",
            f"cache_dir={cache}"]  # fmt: skip
    p = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if p.returncode:
        raise RuntimeError(f"{devices} process(es), {strategy}, failed:\n{p.stdout[-2000:]}{p.stderr[-3000:]}")
    # the last "MLflow run" line is the RL run's (a warm start trained first prints its own before it)
    run_id = [x.split()[2].rstrip(";") for x in p.stdout.splitlines() if x.startswith("MLflow run ")][-1]
    client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    return {
        k: [m.value for m in sorted(client.get_metric_history(run_id, k), key=lambda m: m.step)]
        for k in ("time/step", "time/generation", "time/update", "time/collectives")
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", nargs="+", default=["tiny"], choices=list(CONFIGS))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "results" / "perf"))
    ns = ap.parse_args()
    threads = os.cpu_count() or 2
    rows = []
    cache = Path(tempfile.mkdtemp(prefix="bench-ddp-cache-"))  # the SFT warm start, trained once for all runs
    for config in ns.configs:
        times: dict[tuple, dict[str, list[float]]] = {v: {} for v in VARIANTS}
        for rep in range(ns.reps):
            for devices, strategy in VARIANTS[rep % 3 :] + VARIANTS[: rep % 3]:
                t0 = time.time()
                with tempfile.TemporaryDirectory() as tmp:
                    got = run(config, devices, strategy, ns.steps, threads, Path(tmp), cache)
                for k, v in got.items():
                    times[devices, strategy].setdefault(k, []).extend(v[ns.warmup :])
                print(f"[bench-ddp] {config}: {devices} process(es), {strategy}, rep {rep + 1}/{ns.reps}, "
                      f"{time.time() - t0:.0f} s", flush=True)  # fmt: skip
        med = {f"{d} {s}": {k: statistics.median(v) for k, v in t.items() if v} for (d, s), t in times.items()}
        rows.append({"config": config, "variants": med, "n_steps": len(times[VARIANTS[0]]["time/step"])})
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ddp.json").write_text(json.dumps({"threads": threads, "rows": rows}, indent=1))
    lines = [
        "# One run on 2 processes against 1 (DDP and FSDP, gloo, CPU)",
        "",
        f"`python scripts/bench_ddp.py --steps {ns.steps} --reps {ns.reps}` (part of `make bench`); {threads} cores, "
        f"the same {threads} threads in all (1 process x {threads}, 2 x {threads // 2}); GRPO on Countdown, the same "
        "global batch; medians over the measured steps of all repetitions (the first "
        f"{ns.warmup} of each run are warm-up).",
        "",
        "| config | processes | strategy | step (s) | generation (s) | update (s) | collectives (s) | "
        "collectives share | step speed-up |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        one = r["variants"]["1 auto"]
        for name, m in r["variants"].items():
            d, strategy = name.split()
            coll = m.get("time/collectives", 0.0)
            lines.append(f"| {r['config']} | {d} | {'one device' if d == '1' else strategy} | {m['time/step']:.2f} | "
                         f"{m['time/generation']:.2f} | {m['time/update']:.2f} | {coll:.3f} | "
                         f"{coll / m['time/step']:.1%} | {one['time/step'] / m['time/step']:.2f}x |")  # fmt: skip
    lines += [
        "",
        "What the ratio means here: both runs share the same cores, so 2 processes cannot be twice as fast; the "
        "speed-up is what splitting one step's sampling and update across processes buys (or costs) against "
        "one process using all its threads: sampling small batches is latency-bound and parallelises across processes "
        "better than across a small model's threads, and the collectives (the rollout gathered to every rank, the "
        "gradients summed) are the price. On N devices each rank has its own device and the ideal is N x. FSDP "
        "adds its per-layer gathers and reduce-scatters to the update (counted in the update's time, not in the "
        "collectives column) and buys memory, not speed: each rank holds half the policy's weights, gradients and "
        "optimizer state between steps (dist/fsdp_weights_per_rank), and the whole weights only while it samples.",
    ]
    (out / "ddp.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
