"""Which attention kernel should a bfloat16 sampler use on this CPU? creditbench's sampler (all rollout switches)
on SmolLM2-135M, P = 2 x G = 4, 128 new tokens, 1 thread, float32 / bfloat16 weights x SDPA / eager attention,
variants interleaved (order reversed every other round), medians over rounds.

    python scripts/probe_sampler_attention.py             # unpadded random prompts of 160 tokens (SDPA's flash kernel)
    python scripts/probe_sampler_attention.py --padded    # two prompts of 120 and 160 tokens, left-padded (masked SDPA)

This is the measurement behind `rollout.sampler_attention` (results/perf/NOTES.md); it prints a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.engine.rollout import generate  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--padded", action="store_true", help="left-pad the shorter prompt (an attention mask is passed)")
    ap.add_argument("--reps", type=int, default=3)
    ns = ap.parse_args()
    from transformers import AutoModelForCausalLM

    from bench.config import compose
    from bench.engine.policy import gguf_folder

    torch.set_num_threads(1)
    m = compose(["model=smollm2-135m", "task=gsm8k", "algorithm=grpo"]).model
    folder = gguf_folder(m.gguf_package, m.gguf_file, ROOT / ".cache")
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 1000, (2, 160), generator=gen)
    mask = torch.ones_like(ids)
    if ns.padded:
        ids[0, :40], mask[0, :40] = 0, 0
    models = {}
    for dtype in (torch.float32, torch.bfloat16):
        for attn in ("sdpa", "eager"):
            models[(str(dtype).split(".")[-1], attn)] = AutoModelForCausalLM.from_pretrained(
                folder, dtype=dtype, attn_implementation=attn
            ).eval()
    kw = dict(group_size=4, max_new_tokens=128, temperature=1.0, top_p=1.0, eos_token_id=-1, pad_token_id=0)
    kw |= dict(seeds=[1, 2], share_prompt_cache=True, compact_finished=True)
    times = {k: [] for k in models}
    for rep in range(ns.reps + 1):  # round 0 warms up
        for key in list(models) if rep % 2 == 0 else list(models)[::-1]:
            t0 = time.perf_counter()
            with torch.no_grad():
                generate(models[key], ids, mask, **kw)
            if rep:
                times[key].append(time.perf_counter() - t0)
    ref = statistics.median(times[("float32", "sdpa")])
    print(f"| weights | attention | sampling (s, median of {ns.reps}) | vs float32 SDPA |\n|---|---|---:|---:|")
    for (dtype, attn), ts in times.items():
        med = statistics.median(ts)
        print(f"| {dtype} | {attn} | {med:.2f} | {ref / med:.2f}x |")


if __name__ == "__main__":
    main()
