"""Benchmark (not a test): greedy zero-shot held-out accuracy of a model on fixed task subsets, and its generation
speed, through the harness's own evaluation path (chat template, extraction, verification).

    python scripts/zero_shot.py                                  # smollm2-135m on 100 GSM8K test + 50 MATH-500
    python scripts/zero_shot.py --model smollm2-135m --task gsm8k=100 --task math=50 -- eval.max_new_tokens=384
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from bench import ROOT
from bench.config import compose
from bench.engine.policy import load_policy
from bench.registry import TASKS
from bench.rl.module import PolicyModule


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--task", action="append", default=None, help="name=N examples (first N of the eval split)")
    parser.add_argument("--out", default=None)
    parser.add_argument("overrides", nargs="*")
    ns = parser.parse_args()
    specs = ns.task or ["gsm8k=100", "math=50"]
    rows = []
    for spec in specs:
        name, n = spec.split("=")
        cfg = compose(
            [
                f"model={ns.model}",
                f"task={name}",
                "algorithm=grpo",
                f"task.num_eval={n}",
                "eval.batch_size=16",
                *ns.overrides,
            ]
        )
        obj = OmegaConf.to_object(cfg)
        policy, tok = load_policy(obj.model, obj.seed, cache_dir=ROOT / obj.cache_dir)
        policy.eval()
        task = TASKS.get(name)(obj.task, tok, seed=obj.seed)
        module = PolicyModule(obj, policy, tok, task)
        t0 = time.perf_counter()
        metrics = module.evaluate()
        dt = time.perf_counter() - t0
        tokens = metrics["eval/completion_len_mean"] * len(task.eval_examples())
        rows.append((name, len(task.eval_examples()), metrics, tokens / dt, dt))
        print(name, {k: round(v, 4) for k, v in metrics.items()}, f"{tokens / dt:.0f} tok/s")
    lines = [
        "| task | examples | greedy accuracy | components | completion tokens/s | wall-clock (s) |",
        "|---|---:|---:|---|---:|---:|",
    ]
    for name, n, m, tps, dt in rows:
        comps = ", ".join(
            f"{k.split('/', 1)[1]} {v:.3f}" for k, v in m.items() if k not in ("eval/accuracy", "eval/reward_mean")
        )
        lines.append(f"| {name} | {n} | {m['eval/accuracy']:.3f} | {comps} | {tps:.0f} | {dt:.0f} |")
    command = " ".join(["python scripts/zero_shot.py", *(f"--task {s}" for s in specs), *ns.overrides])
    text = (
        f"# Zero-shot greedy accuracy: {ns.model}\n\n`{command}`\n\nMachine: {platform.machine()}, "
        f"{os.cpu_count()} CPU cores, torch {torch.__version__}, {torch.get_num_threads()} threads; batch 16, "
        "greedy, KV cache. Subsets are the first N examples of each task's fixed evaluation split.\n\n"
        + "\n".join(lines)
        + "\n"
    )
    out = Path(ns.out or ROOT / "results" / f"zero_shot_{ns.model}.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
