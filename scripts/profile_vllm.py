"""Where the vLLM engine's generation time goes on `make bench`'s smollm2-128 configuration (issue 31, must-show 3).

    .venv/bin/python scripts/profile_vllm.py [--config smollm2-128] [--out results/perf/vllm/profile.md]

The engine as `rollout.engine=vllm` builds it (float32, one thread as in `make bench`), the bench's first step's
prompts (P = 2 GSM8K prompts x G = 4, 128 new tokens, temperature 1), after a warm-up call:
- the call timed as it runs in a step, then the same call with 1 new token (prefill + one step's fixed costs);
- one call under torch.profiler (CPU): self time by operator, grouped into matmuls (aten::addmm/mm/linear), vLLM's
  CPU attention, sampling (softmax, sort, log-softmax, multinomial) and the rest; time outside any torch operator is
  the engine's own Python (scheduler, input preparation, output processing).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", os.environ.get("BENCH_THREADS", "1"))

GROUPS = {  # operator name fragments -> group (first match wins)
    "matmuls (linear layers, LM head)": (
        "addmm",
        "aten::mm",
        "aten::linear",
        "aten::matmul",
        "aten::bmm",
        "onednn",
        "mkldnn",
        "gemm",
    ),  # fmt: skip
    "attention (vLLM CPU kernels)": ("attention", "attn", "paged", "cpu_attn", "reshape_and_cache"),
    "sampling (softmax, log-probs, top-p, draw)": (
        "softmax",
        "sort",
        "multinomial",
        "exponential",
        "topk",
        "argmax",
        "gather",
        "cumsum",
    ),  # fmt: skip
    "norms, activations, rotary": ("rms", "norm", "silu", "gelu", "rotary", "act_and_mul", "aten::mul", "aten::add"),
}


def group(name: str) -> str:
    low = name.lower()
    return next((g for g, keys in GROUPS.items() if any(k in low for k in keys)), "other torch operators")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="smollm2-128")
    p.add_argument("--out", default=str(ROOT / "results/perf/vllm/profile.md"))
    ns = p.parse_args()

    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    from bench.engine.policy import load_policy
    from bench.engine.vllm import VLLMEngine, merged_state_dict
    from scripts.bench import CONFIGS, _task_and_batches, model_folder

    c = CONFIGS[ns.config]
    from omegaconf import OmegaConf

    from bench.config import compose

    folder = model_folder(c["model"])
    cfg = OmegaConf.to_object(compose([f"model={c['model']}", f"task={c['task']}", "algorithm=grpo"]))
    policy, tok = load_policy(cfg.model, 0, str(folder))
    policy.eval()
    task, batches = _task_and_batches(c, tok, 1)
    batch = task.collate_prompts(batches[0])
    engine = VLLMEngine(policy, Path(tempfile.mkdtemp()) / "engine", dtype="float32", max_model_len=1024, seed=0,
                        gpu_memory=0.3, cpu_kv_gb=1)  # fmt: skip
    engine.push(merged_state_dict(policy))
    kw = dict(group_size=c["G"], temperature=1.0, top_p=1.0, seeds=list(range(c["P"])),
              eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)  # fmt: skip

    def call(n: int):
        engine.llm.reset_prefix_cache()  # as after a weight push: every step's prompts are new to the cache
        t0 = time.perf_counter()
        gen = engine.generate(batch["prompt_ids"], batch["prompt_mask"], max_new_tokens=n, **kw)
        return time.perf_counter() - t0, gen

    call(c["T"])  # warm-up
    full, gen = call(c["T"])
    one, _ = call(1)
    steps = int(gen.lengths.max())
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        profiled, _ = call(c["T"])
    totals: dict[str, float] = {}
    ops = []
    for e in prof.key_averages():
        if e.self_cpu_time_total <= 0:
            continue
        totals[group(e.key)] = totals.get(group(e.key), 0.0) + e.self_cpu_time_total / 1e6
        ops.append((e.self_cpu_time_total / 1e6, e.count, e.key))
    in_ops = sum(totals.values())
    lines = [
        f"# Where the vLLM engine's generation time goes: {ns.config}",
        "",
        f"`python scripts/profile_vllm.py --config {ns.config}` (float32, {torch.get_num_threads()} thread(s), "
        f"P = {c['P']} x G = {c['G']}, {c['T']} new tokens, temperature 1; the bench's first-step prompts).",
        "",
        f"- one call: {full:.2f} s for {int(gen.lengths.sum())} tokens in {steps} decode steps "
        f"({1000 * full / steps:.0f} ms per decode step of up to {gen.lengths.numel()} rows)",
        f"- the same call with 1 new token (prefill of the prompts and one step's fixed costs): {one:.2f} s",
        f"- under the profiler: {profiled:.2f} s, of which {in_ops:.2f} s inside torch operators and "
        f"{max(profiled - in_ops, 0.0):.2f} s outside them (the engine's Python: scheduling, inputs, outputs)",
        "",
        "| group | self time (s) | share of the profiled call |",
        "|---|---:|---:|",
    ]
    for g, s in sorted(totals.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {g} | {s:.2f} | {100 * s / profiled:.0f}% |")
    lines.append(f"| outside torch operators | {max(profiled - in_ops, 0.0):.2f} | "
                 f"{100 * max(profiled - in_ops, 0.0) / profiled:.0f}% |")  # fmt: skip
    lines += ["", "Top operators by self time:", "", "| operator | calls | self time (s) |", "|---|---:|---:|"]
    for s, n, k in sorted(ops, reverse=True)[:12]:
        lines.append(f"| `{k}` | {n} | {s:.3f} |")
    text = "\n".join(lines) + "\n"
    Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
    Path(ns.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
