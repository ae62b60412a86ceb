"""`make bench`: a creditbench GRPO step vs TRL's GRPOTrainer at identical work, side by side on this machine.

Both systems load the same weights and tokenizer from one folder, take the same prompts in the same order, and run
the same RL work per step: P prompts x G completions, max new tokens, temperature, learning rate, beta = 0, one
optimizer step per rollout (TRL: num_iterations = 1), loss aggregation seq-mean-token-mean (TRL: loss_type="grpo"),
group-std advantages, clip 0.2, gradient clipping 1.0, no vLLM. Each measurement runs in its own subprocess (so peak
RSS is the system's own), the two systems alternate (order flipped each repetition), the first steps of each process
are warm-up, and the table reports medians over the measured steps of all repetitions.

    python scripts/bench.py                     # tiny (Countdown) + smollm2-135m (DialogSum) + per-lever table
    python scripts/bench.py --configs tiny --reps 1 --steps 1 --warmup 0 --no-levers   # smoke

FLOP estimate (documented, the same formula for both systems): a forward costs 2·N FLOPs per token and a backward
4·N (N = parameters in matmuls, the tied embedding counted once as the LM head; attention score FLOPs ignored). The
useful work of one step is one forward per sequence token to sample (prompt + completion, each sequence on its own)
and one forward + backward per sequence token to train: 8·N·(B·mean prompt length + completion tokens). Achieved
FLOP/s = that work / step time, given as a fraction of torch.matmul's float32 peak measured here with the same threads.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIGS = {
    # the default RL budget of conf/config.yaml (P=16, G=8, 32 new tokens, lr 1e-4) on the tiny model's SFT warm start
    "tiny": dict(model="tiny", task="countdown", P=16, G=8, T=32, lr=1e-4, micro=64, warmup=2, steps=4),
    # a real 135M model on GSM8K prompts (chat template): a smaller budget so a step takes seconds, not minutes
    "smollm2": dict(model="smollm2-135m", task="gsm8k", P=2, G=4, T=32, lr=1e-6, micro=8, warmup=1, steps=2),
    # the same with room to finish a GSM8K answer, so groups have reward variance and every row is trained
    # (not run by default: about 15 min; `--configs smollm2-128 --no-levers --out results/perf/smollm2-128`)
    "smollm2-128": dict(model="smollm2-135m", task="gsm8k", P=2, G=4, T=128, lr=1e-6, micro=8, warmup=1, steps=2),
    # work a training run really does (issue 39): SmolLM2 on DialogSum summarisation, whose graded reward (ROUGE)
    # makes every group's rewards differ, so every row is trained whatever the skip; P x G = 8 x 8, 64 new tokens
    # (`--configs smollm2-sum --no-levers`, BENCH_THREADS=2: each system with both cores)
    "smollm2-sum": dict(
        model="smollm2-135m",
        task="summarization",
        P=8,
        G=8,
        T=64,
        lr=1e-6,
        micro=16,
        warmup=1,
        steps=2,
        args=["task.corpus=dialogsum"],
    ),  # fmt: skip
}
DEFAULT_CONFIGS = ["tiny", "smollm2-sum"]
"""What `make bench` measures: the tiny model, and SmolLM2 on work every row trains (smollm2's GSM8K groups are all
inert at 32 tokens: its speed-up is refused, so it is no longer a default)."""
LEVERS = {
    "share_prompt_cache": "rollout.share_prompt_cache",
    "compact_finished": "rollout.compact_finished",
    "logp_from_sampler": "rollout.logp_from_sampler",
    "skip_zero_adv": "train.skip_zero_adv",
    "trim_padding": "train.trim_padding",
    "share_prompt_forward": "train.share_prompt_forward",
}
OPT_IN = {"static_cache": "rollout.static_cache"}  # speed switches off by default: measured on top of "all on"
SWITCHES = {**LEVERS, **OPT_IN}
# Settings that change the samples (not speed switches): sampling from bfloat16 weights, with a correction for the
# training-inference mismatch it brings (the learner stays float32 and recomputes log pi_old).
SETTINGS = {"sampler_dtype": "rollout.sampler_dtype", "sampler_attention": "rollout.sampler_attention",
            "is_correction": "algorithm.is_correction", "engine": "rollout.engine",
            "precision": "trainer.precision"}  # fmt: skip
# rollout.sampler_attention=eager is not in these rows: it samples 1.29-1.47x faster than SDPA from bfloat16 weights
# on unpadded prompts, not on padded ones such as smollm2-128's GSM8K prompts (results/perf/sampler_attention.md)
FP32 = {"precision": "32-true", "sampler_dtype": "float32"}  # explicit: conf/model/smollm2-135m.yaml says bf16-mixed
BF16_TIS = {"precision": "32-true", "sampler_dtype": "bfloat16", "is_correction": "tis"}
# trainer.precision=bf16-mixed (bfloat16 autocast over float32 master weights; log-probs from float32 logits),
# sampling from a bfloat16 copy of the weights refreshed every step: the fastest sound setting
# (docs/engines.md, "Precision")
BF16_MIXED = {"precision": "bf16-mixed", "sampler_dtype": "bfloat16"}
SYSTEMS = {
    "creditbench": FP32,  # every speed switch at its default (on)
    # the same without skipping zero-advantage groups: the machinery alone, whatever the rewards happen to be
    "creditbench, no zero-adv skip": {**FP32, "skip_zero_adv": False},
    "creditbench, bf16 sampling + TIS": BF16_TIS,
    "creditbench, bf16 sampling + TIS, no zero-adv skip": {**BF16_TIS, "skip_zero_adv": False},
    # rollouts from a vLLM engine in the process (rollout.engine=vllm), weights pushed every step, float32 and bf16
    "creditbench, vLLM engine": {**FP32, "engine": "vllm"},
    "creditbench, vLLM engine, bf16 + TIS": {"engine": "vllm", **BF16_TIS},
    "creditbench, bf16-mixed": BF16_MIXED,
    "creditbench, bf16-mixed, no zero-adv skip": {**BF16_MIXED, "skip_zero_adv": False},
    "creditbench, vLLM engine, no zero-adv skip": {**FP32, "engine": "vllm", "skip_zero_adv": False},
    "creditbench, vLLM engine, bf16-mixed": {**BF16_MIXED, "engine": "vllm"},
    "creditbench, vLLM engine, bf16-mixed, no zero-adv skip": {**BF16_MIXED, "engine": "vllm", "skip_zero_adv": False},
    "trl": None,
    "trl, bf16": "bf16",  # TRL's own switch (GRPOConfig.bf16=True: accelerate's bfloat16 autocast)
    "trl, vLLM colocate": "vllm",  # TRL's own vLLM mode (use_vllm=True, vllm_mode="colocate"), where it runs
}
NEEDS_VLLM = {k for k, v in SYSTEMS.items() if v == "vllm" or (isinstance(v, dict) and v.get("engine") == "vllm")}
THREADS = int(os.environ.get("BENCH_THREADS", "1"))
"""Threads per system (BENCH_THREADS): 1 by default. The tiny model's matmuls are too small to share, and on a
machine whose cores other jobs also use, oversubscribed threads made steps ~30x slower for both systems."""
if not os.environ.get("BENCH_DATA") and (ROOT.parent / "shared" / "data").is_dir():
    os.environ["BENCH_DATA"] = str(ROOT.parent / "shared" / "data")  # GSM8K prompts, as the Makefile sets it


# ---- the model folder both systems load --------------------------------------------------------------------------
def model_folder(name: str) -> Path:
    """tiny: a cached SFT warm start of the tiny model (trained once if none exists: random weights would score 0
    everywhere and leave nothing to train); smollm2-135m: the HF folder converted from the GGUF package."""
    from bench.config import compose
    from bench.engine.policy import gguf_folder

    cache = ROOT / ".cache"
    if name == "tiny":
        done = sorted(cache.glob("sft/countdown-tiny-s0-*/DONE"))
        if done:
            return done[-1].parent
        from bench.run.train import ensure_sft

        return ensure_sft(compose(["model=tiny", "task=countdown", "algorithm=grpo", "init=sft"]))
    m = compose([f"model={name}", "task=gsm8k", "algorithm=grpo"]).model
    return gguf_folder(m.gguf_package, m.gguf_file, cache)


# ---- children: one system, one process --------------------------------------------------------------------------
def _task_and_batches(c: dict, tokenizer, steps: int):
    """The task and the prompts of steps 0..steps-1 exactly as creditbench's train stream yields them."""
    from omegaconf import OmegaConf

    from bench.config import compose
    from bench.registry import TASKS

    cfg = OmegaConf.to_object(
        compose([f"model={c['model']}", f"task={c['task']}", "algorithm=grpo", *c.get("args", [])])
    )
    task = TASKS.get(c["task"])(cfg.task, tokenizer, seed=0, prompts_per_step=c["P"], train_stream="prompts")
    it = iter(task.train_dataloader())
    return task, [next(it)["examples"] for _ in range(steps)]


