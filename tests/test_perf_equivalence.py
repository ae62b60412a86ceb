"""The speed switches (rollout.share_prompt_cache, rollout.compact_finished, rollout.static_cache,
rollout.logp_from_sampler, train.skip_zero_adv, train.trim_padding, train.share_prompt_forward) change the cost of a
step, never what it computes: same samples, same loss, same gradients and the same parameters after the update as
the plain path on the same rollouts."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf

from bench import ROOT
from bench.config import compose
from bench.engine.policy import completion_logprobs, load_policy
from bench.engine.rollout import Rollout, generate
from bench.registry import ALGORITHMS, TASKS

SMALL = [
    "model.hidden_size=32",
    "model.num_layers=2",
    "model.num_heads=2",
    "model.intermediate_size=64",
    "model.dtype=float64",
    "algorithm.beta=0",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=12",
    "train.micro_batch_size=3",
]
SCORES = [1, 0, 0, 1] + [0, 0, 0, 0] + [1, 1, 0, 1] + [1, 1, 1, 1]  # two zero-variance groups, two mixed
FAST = {
    "rollout.share_prompt_cache": True,
    "rollout.compact_finished": True,
    "rollout.static_cache": True,
    "rollout.logp_from_sampler": True,
    "train.skip_zero_adv": True,
    "train.trim_padding": True,
    "train.share_prompt_forward": True,
}


@pytest.fixture
def single_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _eos_bias(model, eos_id: int, bias: float = 2.5):
    """Make EOS likely, so rows of a group finish at different steps (what compaction and trimming act on)."""
    eos = torch.tensor([eos_id])
    return model.lm_head.register_forward_hook(lambda m, i, o: o.index_add(-1, eos, torch.full_like(o[..., :1], bias)))


def _module(args: list[str], fast: bool):
    cfg = compose(["algorithm=grpo", "task=countdown", *SMALL, *args, *[f"{k}={fast}" for k in FAST]])
    obj = OmegaConf.to_object(cfg)
    policy, tok = load_policy(obj.model, obj.seed)
    task = TASKS.get("countdown")(obj.task, tok, seed=0, prompts_per_step=obj.rollout.prompts_per_step)
    _eos_bias(policy, tok.eos_token_id)  # for the sampler and the trainer alike
    module = ALGORITHMS.get("grpo")(obj, policy, tok, task)
    return module, task


class _Recorder:
    """An optimizer that records each step's gradients, standing in for Lightning's optimizer wrapper. SGD by default
    (parameters then differ by lr x the gradient difference; Adam would amplify 1e-12 noise on ~0 gradients)."""

    def __init__(self, params, lr, adamw: bool = False):
        self.params = list(params)
        self.opt = (torch.optim.AdamW if adamw else torch.optim.SGD)(self.params, lr=lr)
        self.grads: list[list[torch.Tensor]] = []

    @property
    def param_groups(self):  # read by the update for the parameters whose gradients are synced across ranks
        return self.opt.param_groups

    def zero_grad(self, set_to_none=True):
        self.opt.zero_grad(set_to_none=set_to_none)

    def step(self):
        self.grads.append([p.grad.detach().clone() for p in self.params])
        self.opt.step()


class _Sched:
    def step(self):
        pass

    def get_last_lr(self):
        return [0.0]


def _drive(module, task, steps: int, adamw: bool = False):
    """``steps`` x (sample -> behaviour log-probs -> rewards -> advantages -> update), outside Lightning, scores fixed
    to SCORES; -> (rollouts, update stats, recorder of gradients)."""
    rec = _Recorder(module.policy.parameters(), lr=1e-2, adamw=adamw)
    module.optimizers = lambda: rec
    module.lr_schedulers = lambda: _Sched()
    module.manual_backward = lambda loss: loss.backward()
    rollouts, stats = [], []
    for step in range(steps):
        module.step_count, module.step_stats = step, {}
        ro = _rollout(module, task, SCORES)
        module.behaviour_logprobs(ro)
        module.correct_behaviour(ro)
        module.shape_rewards(ro)
        ro.adv = module.advantages(ro)
        stats.append({**module.step_stats, **module.update(ro)})
        rollouts.append(ro)
    return rollouts, stats, rec


def _rollout(module, task, scores: list[float]) -> Rollout:
    """The module's own rollout of P fixed prompts (seeds from its step count), with the scores set, not scored: a
    random model scores 0 everywhere."""
    batch = task.sample_prompts(module.cfg.rollout.prompts_per_step, (0, 0, 0))
    ro = module.make_rollout(batch)
    ro.scores = torch.tensor(scores, dtype=torch.float64)
    return ro


@pytest.mark.parametrize(
    "switches",
    [
        dict(share_prompt_cache=True, compact_finished=True),
        dict(static_cache=True),
        dict(static_cache=True, compact_finished=True),
        dict(share_prompt_cache=True, compact_finished=True, static_cache=True),
    ],
    ids=lambda d: "+".join(d),
)
def test_fast_sampler_gives_the_same_samples(single_thread, switches):
    """Sharing the prompt's KV cache, dropping finished rows and decoding into a preallocated (static) cache leave
    every token, mask and sampler log-prob of every row unchanged (rows finish at different steps; prompts have
    different left padding)."""
    model, tok = load_policy(compose(["algorithm=grpo", "task=countdown", *SMALL]).model, seed=0)
    model.eval()
    handle = _eos_bias(model, tok.eos_token_id)
    enc = tok(["nums 1 2 target 3\n", "ab\n", "hello world\n"], padding=True, return_tensors="pt", padding_side="left")
    kw = dict(
        group_size=4,
        max_new_tokens=16,
        temperature=0.9,
        top_p=0.95,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        seeds=[1, 2, 3],
    )
    plain = generate(model, enc.input_ids, enc.attention_mask, **kw)
    fast = generate(model, enc.input_ids, enc.attention_mask, **switches, **kw)
    handle.remove()
    assert len(set(plain.lengths.tolist())) > 2, f"rows should finish at different steps: {plain.lengths.tolist()}"
    assert torch.equal(plain.completion_ids, fast.completion_ids), (plain.completion_ids, fast.completion_ids)
    assert torch.equal(plain.mask, fast.mask) and torch.equal(plain.truncated, fast.truncated)
    gap = (plain.sampler_logp - fast.sampler_logp).abs().max().item()
    assert gap <= 1e-10, f"sampler log-probs differ by {gap}"


def test_sampler_logp_matches_the_training_forward(single_thread):
    """The fast sampler's log-probs equal the training forward's (what rollout.logp_from_sampler relies on)."""
    module, task = _module([], fast=True)
    ro = _rollout(module, task, [0.0] * 16)
    with torch.no_grad():
        logp, _ = completion_logprobs(module.policy, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.mask, 1.0)
    gap = ((logp - ro.sampler_logp).abs() * ro.mask).max().item()
    assert gap <= 1e-10, f"float64 sampler vs trainer log-prob gap {gap}"


@pytest.mark.parametrize(
    "args",
    [
        [],  # one optimizer step per rollout (the benchmark's setting)
        ["train.ppo_epochs=2", "train.minibatch_size=8"],  # minibatches and a second epoch: ratios != 1
        ["rollout.temperature=0.7", "algorithm.loss_agg=token-mean"],
    ],
    ids=["one-step", "epochs-minibatches", "temp-token-mean"],
)
def test_fast_update_equals_plain_update(single_thread, args):
    """Over two training steps from the same weights, the fast path (shared prompt cache, compacted decoding, log π_old
    from the sampler after the first step's check, zero-advantage rows skipped, length-sorted trimmed micro-batches)
    samples the same completions and gives the plain path's loss and every optimizer step's gradients to 1e-5, hence
    the same parameters. (float64 model, but transformers' RMSNorm computes in float32: gradients summed over a
    group before that norm, as the shared prompt forward does, differ from per-row sums by ~1e-7 relative.)"""
    plain_mod, task = _module(args, fast=False)
    fast_mod, _ = _module(args, fast=True)
    fast_mod.policy.load_state_dict(plain_mod.policy.state_dict())
    plain_ro, plain, rec_p = _drive(plain_mod, task, steps=2)
    fast_ro, fast, rec_f = _drive(fast_mod, task, steps=2)
    assert fast_mod.sampler_logp_ok is True, "the first step's check should accept the sampler's log-probs"
    assert fast_ro[1].old_logp is fast_ro[1].sampler_logp, "the second step should take log π_old from the sampler"
    assert plain_ro[1].old_logp is not plain_ro[1].sampler_logp
    for step, (rp, rf, sp, sf) in enumerate(zip(plain_ro, fast_ro, plain, fast, strict=True)):
        assert len(set(rp.lengths.tolist())) > 2, f"step {step}: lengths should vary: {rp.lengths.tolist()}"
        assert torch.equal(rp.completion_ids, rf.completion_ids), f"step {step}: samples differ"
        assert abs(sp["loss/total"] - sf["loss/total"]) <= 1e-5, (step, sp["loss/total"], sf["loss/total"])
        assert sp["stats/optimizer_steps"] == sf["stats/optimizer_steps"]
    assert len(rec_p.grads) == len(rec_f.grads) >= 2
    names = [n for n, _ in plain_mod.policy.named_parameters()]
    for i, (step_p, step_f) in enumerate(zip(rec_p.grads, rec_f.grads, strict=True)):
        assert max(g.abs().max().item() for g in step_p) > 1e-6, f"optimizer step {i}: trivially zero gradient"
        for n, gp, gf in zip(names, step_p, step_f, strict=True):
            diff = (gp - gf).abs().max().item()
            assert diff <= 1e-5, f"optimizer step {i}, {n}: max |Δgrad| {diff} (|grad| max {gp.abs().max().item()})"
    for (n, a), b in zip(plain_mod.policy.named_parameters(), fast_mod.policy.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-7, rtol=0), f"{n}: parameters differ after two steps"


@pytest.mark.parametrize("correction", ["tis", "none"])
def test_old_logp_from_the_update_equals_a_behaviour_forward(single_thread, correction):
    """Sampling from a bfloat16 copy (so log μ ≠ log π_old and the sampler's log-probs cannot stand in), one optimizer
    step per rollout: log π_old from the update's own forward (train.old_logp_from_update, no behaviour forward) gives
    the behaviour forward's TIS weights, loss and gradients to 1e-5 over two steps, and the same mismatch statistics."""
    args = ["rollout.sampler_dtype=bfloat16", f"algorithm.is_correction={correction}"]
    sep_mod, task = _module(["train.old_logp_from_update=false", *args], fast=True)
    fused_mod, _ = _module(["train.old_logp_from_update=true", *args], fast=True)
    for m in (sep_mod, fused_mod):  # every row runs, so the fused path's statistics cover the same tokens
        m.cfg.train.skip_zero_adv = False
    fused_mod.policy.load_state_dict(sep_mod.policy.state_dict())
    forwards = {}  # training-mode forwards of each policy (the sampler's copy is another module)
    for name, m in (("separate", sep_mod), ("fused", fused_mod)):
        forwards[name] = 0
        m.policy.register_forward_hook(lambda *a, n=name: forwards.__setitem__(n, forwards[n] + 1))
    sep_ro, sep, rec_s = _drive(sep_mod, task, steps=2)
    fused_ro, fused, rec_f = _drive(fused_mod, task, steps=2)
    assert all(ro.old_logp is None for ro in fused_ro) and all(ro.old_logp is not None for ro in sep_ro)
    assert forwards["fused"] < forwards["separate"], forwards  # the behaviour forward is not run at all
    for step, (rs, rf, ss, sf) in enumerate(zip(sep_ro, fused_ro, sep, fused, strict=True)):
        assert torch.equal(rs.completion_ids, rf.completion_ids), f"step {step}: samples differ"
        assert abs(ss["loss/total"] - sf["loss/total"]) <= 1e-5, (step, ss["loss/total"], sf["loss/total"])
        for key in ("rollout/is_weight_mean", "rollout/mismatch_kl"):
            assert abs(ss[key] - sf[key]) <= 1e-5 if key in ss else key not in sf, (step, key, ss.get(key), sf)
    for i, (step_s, step_f) in enumerate(zip(rec_s.grads, rec_f.grads, strict=True)):
        assert max(g.abs().max().item() for g in step_s) > 1e-6, f"optimizer step {i}: trivially zero gradient"
        for gs, gf in zip(step_s, step_f, strict=True):
            assert (gs - gf).abs().max().item() <= 1e-5, f"optimizer step {i}"


def test_all_zero_advantage_step_still_steps_the_optimizer(single_thread):
    """When every row is skipped the optimizer still steps on zero gradients (AdamW's moments and weight decay move
    the parameters exactly as the plain path's zero gradient does)."""
    global SCORES
    saved, SCORES = SCORES, [1.0] * 8 + [0.0] * 8
    try:
        plain_mod, task = _module([], fast=False)
        fast_mod, _ = _module([], fast=True)
        fast_mod.policy.load_state_dict(plain_mod.policy.state_dict())
        _, plain, _ = _drive(plain_mod, task, steps=2, adamw=True)
        _, fast, _ = _drive(fast_mod, task, steps=2, adamw=True)
    finally:
        SCORES = saved
    assert [s["stats/optimizer_steps"] for s in fast] == [s["stats/optimizer_steps"] for s in plain] == [1, 1]
    for (n, a), b in zip(plain_mod.policy.named_parameters(), fast_mod.policy.parameters(), strict=True):
        assert torch.equal(a, b), f"{n}: parameters differ"


@pytest.mark.slow
def test_bench_script_smoke(tmp_path):
    """scripts/bench.py runs one warm-up-free step of creditbench and TRL on the tiny configuration and writes its
    table (the vLLM rows start an engine each, minutes on CPU: tests/test_vllm.py covers that engine)."""
    if importlib.util.find_spec("trl") is None:
        pytest.skip("trl is not installed (the bench extra: make install, or pip install -e '.[bench]')")
    cmd = [sys.executable, str(ROOT / "scripts" / "bench.py"), "--configs", "tiny", "--reps", "1", "--steps", "1"]
    cmd += ["--warmup", "0", "--no-levers", "--systems", "creditbench", "trl", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = (tmp_path / "bench.md").read_text()
    assert "| tiny | creditbench |" in text and "| tiny | trl |" in text, text
