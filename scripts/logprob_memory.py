"""Peak memory of one training micro-batch's log-probs on SmolLM2-135M: the full [B, T, V] float32 logits against
the chunked computation (bench.engine.policy.token_logprobs), float32 and bf16-mixed, forward + backward.

Each variant runs in its own process (peak RSS is the process's own high-water mark, ru_maxrss); the baseline is the
same process's RSS after loading the model and building the batch, so the table's "added" column is what the
forward + backward of the micro-batch held at its peak.

    python scripts/logprob_memory.py                 # B = 8 rows of 192 prompt + 512 completion tokens
    python scripts/logprob_memory.py --rows 16 --completion 64 --out results/perf/logprob_memory_64.md
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rss_mib() -> float:
    return next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmRSS:")) / 1024


def child(chunk: int | None, precision: str, rows: int, prompt: int, completion: int) -> dict:
    import torch

    from bench.config import compose
    from bench.engine.policy import completion_logprobs, gguf_folder, load_policy

    m = compose(["model=smollm2-135m", "task=gsm8k", "algorithm=grpo"]).model
    folder = gguf_folder(m.gguf_package, m.gguf_file, ROOT / ".cache")
    model, _ = load_policy(m, 0, folder)
    g = torch.Generator().manual_seed(0)
    V = model.config.vocab_size
    pi, ci = torch.randint(0, V, (rows, prompt), generator=g), torch.randint(0, V, (rows, completion), generator=g)
    pm, cm = torch.ones(rows, prompt, dtype=torch.long), torch.ones(rows, completion)
    base = rss_mib()
    t0 = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
        logp, ent = completion_logprobs(model, pi, pm, ci, cm, 1.0, with_entropy=True, trim=True, chunk=chunk)
    (logp * cm).sum().backward()
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"chunk": chunk, "precision": precision, "base_mib": base, "peak_mib": peak, "added_mib": peak - base,
            "seconds": seconds, "logp_sum": float(logp.sum())}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=192)
    ap.add_argument("--completion", type=int, default=512)
    ap.add_argument("--out", default=str(ROOT / "results" / "perf" / "logprob_memory.md"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ns = ap.parse_args()
    shape = (ns.rows, ns.prompt, ns.completion)
    if ns.child:
        chunk, precision = json.loads(ns.child)
        print("RESULT " + json.dumps(child(chunk, precision, *shape)), flush=True)
        return
    rows = []
    for precision in ("32-true", "bf16-mixed"):
        for chunk in (None, 1024):
            cmd = [sys.executable, __file__, "--child", json.dumps([chunk, precision]), "--rows", str(ns.rows),
                   "--prompt", str(ns.prompt), "--completion", str(ns.completion)]  # fmt: skip
            out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ})
            line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                raise RuntimeError(out.stderr[-3000:])
            rows.append(json.loads(line[len("RESULT ") :]))
            r = rows[-1]
            print(f"{precision:10s} chunk={chunk}: +{r['added_mib']:.0f} MiB at peak, {r['seconds']:.1f} s", flush=True)
    V_logits = ns.rows * ns.completion * 49152 * 4 / 2**20
    lines = [
        "# Peak memory of one SmolLM2-135M micro-batch's log-probs: full logits against chunks",
        "",
        f"`python scripts/logprob_memory.py` on {time.strftime('%Y-%m-%d', time.gmtime())}: B = {ns.rows} rows of "
        f"{ns.prompt} prompt + {ns.completion} completion tokens, `completion_logprobs(..., with_entropy=True)` "
        "(trim=True: logits at completion positions only, as the update runs it) forward + backward, each variant "
        "in its own process; added = peak RSS − RSS after loading the model and "
        f"the batch. The completion positions' float32 logits alone are {V_logits:.0f} MiB ([B, T, V] = "
        f"[{ns.rows}, {ns.completion}, 49152]).",
        "",
        "| precision | log-probs | added at peak (MiB) | seconds (forward + backward, shared machine) | Σ log π |",
        "|---|---|---:|---:|---:|",
        *(
            f"| {r['precision']} | {'chunks of ' + str(r['chunk']) if r['chunk'] else 'full [B, T, V]'} "
            f"| {r['added_mib']:.0f} | {r['seconds']:.1f} | {r['logp_sum']:.2f} |"
            for r in rows
        ),  # fmt: skip
        "",
    ]
    Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
    Path(ns.out).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