def creditbench_args(c: dict, folder: Path, levers: dict[str, bool]) -> list[str]:
    args = [
        f"model={c['model']}",
        f"task={c['task']}",
        "algorithm=grpo",
        "algorithm.beta=0",
        f"init={folder}",
        f"rollout.prompts_per_step={c['P']}",
        f"rollout.group_size={c['G']}",
        f"rollout.max_new_tokens={c['T']}",
        "rollout.temperature=1.0",
        "rollout.top_p=1.0",
        f"optim.lr={c['lr']}",
        f"train.micro_batch_size={c['micro']}",
        f"trainer.max_steps={c['warmup'] + c['steps']}",
        f"trainer.num_threads={THREADS}",
        "trainer.accelerator=cpu",
        "trainer.progress_bar=false",
        *c.get("args", []),
    ]
    keys = {**SWITCHES, **SETTINGS}
    return args + [f"{keys[k]}={v}" for k, v in levers.items()]


def run_creditbench(c: dict, folder: Path, levers: dict[str, bool], schedule: list[dict] | None = None) -> dict:
    """creditbench's GRPO through its own RLModule and Lightning (no MLflow, no evaluation). ``schedule``: switch
    settings applied in turn, one per training step, so variants interleave step by step in one process."""
    import lightning as L
    import torch
    from omegaconf import OmegaConf

    from bench.config import compose
    from bench.engine.policy import load_policy
    from bench.registry import ALGORITHMS, TASKS

    torch.set_num_threads(THREADS)
    cfg = OmegaConf.to_object(compose(creditbench_args(c, folder, levers)))
    L.seed_everything(0, verbose=False)
    policy, tok = load_policy(cfg.model, cfg.seed, folder)
    task = TASKS.get(c["task"])(
        cfg.task, tok, seed=cfg.seed, prompts_per_step=c["P"], train_stream="prompts", batch_size=cfg.train.batch_size
    )
    module = ALGORITHMS.get("grpo")(cfg, policy, tok, task)
    steps: list[dict] = []
    module.evaluate = lambda: {}  # the benchmark times training steps only
    decode: list[float] = []  # bytes the decoding of each step read (decode_bytes)
    sample = module.sample

    def measured_sample(batch, *a, **kw):
        gen = sample(batch, *a, **kw)
        engine = module.behaviour.make_engine is not None  # the engine holds the policy's weights, in its own dtype
        model = module.policy if engine else module.behaviour.model(module.policy, module.step_count)
        width = int(batch["prompt_ids"].shape[1])
        size = module.behaviour.dtype.itemsize if engine else None  # (bench.md at 78fb8df counted float32 here)
        decode.append(decode_bytes(model, [width] * len(gen.lengths), gen.lengths.tolist(), compact=True, size=size))
        return gen

    module.sample = measured_sample
    module.log_metrics = lambda m: steps.append({k: float(v) for k, v in m.items()})
    if schedule:
        training_step = module.training_step

        def switched_step(batch, batch_idx):
            for key, on in schedule[module.step_count % len(schedule)].items():
                section, field = SWITCHES[key].split(".")
                setattr(getattr(cfg, section), field, on)  # read afresh by every step
            return training_step(batch, batch_idx)

        module.training_step = switched_step
    trainer = L.Trainer(
        accelerator="cpu",
        precision=cfg.trainer.precision,
        devices=1,
        max_steps=-1,
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        default_root_dir=tempfile.mkdtemp(prefix="bench-cb-"),
    )
    trainer.fit(module, datamodule=task)
    _, batches = _task_and_batches(c, tok, len(steps))
    out = []
    for i, m in enumerate(steps):
        out.append(
            {
                "variant": i % len(schedule) if schedule else 0,
                "step": m["time/step"],
                "generation": m["time/generation"],
                "scoring": m["time/scoring"],
                "update": m["time/update"],
                "weight_sync": m.get("time/weight_sync", 0.0),
                "completion_tokens": m["rollout/generated_tokens"],
                "loss": m.get("loss/total", float("nan")),
                "zero_var_frac": m["rollout/zero_var_group_frac"],
                "decode_bytes": decode[i],
            }
        )
    return {"steps": out, "params": _matmul_params(policy), "prompt_len": _prompt_len(task, tok, batches)}


