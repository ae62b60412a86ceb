"""`make bench-compile`: do torch.compile, a static (preallocated) KV cache or bfloat16 sampling pay on this machine?

The levers of issue 7 that creditbench does not turn on, measured so anyone can rerun the decision. On the
`scripts/bench.py` configurations (same model folder, prompts and budget), one thread, creditbench's own sampler and
training forward:

- sampling: creditbench's ``generate`` (all rollout switches on) eager vs ``torch.compile(policy, dynamic=True)``
  and vs its opt-in ``rollout.static_cache``, and with a bfloat16 copy of the weights (not a same-work switch: the
  samples change, so π_old would have to come from the float32 forward);
  the plain sampler (no prompt-cache sharing, no compaction) with transformers' ``DynamicCache`` vs
  ``rollout.static_cache``'s preallocated ``StaticCache``, eager and compiled;
- training forward + backward (``completion_logprobs`` with ``trim`` and ``share_prompt``, as creditbench runs it)
  eager vs compiled, on a fresh rollout every step (new shapes), checking that the loss and gradients agree.

"first call" includes compilation (inductor caches compiled kernels on disk, so a rerun compiles faster); after it the
sampling variants take turns, the order reversed every other round, and "median" is over those rounds.
Writes results/perf/compile-<config>.md.

    python scripts/bench_compile.py                      # tiny: about 5 min on 2 cores
    python scripts/bench_compile.py smollm2 --steps 3    # SmolLM2-135M: compiling its training graph takes ~9 min
    python scripts/bench_compile.py smollm2-128 --no-compile --out results/perf/smollm2-128   # eager rows only

The bfloat16 rows also try the sampler copy with the plain matmul attention (``rollout.sampler_attention=eager``):
PyTorch's unmasked SDPA kernel is slow in bfloat16 on CPU at decode (results/perf/sampler_attention.md).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
_spec = importlib.util.spec_from_file_location("bench_script", ROOT / "scripts" / "bench.py")
bs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bs)  # scripts/bench.py: the configurations and the model folder both benchmarks use

from bench.engine.policy import completion_logprobs  # noqa: E402
from bench.engine.rollout import generate  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", nargs="?", default="tiny", choices=list(bs.CONFIGS))
    ap.add_argument("--reps", type=int, default=6, help="rounds of timed sampling calls after the first call")
    ap.add_argument("--steps", type=int, default=6, help="training forward+backward steps (fresh rollout each)")
    ap.add_argument("--out", default=str(ROOT / "results" / "perf"))
    ap.add_argument("--no-compile", action="store_true", help="leave out the compiled rows (minutes of compilation)")
    ns = ap.parse_args()
    from omegaconf import OmegaConf

    from bench.config import compose
    from bench.engine.policy import load_policy

    torch.set_num_threads(bs.THREADS)
    c = bs.CONFIGS[ns.config]
    folder = bs.model_folder(c["model"])
    cfg = OmegaConf.to_object(compose(bs.creditbench_args(c, folder, {})))
    policy, tok = load_policy(cfg.model, 0, folder)
    task, _ = bs._task_and_batches(c, tok, 1)
    batches = iter(task.train_dataloader())
    P, G, T = c["P"], c["G"], c["T"]
    kw = dict(group_size=G, max_new_tokens=T, temperature=1.0, top_p=1.0)
    kw |= dict(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    b = next(batches)
    pid, pm, seeds = b["prompt_ids"], b["prompt_mask"], list(range(P))
    compiled = torch.compile(policy, dynamic=True)
    policy.eval()
    fast = dict(share_prompt_cache=True, compact_finished=True)
    half = copy.deepcopy(policy).to(torch.bfloat16)
    half_eager = copy.deepcopy(half)
    half_eager.set_attn_implementation("eager")  # what rollout.sampler_attention=eager does to the sampler's copy
    fast_eager = "sampling, creditbench (all switches), eager"
    plain_eager = "sampling, plain, DynamicCache"
    variants = [  # (label, the row it is compared with, the call)
        (fast_eager, fast_eager, lambda: generate(policy, pid, pm, seeds=seeds, **kw, **fast)),
        (
            "sampling, creditbench (all switches), compiled",
            fast_eager,
            lambda: generate(compiled, pid, pm, seeds=seeds, **kw, **fast),
        ),
        (
            "sampling, creditbench (all switches), bfloat16 weights",
            fast_eager,
            lambda: generate(half, pid, pm, seeds=seeds, **kw, **fast),
        ),
        (
            "sampling, creditbench (all switches), bfloat16 weights, eager attention",
            fast_eager,
            lambda: generate(half_eager, pid, pm, seeds=seeds, **kw, **fast),
        ),
        (
            "sampling, creditbench (all switches) + rollout.static_cache",
            fast_eager,
            lambda: generate(policy, pid, pm, seeds=seeds, **kw, **fast, static_cache=True),
        ),
        (plain_eager, plain_eager, lambda: generate(policy, pid, pm, seeds=seeds, **kw)),
        (
            "sampling, plain, StaticCache",
            plain_eager,
            lambda: generate(policy, pid, pm, seeds=seeds, **kw, static_cache=True),
        ),
        (
            "sampling, plain, StaticCache, compiled",
            plain_eager,
            lambda: generate(compiled, pid, pm, seeds=seeds, **kw, static_cache=True),
        ),
    ]
    if ns.no_compile:
        variants = [v for v in variants if "compiled" not in v[0]]
    first = {}
    for label, _, fn in variants:  # the first call of each: compilation, when there is any
        t0 = time.perf_counter()
        fn()
        first[label] = time.perf_counter() - t0
        print(f"{label}: first call {first[label]:.2f}s", flush=True)
    after: dict[str, list[float]] = {label: [] for label, _, _ in variants}
    for rep in range(ns.reps):  # then the variants take turns, order reversed every other round (load drifts)
        for label, _, fn in variants if rep % 2 == 0 else variants[::-1]:
            t0 = time.perf_counter()
            fn()
            after[label].append(time.perf_counter() - t0)
        print(f"round {rep}: " + ", ".join(f"{k.split(', ', 1)[1]} {v[-1]:.3f}s" for k, v in after.items()), flush=True)
    median = {label: statistics.median(times) for label, times in after.items()}
    rows = [(label, first[label], median[label], median[ref], "") for label, ref, _ in variants]

    policy.train()
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    if ns.no_compile:
        ns.steps = 0
    worst = 0.0
    for i in range(ns.steps):
        b = next(batches)
        gen = generate(policy, b["prompt_ids"], b["prompt_mask"], seeds=[1000 * (i + 1) + p for p in range(P)], **kw)
        args = (b["prompt_ids"].repeat_interleave(G, 0), b["prompt_mask"].repeat_interleave(G, 0))
        args += (gen.completion_ids, gen.mask)
        weights = torch.randn_like(gen.mask)  # any per-token weights: the gradient check must not be vacuous
        res = {}
        for label, model in (("eager", policy), ("compiled", compiled)):
            t0 = time.perf_counter()
            logp, _ = completion_logprobs(model, *args, trim=True, share_prompt=True)
            terms = logp * gen.mask * weights
            loss = terms.sum()
            loss.backward()
            times[label].append(time.perf_counter() - t0)
            # the loss is a sum that can cancel to ~0: compare it relative to the sum of its terms' magnitudes
            res[label] = (loss.item(), [p.grad.clone() for p in policy.parameters()], terms.abs().sum().item())
            policy.zero_grad(set_to_none=True)
        pairs = zip(res["eager"][1], res["compiled"][1], strict=True)
        rel = max(float((a - b).abs().max() / a.abs().max().clamp(min=1e-12)) for a, b in pairs)
        worst = max(worst, rel, abs(res["eager"][0] - res["compiled"][0]) / res["eager"][2])
        e, c_ = times["eager"][-1], times["compiled"][-1]
        print(f"train step {i}: eager {e:.3f}s compiled {c_:.3f}s, largest relative difference {rel:.1e}")
    for label, ts in times.items() if ns.steps else ():
        n = f"{len(ts) - 1} steps"
        ref = statistics.median(times["eager"][1:])
        rows.append((f"training forward+backward, {label}", ts[0], statistics.median(ts[1:]), ref, n))
    lines = [
        f"# torch.compile, a static KV cache, bfloat16 sampling: `{ns.config}` (P = {P} x G = {G}, {T} new tokens, "
        f"{bs.THREADS} thread)",
        "",
        f"Machine: {bs.machine()}. Generated by `python scripts/bench_compile.py {' '.join(sys.argv[1:])}` on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. torch {torch.__version__}.",
        "",
        "| variant | first call, with compilation (s) | median after (s) | vs eager / DynamicCache |",
        "|---|---|---|---|",
    ]
    for label, first, med, ref, note in rows:
        lines.append(f"| {label}{f' ({note})' if note else ''} | {first:.2f} | {med:.3f} | {ref / med:.2f}x |")
    checked = (
        "Compiled vs eager training forward: largest difference in the loss (relative to the sum of its terms' "
        f"magnitudes) or in any gradient tensor (relative to its largest entry): {worst:.1e}."
    )
    lines += ["", checked if ns.steps else "Run with --no-compile: the compiled rows and the training rows left out."]
    out = Path(ns.out) / f"compile-{ns.config}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines) + f"\n\nwrote {out}")


if __name__ == "__main__":
    main()
