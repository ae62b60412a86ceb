"""The noise budget behind each task's default evaluation size: what an evaluation costs and how noisy it is.

    python scripts/eval_noise.py [--sizes 200 500 1000] [--k 4 8] [--reps 3] [--out results/eval_noise.md]

Countdown on the tiny model, from the cached seed-0 SFT warm start (trained first if absent): for each evaluation size
M the wall-clock of one greedy evaluation (median of ``--reps``) and of a sampled one (k completions per problem),
the accuracy and its standard error. For each task with data under the data root: the cost of scoring its whole
evaluation set (the gold answers, so the reward's own cost) and the binomial SE at its default size and at the full
split. Run on an idle machine: the timings are the point.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import ROOT  # noqa: E402
from bench.config import compose  # noqa: E402
from bench.engine.policy import load_policy  # noqa: E402
from bench.registry import ALGORITHMS, TASKS  # noqa: E402
from bench.run.train import ensure_sft  # noqa: E402
from bench.stats import binomial_se  # noqa: E402
from bench.tracking import git_commit  # noqa: E402


def countdown_rows(sizes: list[int], ks: list[int], reps: int) -> list[tuple]:
    base = ["algorithm=grpo", "task=countdown", "init=sft", "trainer.progress_bar=false", "eval.batch_size=256"]
    warm = ensure_sft(compose(base))
    rows = []
    for M in sizes:
        for k in [0, *ks]:
            cfg = compose([*base, f"task.num_eval={M}", f"eval.samples_per_problem={k}"])
            obj = OmegaConf.to_object(cfg)
            policy, tok = load_policy(obj.model, obj.seed, warm, ROOT / obj.cache_dir)
            task = TASKS.get("countdown")(obj.task, tok, seed=obj.seed)
            module = ALGORITHMS.get("grpo")(obj, policy, tok, task)
            task.eval_examples()
            times, m = [], None
            for _ in range(reps):
                t0 = time.perf_counter()
                m = module.evaluate()
                times.append(time.perf_counter() - t0)
            acc = m["eval/accuracy"]
            sampled = (m[f"eval/mean@{k}"], m[f"eval/mean@{k}_se"]) if k else (None, None)
            rows.append((M, k, statistics.median(times), acc, binomial_se(acc, M), *sampled))
            print(rows[-1], flush=True)
    return rows


def scoring_rows() -> list[tuple]:
    """Per data task: the default and full evaluation sizes and the time to score the gold answers of the full set."""
    rows = []
    for name in ("gsm8k", "math", "text_to_sql", "summarization"):
        try:
            cfg = compose(["algorithm=grpo", f"task={name}"])
            task = TASKS.get(name)(OmegaConf.to_object(cfg).task)
            full = task.load_split(task.cfg.eval_split)
        except FileNotFoundError as e:
            print(f"{name}: skipped ({e})")
            continue
        t0 = time.perf_counter()
        scored = [task.reward(e, task.gold_completion(e) or "") for e in full]
        dt = time.perf_counter() - t0
        rows.append(
            (name, cfg.task.num_eval, len(full), dt / len(full) * 1000, sum(r.score for r in scored) / len(full))
        )
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[200, 500, 1000])
    ap.add_argument("--k", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "eval_noise.md")
    ns = ap.parse_args()
    cd = countdown_rows(ns.sizes, ns.k, ns.reps)
    sc = scoring_rows()
    lines = [
        "# Evaluation cost and noise",
        "",
        f"`python scripts/eval_noise.py --sizes {' '.join(map(str, ns.sizes))} --k {' '.join(map(str, ns.k))} "
        f"--reps {ns.reps}`",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; git commit {git_commit()[:12]}.",
        "",
        "## Countdown, tiny model, seed-0 SFT warm start (eval.batch_size=256)",
        "",
        "One evaluation: greedy pass@1 on the first M test problems, plus k samples per problem at temperature 1.0 "
        "when k > 0 (wall-clock: the median of the repetitions, greedy and sampled together).",
        "",
        "| M problems | k samples | s per evaluation | greedy accuracy | binomial SE | mean@k | SE of mean@k |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for M, k, t, acc, se, mk, mk_se in cd:
        extra = f"{mk:.3f} | {mk_se:.4f}" if k else "– | –"
        lines.append(f"| {M} | {k} | {t:.2f} | {acc:.3f} | {se:.4f} | {extra} |")
    if sc:
        lines += [
            "",
            "## Data tasks: reward cost and evaluation size",
            "",
            "Scoring the gold answer of every problem of the evaluation split (the reward's own cost, without "
            "generation); SE at p = 0.3 for the default size and for the full split.",
            "",
            "| task | default num_eval | full split | ms per reward | gold score | SE at default | SE at full |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name, n, full, ms, gold in sc:
            n = min(n, full)
            lines.append(
                f"| {name} | {n} | {full} | {ms:.1f} | {gold:.3f} | {binomial_se(0.3, n):.4f} | "
                f"{binomial_se(0.3, full):.4f} |"
            )
    ns.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