def run_trl(c: dict, folder: Path, vllm: bool = False, bf16: bool = False) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(THREADS)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    n_steps = c["warmup"] + c["steps"]
    task, batches = _task_and_batches(c, tok, n_steps)
    by_uid = {e.uid: e for b in batches for e in b}
    rows = [{"prompt": task.render_prompt(e), "uid": e.uid} for b in batches for e in b]
    timer = {"generation": 0.0, "scoring": 0.0}

    def reward(prompts, completions, uid, **kwargs):
        t0 = time.perf_counter()
        out = [task.reward(by_uid[u], text).score for u, text in zip(uid, completions, strict=True)]
        timer["scoring"] += time.perf_counter() - t0
        return out

    B = c["P"] * c["G"]
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-trl-"),
        per_device_train_batch_size=c["micro"],
        gradient_accumulation_steps=B // c["micro"],  # one optimizer step = one generation batch of P x G
        num_generations=c["G"],
        max_completion_length=c["T"],
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        learning_rate=c["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=0.0,
        num_iterations=1,
        epsilon=0.2,
        loss_type="grpo",  # seq-mean-token-mean, as creditbench's GRPO
        scale_rewards="group",
        mask_truncated_completions=False,
        shuffle_dataset=False,  # the prompts in creditbench's order
        max_steps=n_steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=bf16,
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
        **({"use_vllm": True, "vllm_mode": "colocate", "vllm_enable_sleep_mode": False} if vllm else {}),
    )
    records: list[dict] = []

    class Timing(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            timer.update(generation=0.0, scoring=0.0, decode_bytes=0.0)
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            records.append({"step": time.perf_counter() - self.t0, **timer})

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs and records:
                records[-1]["completion_tokens"] = logs["completions/mean_length"] * B
                records[-1]["loss"] = logs.get("loss", float("nan"))

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        callbacks=[Timing()],
    )
    generate = trainer._generate

    def timed_generate(prompts):
        t0 = time.perf_counter()
        out = generate(prompts)
        timer["generation"] += time.perf_counter() - t0
        prompt_ids, completion_ids = out[0], out[1]  # lists of token ids, one per row; HF generate pads the prompts
        width = max(len(p) for p in prompt_ids)  # to the longest and runs every row until the last one finishes
        lengths = [len(c) for c in completion_ids]
        timer["decode_bytes"] = timer.get("decode_bytes", 0.0) + decode_bytes(model, [width] * len(lengths), lengths,
                                                                              compact=False)  # fmt: skip
        return out

    trainer._generate = timed_generate
    check: dict = {}
    compute_loss = trainer.compute_loss

    def checked_compute_loss(model, inputs, *a, **kw):
        if not check:  # first micro-batch: creditbench's GRPO loss on TRL's own rollout rows and advantages
            probe = inputs
            if not bool(inputs["advantages"].any()):  # all-zero advantages would make the check vacuous
                gen = torch.Generator().manual_seed(0)
                probe = {**inputs, "advantages": torch.randn(inputs["advantages"].shape, generator=gen)}
            check.update(same_loss(model, probe, compute_loss(model, probe, *a, **kw), B))
            check["synthetic_advantages"] = probe is not inputs
        return compute_loss(model, inputs, *a, **kw)

    trainer.compute_loss = checked_compute_loss
    trainer.train()
    for r in records:
        r["update"] = r["step"] - r["generation"] - r["scoring"]
    return {
        "steps": records,
        "params": _matmul_params(model),
        "prompt_len": _prompt_len(task, tok, batches),
        "loss_check": check,
    }


