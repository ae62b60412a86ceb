"""Where one SmolLM2-135M update micro-batch spends its time (issue 39: the update's share of the bfloat16 matmul peak).

    BENCH_THREADS=2 python scripts/profile_update.py [--precision bf16-mixed|32-true] [--rows 16] [--prompt 270]

One forward and backward of the GRPO loss's log-probs (bench.engine.policy.completion_logprobs, chunked, float32
logits) on a micro-batch shaped like `make bench`'s smollm2-sum (16 rows, DialogSum-length prompts, 64 completion
tokens), under the precision's autocast, after one warm-up; torch.profiler's table by self CPU time, grouped into
what the issue names (matmuls, attention, autocast copies, elementwise, log-softmax), written to
results/perf/bf16/update_profile_<precision>.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the package, not scripts/bench.py
from bench import ROOT  # noqa: E402
from bench.config import compose  # noqa: E402
from bench.engine.policy import completion_logprobs, load_policy  # noqa: E402

GROUPS = {
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "aten::matmul"),
    "attention": ("flash_attention", "scaled_dot_product", "_efficient_attention", "attention"),
    "autocast copies": ("aten::_to_copy", "aten::copy_", "aten::to"),
    "log-softmax / entropy": ("log_softmax", "logsumexp", "gather", "softmax"),
    "elementwise": ("aten::mul", "aten::add", "aten::silu", "aten::rsqrt", "aten::pow", "aten::mean", "aten::neg",
                    "aten::cat", "aten::sub", "aten::div", "aten::sigmoid", "aten::fill_", "aten::zero_"),
}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--precision", default="bf16-mixed", choices=["bf16-mixed", "32-true"])
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=270)
    ap.add_argument("--completion", type=int, default=64)
    ns = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    cfg = OmegaConf.to_object(compose(["model=smollm2-135m", "task=summarization"]))
    policy, tok = load_policy(cfg.model, 0, None, ROOT / cfg.cache_dir)
    policy.train()
    g = torch.Generator().manual_seed(0)
    B, P, T = ns.rows, ns.prompt, ns.completion
    prompt = torch.randint(100, 40000, (B, P), generator=g)
    comp = torch.randint(100, 40000, (B, T), generator=g)
    pm, cm = torch.ones(B, P), torch.ones(B, T)
    auto = torch.autocast("cpu", torch.bfloat16) if ns.precision == "bf16-mixed" else contextlib.nullcontext()

    def step() -> float:
        t0 = time.perf_counter()
        with auto:
            logp, _ = completion_logprobs(policy, prompt, pm, comp, cm)
        (-logp.float().mean()).backward()
        policy.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    step()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        wall = step()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    grouped: dict[str, float] = defaultdict(float)
    for e in events:
        group = next((k for k, keys in GROUPS.items() if any(x in e.key for x in keys)), "other")
        grouped[group] += e.self_cpu_time_total
    n = sum(p.numel() for p in policy.parameters())
    flops = 6 * n * B * (P + T)  # forward 2N + backward 4N per token (the tied embedding counted once)
    lines = [f"# One SmolLM2-135M update micro-batch, {ns.precision}: where the time goes", "",
             f"`BENCH_THREADS={torch.get_num_threads()} python scripts/profile_update.py --precision {ns.precision}`",
             "", f"{B} rows x ({P} prompt + {T} completion) tokens, forward + backward of the chunked log-probs; "
             f"wall {wall:.2f} s (profiled), {flops / wall / 1e9:.0f} nominal GFLOP/s.", "",
             "| group | share of self CPU time |", "|---|---:|"]  # fmt: skip
    for k, v in sorted(grouped.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {k} | {100 * v / total:.1f} % |")
    lines += ["", "Top operators by self CPU time:", "", "```",
              events.table(sort_by="self_cpu_time_total", row_limit=15), "```", ""]  # fmt: skip
    out = ROOT / "results" / "perf" / "bf16" / f"update_profile_{ns.precision}.md"
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
