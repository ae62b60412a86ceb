"""Where can SmolLM2-135M learn? Screening reasoning-gym settings (issue 41): greedy held-out accuracy zero-shot, then
after a short SFT warm start for the most promising, through the harness's own evaluation path (chat template, answer
tags, the generator's verifier in its confined worker).

    python scripts/rg_screen.py                       # stage 1: zero-shot on every setting below (48 problems each)
    python scripts/rg_screen.py --sft 4 --sft-steps 120   # stage 2 too: SFT warm starts for the 4 best, 200 problems

Writes results/rg_screen/screen.md (and screen.json): one row per setting, accuracy with its binomial standard
error, and whether it sits in the 15-70 % band where an RL algorithm has room to move it (prime-rl's sanity-check
reasoning: neither solved nor hopeless). Prints each setting as it finishes, with the time left.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the package, not scripts/bench.py
from bench import ROOT  # noqa: E402
from bench.config import compose  # noqa: E402
from bench.engine.policy import load_policy  # noqa: E402
from bench.registry import TASKS  # noqa: E402
from bench.rl.module import PolicyModule  # noqa: E402

# (generator, its parameters): easy settings first; two or three difficulties per generator
SETTINGS = [
    ("basic_arithmetic", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}),
    ("basic_arithmetic", {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}),
    ("chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}),
    ("chain_sum", {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}),
    ("leg_counting", {"min_animals": 1, "max_animals": 2, "max_instances": 2}),
    ("leg_counting", {"min_animals": 2, "max_animals": 3, "max_instances": 3}),
    ("spell_backward", {"min_word_len": 3, "max_word_len": 4}),
    ("spell_backward", {"min_word_len": 3, "max_word_len": 5}),
    ("letter_counting", {"min_words": 1, "max_words": 3}),
    ("letter_counting", {"min_words": 3, "max_words": 6}),
    ("number_sorting", {"min_numbers": 3, "max_numbers": 3, "min_decimals": 0, "max_decimals": 0}),
    ("number_sorting", {"min_numbers": 3, "max_numbers": 5, "min_decimals": 0, "max_decimals": 0}),
    ("coin_flip", {}),
    ("gcd", {"min_numbers": 2, "max_numbers": 2, "min_value": 1, "max_value": 30}),
    ("gcd", {"min_numbers": 2, "max_numbers": 2, "min_value": 1, "max_value": 100}),
    ("lcm", {"min_numbers": 2, "max_numbers": 2, "min_value": 1, "max_value": 12}),
    ("word_sorting", {"min_words": 3, "max_words": 3}),
    ("count_bits", {"max_n": 64}),
    ("base_conversion", {"min_base": 2, "max_base": 10, "min_value": 0, "max_value": 64}),
    ("simple_equations", {"min_terms": 2, "max_terms": 2, "min_value": 1, "max_value": 10}),
    ("power_function", {"min_exponent": 0, "max_exponent": 2}),
    ("decimal_arithmetic", {"min_num_decimal_places": 1, "max_num_decimal_places": 1, "precision": 4}),
]


def overrides(dataset: str, params: dict) -> list[str]:
    return [f"task.dataset={dataset}", *(f"task.params.{k}={v}" for k, v in params.items())]


def evaluate(cfg, init: Path | None) -> dict:
    obj = OmegaConf.to_object(cfg)
    policy, tok = load_policy(obj.model, obj.seed, init, ROOT / obj.cache_dir)
    policy.eval()
    task = TASKS.get("reasoning_gym")(obj.task, tok, seed=obj.seed)
    module = PolicyModule(obj, policy, tok, task)
    t0 = time.perf_counter()
    m = module.evaluate()
    n = len(task.eval_examples())
    acc = m["eval/accuracy"]
    return {"accuracy": acc, "se": math.sqrt(max(acc * (1 - acc), 1e-12) / n), "n": n,
            "format": m.get("eval/format", m["eval/reward_mean"]),  # logged only where it differs from the score
            "seconds": time.perf_counter() - t0}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=48, help="zero-shot problems per setting")
    ap.add_argument("--sft", type=int, default=0, help="SFT warm starts for this many of the best settings")
    ap.add_argument(
        "--sft-on",
        default=None,
        help="comma-separated setting numbers (as printed, from 1) to warm-start instead of the best by "
        "zero-shot accuracy (which ties at 0 where the model never writes the tags)",
    )
    ap.add_argument("--sft-steps", type=int, default=120)
    ap.add_argument("--sft-n", type=int, default=200, help="problems per setting after SFT")
    ap.add_argument("--limit", type=int, default=None, help="only the first N settings (a smoke run)")
    ap.add_argument("--out", default=str(ROOT / "results" / "rg_screen"))
    ap.add_argument("rest", nargs="*", help="config overrides for every run (e.g. trainer.precision=bf16-mixed)")
    ns = ap.parse_args()
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    base = [f"model={ns.model}", "task=reasoning_gym", "algorithm=sft", "eval.batch_size=48", "eval.max_new_tokens=48",
            "rollout.max_new_tokens=48", *ns.rest]  # fmt: skip
    rows, t0 = [], time.time()
    state = out / "screen.json"
    done = {json.dumps(r["setting"]): r for r in json.loads(state.read_text())} if state.exists() else {}
    settings = SETTINGS[: ns.limit]
    for i, (dataset, params) in enumerate(settings):
        key = json.dumps([dataset, params])
        if key in done and "zero_shot" in done[key]:
            rows.append(done[key])
            continue
        cfg = compose([*base, *overrides(dataset, params), f"task.num_eval={ns.n}"])
        r = {"setting": [dataset, params], "zero_shot": evaluate(cfg, None)}
        rows.append(r)
        state.write_text(json.dumps(rows, indent=1))
        left = (time.time() - t0) / (i + 1) * (len(settings) - i - 1)
        print(f"[{i + 1}/{len(settings)}] {dataset} {params}: zero-shot {r['zero_shot']['accuracy']:.3f} "
              f"(format {r['zero_shot']['format']:.2f}) ~{left / 60:.0f} min left", flush=True)  # fmt: skip
    if ns.sft:
        if ns.sft_on:
            best = [rows[int(i) - 1] for i in ns.sft_on.split(",")]
        else:
            best = sorted(rows, key=lambda r: -r["zero_shot"]["accuracy"])[: ns.sft]
        from bench.run.train import ensure_sft

        for j, r in enumerate(best):
            if "sft" in r:
                continue
            dataset, params = r["setting"]
            cfg = compose([*base, *overrides(dataset, params), f"task.num_eval={ns.sft_n}", "init=sft",
                           f"warm_start.max_steps={ns.sft_steps}",
                           "warm_start.overrides=[optim.lr=3e-5,train.batch_size=16]"])  # fmt: skip
            t1 = time.time()
            path = ensure_sft(cfg)
            r["sft"] = {**evaluate(cfg, path), "steps": ns.sft_steps, "train_seconds": time.time() - t1}
            state.write_text(json.dumps(rows, indent=1))
            print(f"[sft {j + 1}/{len(best)}] {dataset} {params}: {r['sft']['accuracy']:.3f}", flush=True)
    write(rows, out, ns)


def write(rows: list[dict], out: Path, ns) -> None:
    lines = ["| generator | parameters | zero-shot accuracy (n) | format | after SFT (n, steps) | in 15-70 % |",
             "|---|---|---:|---:|---:|---|"]  # fmt: skip
    for r in rows:
        z, s = r["zero_shot"], r.get("sft")
        after = f"{s['accuracy']:.3f} ± {s['se']:.3f} ({s['n']}, {s['steps']})" if s else "–"
        band = "yes" if 0.15 <= (s or z)["accuracy"] <= 0.70 else ""
        lines.append(f"| {r['setting'][0]} | `{json.dumps(r['setting'][1])}` | {z['accuracy']:.3f} ± {z['se']:.3f} "
                     f"({z['n']}) | {z['format']:.2f} | {after} | {band} |")  # fmt: skip
    pick = f" --sft-on {ns.sft_on}" if ns.sft_on else ""
    cmd = f"python scripts/rg_screen.py --sft {ns.sft}{pick} --sft-steps {ns.sft_steps} {' '.join(ns.rest)}".strip()
    (out / "screen.md").write_text(
        f"# Where SmolLM2-135M can learn: reasoning-gym settings\n\n`{cmd}`\n\nGreedy, {ns.n} problems zero-shot "
        "(± one binomial standard error), answers in <answer> tags scored by the generator's own verifier.\n\n"
        + "\n".join(lines) + "\n"
    )  # fmt: skip
    print((out / "screen.md").read_text())


if __name__ == "__main__":
    main()