def same_loss(model, inputs: dict, trl_loss, B: int) -> dict:
    """creditbench's GRPO loss (bench.rl.objective.policy_loss via algorithms/grpo.py, beta 0) on the rows TRL is
    about to train on, with TRL's advantages and the step's denominators; -> |Δloss| and max |Δgrad| against TRL's
    loss."""
    import torch

    from algorithms.grpo import GRPOConfig, grpo_loss
    from bench.engine.policy import completion_logprobs
    from bench.rl.losses import Norm

    params = [p for p in model.parameters() if p.requires_grad]
    mask = inputs["completion_mask"].float()
    logp, _ = completion_logprobs(
        model, inputs["prompt_ids"], inputs["prompt_mask"], inputs["completion_ids"], mask, temperature=1.0
    )
    norm = Norm(num_seqs=B, num_tokens=float(mask.sum()), budget=mask.shape[1])
    ours, _ = grpo_loss(logp, logp.detach(), inputs["advantages"], mask, GRPOConfig(beta=0.0), norm)
    g_ours = torch.autograd.grad(ours, params)
    g_trl = torch.autograd.grad(trl_loss, params, retain_graph=True)
    return {
        "rows": int(mask.shape[0]),
        "loss_trl": float(trl_loss),
        "loss_creditbench": float(ours),
        "abs_loss_diff": abs(float(trl_loss) - float(ours)),
        "max_abs_grad_diff": max(float((a - b).abs().max()) for a, b in zip(g_ours, g_trl, strict=True)),
        "max_abs_grad": max(float(a.abs().max()) for a in g_trl),
    }


def decode_bytes(model, widths: list[int], lengths: list[int], compact: bool, size: int | None = None) -> float:
    """Bytes one sampling call must read from memory while decoding, the physical floor of its time: every decode
    step reads every weight once (whatever the number of rows) and, for each row it runs, that row's KV cache
    (2 x layers x KV heads x head dim x context, context = padded prompt width + tokens so far). ``compact``: rows
    stop being run once they finish (creditbench's compact_finished); otherwise every row runs until the longest
    finishes (HF generate). Weights and cache in the model's own dtype, or ``size`` bytes an element (an engine's
    own dtype). The prompt's prefill (compute-bound) and activations are left out."""
    conf = model.config
    size = size or next(model.parameters()).element_size()
    weights = sum(t.numel() for t in {id(t): t for t in model.parameters()}.values()) * size
    head_dim = getattr(conf, "head_dim", None) or conf.hidden_size // conf.num_attention_heads
    kv_per_token = 2 * conf.num_hidden_layers * getattr(conf, "num_key_value_heads", conf.num_attention_heads)
    kv_per_token *= head_dim * size
    total = 0.0
    for t in range(max(lengths, default=0)):
        rows = [w for w, n in zip(widths, lengths, strict=True) if not compact or n > t]
        total += weights + kv_per_token * sum(w + t for w in rows)
    return total


def memory_bandwidth(gib: float = 1.0, reps: int = 5) -> float:
    """Best read bandwidth (bytes/s) of torch.sum over a float32 tensor of ``gib`` GiB, with the benchmark's threads:
    the rate at which this machine can stream weights and KV cache to a decoding step."""
    import torch

    torch.set_num_threads(THREADS)
    x = torch.ones(int(gib * 2**30) // 4)
    x.sum()
    best = 0.0
    for _ in range(reps):
        t0 = time.perf_counter()
        x.sum()
        best = max(best, x.numel() * 4 / (time.perf_counter() - t0))
    return best


def _matmul_params(model) -> int:
    """Parameters that enter matmuls: unique tensors (a tied embedding counts once, as the LM head), no norms."""
    seen, n = set(), 0
    for p in model.parameters():
        if id(p) not in seen and p.dim() >= 2:
            seen.add(id(p))
            n += p.numel()
    return n


def _prompt_len(task, tok, batches) -> float:
    add = not getattr(tok, "chat_template", None)
    lens = [len(tok(task.render_prompt(e), add_special_tokens=add).input_ids) for b in batches for e in b]
    return sum(lens) / len(lens)


def child(ns) -> None:
    spec = json.loads(ns.child)
    c, folder = spec["config"], Path(spec["folder"])
    if spec["system"].startswith("trl"):
        out = run_trl(c, folder, vllm=spec["system"] == "trl-vllm", bf16=spec["system"] == "trl-bf16")
    else:
        out = run_creditbench(c, folder, spec["levers"], spec.get("schedule"))
    out["steps"] = out["steps"][c["warmup"] :]
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("BENCH-RESULT " + json.dumps(out), flush=True)


def spawn(system: str, c: dict, folder: Path, levers: dict | None = None, schedule: list | None = None) -> dict:
    spec = {"system": system, "config": c, "folder": str(folder), "levers": levers or {}, "schedule": schedule}
    spec = json.dumps(spec)
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(
        [sys.executable, __file__, "--child", spec], capture_output=True, text=True, env=env, cwd=ROOT
    )
    for line in proc.stdout.splitlines():
        if line.startswith("BENCH-RESULT "):
            return json.loads(line[len("BENCH-RESULT ") :])
    tail = f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    raise RuntimeError(f"{system} child failed (rc {proc.returncode}):\n{tail}")


# ---- the parent: alternate, aggregate, write the table ---------------------------------------------------------
def matmul_peak(n: int = 2048, reps: int = 5, dtype: str = "float32") -> float:
    """Best torch.matmul FLOP/s in ``dtype`` over a few repetitions, with the benchmark's thread count (bfloat16: the
    compute floor of a mixed-precision update; AMX on this CPU)."""
    import torch

    torch.set_num_threads(THREADS)
    a, b = torch.randn(n, n, dtype=getattr(torch, dtype)), torch.randn(n, n, dtype=getattr(torch, dtype))
    torch.matmul(a, b)
    best = 0.0
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(4):
            torch.matmul(a, b)
        best = max(best, 4 * 2 * n**3 / (time.perf_counter() - t0))
    return best


def summarise(results: list[dict], B: int) -> dict:
    steps = [s for r in results for s in r["steps"]]
    med = {k: statistics.median(s[k] for s in steps) for k in ("step", "generation", "scoring", "update")}
    med["weight_sync"] = statistics.median(s.get("weight_sync", 0.0) for s in steps)
    tokens = statistics.median(s.get("completion_tokens", float("nan")) for s in steps)
    n, tp = results[0]["params"], results[0]["prompt_len"]
    flops = 8 * n * (B * tp + tokens)
    return {
        **med,
        "tokens_per_step": tokens,
        "tokens_per_s": statistics.median(s["completion_tokens"] / s["step"] for s in steps),
        "peak_rss_mib": max(r["peak_rss_mib"] for r in results),
        "flops_per_step": flops,
        "flops_per_s": flops / med["step"],
        # the update's own work: one forward and one backward per trained sequence token, 6·N per token
        "update_flops_per_s": 6 * n * (B * tp + tokens) / med["update"],
        "n_steps": len(steps),
        "losses": [s.get("loss") for s in steps],
        "zero_var_frac": statistics.median(s.get("zero_var_frac", float("nan")) for s in steps),
        "decode_bytes": statistics.median(s.get("decode_bytes", float("nan")) for s in steps),
    }


def machine() -> str:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    import torch
    import transformers

    try:
        import trl

        trl_v = trl.__version__
    except ImportError:
        trl_v = "not installed"
    return (
        f"{cpu}, {os.cpu_count()} CPU cores, {mem:.0f} GiB RAM, no GPU; Python {platform.python_version()}, "
        f"torch {torch.__version__} ({THREADS} threads), transformers {transformers.__version__}, trl {trl_v}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS, choices=list(CONFIGS))
    ap.add_argument("--reps", type=int, default=4, help="processes per system and configuration (order alternates)")
    ap.add_argument("--steps", type=int, default=None, help="measured steps per process (default: per config)")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up steps per process (default: per config)")
    ap.add_argument("--smollm2-reps", type=int, default=2, help="processes per system for the SmolLM2 configurations")
    ap.add_argument(
        "--systems",
        nargs="+",
        choices=list(SYSTEMS),
        default=list(SYSTEMS),
        help="the systems to measure (default: all; those needing vLLM only where it is installed)",
    )
    ap.add_argument("--no-levers", action="store_true", help="skip the per-lever table (tiny, creditbench only)")
    ap.add_argument("--lever-reps", type=int, default=3, help="processes for the per-switch table")
    ap.add_argument("--lever-rounds", type=int, default=4, help="measured steps per variant per process")
    ap.add_argument("--out", default=str(ROOT / "results" / "perf"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.child:
        return child(ns)

    peak, peak16, bw = matmul_peak(), matmul_peak(dtype="bfloat16"), memory_bandwidth()
    print(f"machine: {machine()}\nmatmul peak ({THREADS} threads): float32 {peak / 1e9:.1f} GFLOP/s, bfloat16 "
          f"{peak16 / 1e9:.1f} GFLOP/s; read bandwidth {bw / 1e9:.1f} GB/s", flush=True)  # fmt: skip
    override = {k: v for k, v in (("steps", ns.steps), ("warmup", ns.warmup)) if v is not None}
    rows, lever_rows, checks, raw, failures = [], [], {}, {}, {}
    from bench.engine import vllm as V

    have_vllm = V.available()
    if not have_vllm:
        print(f"vLLM is not installed: the vLLM rows are left out ({V.INSTALL})", flush=True)
    for name in ns.configs:
        c = {**CONFIGS[name], **override}
        folder = model_folder(c["model"])
        systems = [k for k in SYSTEMS if k in ns.systems and (k not in NEEDS_VLLM or have_vllm)]
        res = {k: [] for k in systems}
        for rep in range(ns.smollm2_reps if c["model"] != "tiny" else ns.reps):
            for system in systems if rep % 2 == 0 else systems[::-1]:
                t0 = time.perf_counter()
                switches = SYSTEMS[system]
                peer = {None: "trl", "vllm": "trl-vllm", "bf16": "trl-bf16"}
                kind = "creditbench" if isinstance(switches, dict) else peer[switches]
                try:
                    r = spawn(kind, c, folder, switches if isinstance(switches, dict) else None)
                except RuntimeError as e:  # TRL's vLLM mode on this CPU: recorded, not fatal
                    if kind != "trl-vllm":
                        raise
                    failures[system] = str(e).splitlines()[-1][:300]
                    print(f"[{name}] {system}: did not run: {failures[system]}", flush=True)
                    res.pop(system, None)
                    systems = [k for k in systems if k != system]
                    continue
                res[system].append(r)
                med = statistics.median(s["step"] for s in r["steps"])
                print(
                    f"[{name}] rep {rep} {system:30s} median step {med:.2f}s  peak RSS {r['peak_rss_mib']:.0f} MiB  "
                    f"({time.perf_counter() - t0:.0f}s)",
                    flush=True,
                )
        s = {k: summarise(v, c["P"] * c["G"]) for k, v in res.items()}
        raw[name] = {"config": c, "folder": str(folder), **res}
        rows.append((name, c, s))
        if "trl" in res:
            checks[name] = res["trl"][0]["loss_check"]
        print(table([(name, c, s)], peak, bw, peak16), flush=True)
    if not ns.no_levers and "tiny" in ns.configs:
        lever_rows = levers({**CONFIGS["tiny"], **override}, ns.lever_reps, ns.lever_rounds)
        raw["levers"] = lever_rows
        print(lever_table(lever_rows), flush=True)
    peak = max(peak, matmul_peak())  # the machine is shared: the best of before and after
    peak16 = max(peak16, matmul_peak(dtype="bfloat16"))
    bw = max(bw, memory_bandwidth())
    raw["matmul_peak_flops"], raw["read_bandwidth_bytes_per_s"] = peak, bw
    raw["matmul_peak_bf16_flops"] = peak16
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    text = report(rows, lever_rows, peak, checks, bw, failures, have_vllm, peak16)
    (out / "bench.md").write_text(text)
    (out / "bench.json").write_text(json.dumps(raw, indent=1, default=str))
    print("\n" + text + f"\nwrote {out / 'bench.md'} and {out / 'bench.json'}")


def levers(c: dict, reps: int, rounds: int) -> list[tuple[str, dict]]:
    """creditbench alone on the tiny configuration: all switches off (the plain path), each one on by itself, all on
    (the defaults), and all on plus each opt-in switch.
    The variants take turns step by step inside each process (one warm-up round, then ``rounds``), so a change in the
    machine's load hits them all alike; the order is reversed in every other process."""
    folder = model_folder("tiny")
    off = {k: False for k in SWITCHES}  # every variant sets every switch: the schedule changes them step by step
    on = {**off, **{k: True for k in LEVERS}}
    variants = [("plain (all off)", off)] + [(f"+ {k}", {**off, k: True}) for k in LEVERS]
    variants.append(("all on", on))
    variants += [(f"all on + {k} (opt-in)", {**on, k: True}) for k in OPT_IN]
    n = len(variants)
    res: dict[str, list] = {label: [] for label, _ in variants}
    for rep in range(reps):
        order = list(range(n)) if rep % 2 == 0 else list(range(n))[::-1]
        r = spawn(
            "creditbench", {**c, "warmup": n, "steps": n * rounds}, folder, schedule=[variants[i][1] for i in order]
        )
        for i in range(n):  # one result per variant, with that variant's steps
            steps = [st for st in r["steps"] if st["variant"] == i]
            res[variants[order[i]][0]].append({**r, "steps": steps})
        meds = [statistics.median(st["step"] for st in r["steps"] if st["variant"] == i) for i in range(n)]
        print(f"[levers] rep {rep}: " + ", ".join(f"{variants[order[i]][0]} {meds[i]:.2f}s" for i in range(n)))
    return [(label, summarise(res[label], c["P"] * c["G"])) for label, _ in variants]


INERT = 0.5
"""The largest share of zero-variance groups (every advantage 0) at which a speed-up is reported: above it a step
trains almost nothing, and a system that skips those rows is faster for doing no work."""


def speedup(s: dict, system: str, trl: str) -> str:
    """This row's speed-up over TRL at the same precision, or why there is none."""
    inert = s["creditbench"]["zero_var_frac"]
    if inert > INERT:
        return f"not reported: {100 * inert:.0f}% of groups inert"
    return f"{s[trl]['step'] / s[system]['step']:.2f}x" if trl in s else "–"


def table(rows, peak: float, bw: float, peak16: float = math.nan) -> str:
    head = (
        "| config | system | step (s) | generation (s) | scoring (s) | update (s) | completion tok/step "
        "| completion tok/s | peak RSS (MiB) | nominal GFLOP/s (% of float32 matmul peak) "
        "| update's nominal GFLOP/s (% of bfloat16 matmul peak) | decode MB read / token "
        "| generation at the bandwidth floor (s) (% of measured) | weight sync (s) "
        "| speed-up vs TRL (same precision) |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for name, _, s in rows:
        for system in SYSTEMS:
            if system not in s:
                continue
            x = s[system]
            trl = "trl, bf16" if "bf16" in system else "trl"
            floor = x["decode_bytes"] / bw
            lines.append(
                f"| {name} | {system} | {x['step']:.2f} | {x['generation']:.2f} | {x['scoring']:.3f} "
                f"| {x['update']:.2f} | {x['tokens_per_step']:.0f} | {x['tokens_per_s']:.0f} | {x['peak_rss_mib']:.0f} "
                f"| {x['flops_per_s'] / 1e9:.1f} ({100 * x['flops_per_s'] / peak:.0f}%) "
                f"| {x['update_flops_per_s'] / 1e9:.1f} ({100 * x['update_flops_per_s'] / peak16:.0f}%) "
                f"| {x['decode_bytes'] / x['tokens_per_step'] / 1e6:.1f} "
                f"| {floor:.2f} ({100 * floor / x['generation']:.0f}%) | {x['weight_sync']:.2f} "
                f"| {speedup(s, system, trl)} |"
            )
    return head + "\n".join(lines)


def lever_table(rows) -> str:
    base = rows[0][1]["step"]
    head = (
        "| variant | step (s) | generation (s) | update (s) | completion tok/s | speed-up vs plain |\n"
        "|---|---|---|---|---|---|\n"
    )
    return head + "\n".join(
        f"| {label} | {s['step']:.2f} | {s['generation']:.2f} | {s['update']:.2f} | {s['tokens_per_s']:.0f} "
        f"| {base / s['step']:.2f}x |"
        for label, s in rows
    )


SYNTHETIC = " (TRL's advantages were all 0, which would make the check vacuous: N(0,1) advantages instead)"


def report(rows, lever_rows, peak: float, checks: dict, bw: float, failures: dict, have_vllm: bool,
           peak16: float = math.nan) -> str:  # fmt: skip
    cfg_lines = "\n".join(
        f"- **{name}**: model `{c['model']}`, task `{' '.join([c['task'], *c.get('args', [])])}`, "
        f"P = {c['P']} prompts x G = {c['G']} completions, "
        f"{c['T']} max new tokens, temperature 1.0, lr {c['lr']}, beta 0, 1 optimizer step per rollout, "
        f"micro-batch {c['micro']}; {c['warmup']} warm-up + {c['steps']} measured steps per process, "
        f"{s['creditbench']['n_steps']} measured steps per system in all; zero-variance groups (median) "
        f"{s['creditbench']['zero_var_frac']:.2f}"
        for name, c, s in rows
    )
    check_lines = "\n".join(
        f"- **{name}**: {k['rows']} rows{SYNTHETIC if k.get('synthetic_advantages') else ''}, "
        f"TRL loss {k['loss_trl']:.6g}, creditbench loss {k['loss_creditbench']:.6g} "
        f"(|Δ| {k['abs_loss_diff']:.1e}); max |Δgrad| {k['max_abs_grad_diff']:.1e} (max |grad| {k['max_abs_grad']:.1e})"
        for name, k in checks.items()
    )
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    parts = [
        "# creditbench GRPO vs TRL GRPOTrainer, side by side",
        "",
        f"Machine: {machine()}. Matmul peak (float32 torch.matmul 2048², {THREADS} thread(s), best of the runs "
        f"before and after): {peak / 1e9:.1f} GFLOP/s; bfloat16: {peak16 / 1e9:.1f} GFLOP/s. Read bandwidth "
        "(torch.sum over 1 GiB of float32, "
        f"{THREADS} thread(s), best of before and after): {bw / 1e9:.1f} GB/s. No GPU was lent to this task: CPU only.",
        f"Generated by `make bench` (`python scripts/bench.py`) on {stamp}.",
        "",
        cfg_lines,
        "",
        "Medians over the measured steps of all processes; each system ran in its own processes, alternating with the "
        "other (order flipped each repetition), on a machine other jobs were also using (so absolute times are noisy; "
        "the ratio is the measurement). Peak RSS: the largest ru_maxrss among the system's processes. Speed-up: TRL's "
        "median step time / this row's. Update = step − generation − scoring (TRL: also its advantage and "
        "bookkeeping work; creditbench: behaviour log-probs, advantages, forward/backward, optimizer). Nominal FLOP/s: "
        "8·N·(B·mean prompt length + completion tokens) per step, the work of the plain computation (one forward per "
        "sequence token to sample, forward + backward to train; N = matmul parameters, attention scores ignored), "
        "over the step time; creditbench skips part of that work (shared prompts, zero-advantage rows), so its "
        "nominal rate can exceed the matmul peak. Rows with bf16 sampling + TIS sample from a bfloat16 copy of the "
        "policy refreshed every step (`rollout.sampler_dtype=bfloat16`) and weight each token's loss by "
        "min(π_old/μ, 2) (`algorithm.is_correction=tis`); they change the samples, so they are settings, not speed "
        "switches; the learner's float32 log π_old comes from its own update forward (`train.old_logp_from_update`: "
        "one optimizer step per rollout), so they run no more forwards than the float32 rows. Decode MB read / "
        "token: the bytes a sampling call must stream from memory while "
        "decoding (every weight once per decode step, plus the KV cache of each row the step runs; "
        "`scripts/bench.py::decode_bytes`), per completion token; the bandwidth floor is those bytes over the "
        "measured read bandwidth, the least time decoding can take on this machine, and its share of the measured "
        "generation time says how close to that limit the sampler runs (prefill and sampling arithmetic are extra).",
        "",
        table(rows, peak, bw, peak16),
        "",
        "Same loss on the same rollouts: on TRL's first micro-batch, creditbench's GRPO loss (algorithms/grpo.py, "
        "beta 0) with TRL's rows and advantages, against TRL's own loss and gradients:",
        "",
        check_lines,
    ]
    if not have_vllm:
        parts += [
            "",
            "vLLM is not installed in this environment, so the rows with the vLLM engine (creditbench's "
            "`rollout.engine=vllm` and TRL's colocate mode) are not in the table: `make install-vllm`.",
        ]
    for system, why in failures.items():
        parts += ["", f"**{system}** did not run here: {why}"]
    if lever_rows:
        parts += ["", "## Each speed switch on the tiny configuration (creditbench alone)", "", lever_table(lever_rows)]
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    main()
