"""Off-policy and training-inference mismatch (bench/engine/behaviour.py, the corrections and shipped surrogates of
bench/rl/objective.py): hand-computed golden values, the reductions to the simpler algorithm each generalises (loss
and gradient to 1e-6), and agreement with verl's and TRL's own loss code on the same tensors."""

from __future__ import annotations

import importlib.util
import math
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from bench.config import compose
from bench.engine.behaviour import BehaviourPolicy
from bench.engine.policy import load_policy
from bench.registry import ALGORITHMS, TASKS
from bench.rl import losses as L
from bench.rl.objective import PolicyGradientConfig, behaviour_weights, policy_loss
from tests.conftest import SMALL

TOL = dict(atol=1e-6, rtol=1e-6)
INF = float("inf")
t = lambda *v: torch.tensor(v, dtype=torch.float64)  # noqa: E731


def config(name: str, **kw) -> PolicyGradientConfig:
    return replace(ALGORITHMS.get(name).Config(), **kw)


def loss_and_grad(cfg, logp, old, adv, mask, **kw):
    """The aggregated policy loss and its gradient w.r.t. log π_θ."""
    leaf = logp.detach().clone().requires_grad_(True)
    loss, _ = policy_loss(leaf, old, adv, mask, cfg, L.Norm.of(mask), **kw)
    (grad,) = torch.autograd.grad(loss, leaf)
    return loss.detach(), grad


def batch(seed: int, B: int = 8, T: int = 6, spread: float = 0.3):
    """Log-probs with π_θ, π_old and μ a little apart, prefix masks, one group of B."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2 - 0.05
    old = logp + spread * torch.randn(B, T, generator=g, dtype=torch.float64)
    mu = old + spread * torch.randn(B, T, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T) < lengths[:, None]).double()
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    return logp, old, mu, mask, adv


# ---- golden values (hand-computed in the comments) -------------------------------------------------------------------
def test_behaviour_weights_golden():
    ln = math.log
    old = t(ln(3.0), ln(0.5), 0.0).view(1, 3)  # π_old/μ = 3, 0.5, 1 with μ = 1 (log μ = 0)
    mu, m = torch.zeros(1, 3, dtype=torch.float64), torch.ones(1, 3, dtype=torch.float64)
    assert L.token_tis(old, mu, m, 2.0).flatten().tolist() == pytest.approx([2.0, 0.5, 1.0])  # min(k, 2)
    # Π k = 1.5: sequence TIS min(1.5, 5) = 1.5, min(1.5, 1.2) = 1.2, on every token
    assert L.sequence_tis(old, mu, m, 5.0).flatten().tolist() == pytest.approx([1.5] * 3)
    assert L.sequence_tis(old, mu, m, 1.2).flatten().tolist() == pytest.approx([1.2] * 3)
    # Seq-MIS: 1.5 ∈ [0.5, 2] keeps its weight 1.5; with band [0.5, 1.4] the sequence is rejected (0)
    assert L.sequence_masked_is(old, mu, m, 0.5, 2.0).flatten().tolist() == pytest.approx([1.5] * 3)
    assert L.sequence_masked_is(old, mu, m, 0.5, 1.4).tolist() == [[0.0] * 3]
    # IcePop [0.5, 5]: k = 3 kept (weight 3), 0.5 kept (the band is closed), 1 kept; [0.6, 2]: 3 and 0.5 out
    assert L.icepop(old, mu, m, 0.5, 5.0).flatten().tolist() == pytest.approx([3.0, 0.5, 1.0])
    assert L.icepop(old, mu, m, 0.6, 2.0).flatten().tolist() == pytest.approx([0.0, 0.0, 1.0])
    # masked positions: weight 1 (token ratio exp(0)), and a NaN there never leaks
    m2 = t(1.0, 1.0, 0.0).view(1, 3)
    old_nan = old.clone()
    old_nan[0, 2] = float("nan")
    assert L.token_tis(old_nan, mu, m2, 2.0).flatten().tolist() == pytest.approx([2.0, 0.5, 1.0])


def test_m2po_mask_golden():
    # Δ = 0.5, 0.1, 0, 0.2 -> Δ² = 0.25, 0.01, 0, 0.04: mean 0.075 ≥ 0.04; without the 0.25: 0.05/3 = 0.0167 < 0.04
    old = t(0.5, 0.1, 0.0, 0.2).view(1, 4)
    mu, m = torch.zeros_like(old), torch.ones_like(old)
    assert L.m2po_mask(old, mu, m, 0.04).tolist() == [[0.0, 1.0, 1.0, 1.0]]
    # τ = 0.01: also drop 0.04 (rest 0.01/2 = 0.005 < 0.01); τ = 0.1: nothing (mean 0.075 < 0.1)
    assert L.m2po_mask(old, mu, m, 0.01).tolist() == [[0.0, 1.0, 1.0, 0.0]]
    assert L.m2po_mask(old, mu, m, 0.1).tolist() == [[1.0] * 4]
    # a masked position never counts, however large its Δ²
    m = t(1.0, 1.0, 1.0, 0.0).view(1, 4)
    old[0, 3] = 50.0
    assert L.m2po_mask(old, mu, m, 0.04).tolist() == [[0.0, 1.0, 1.0, 1.0]]
    # every Δ² ≥ τ (0.25, 0.09, 0.16 against τ 0.04): AReaL keeps the single smallest (0.09), it never masks all
    old, m = t(0.5, 0.3, 0.4).view(1, 3), torch.ones(1, 3)
    assert L.m2po_mask(old, torch.zeros_like(old), m, 0.04).tolist() == [[0.0, 1.0, 0.0]]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), tau=st.floats(1e-4, 0.5))
def test_m2po_masks_the_fewest_largest_tokens(seed, tau):
    """Property: after masking, the mean Δ² of the kept tokens is < τ (or only the smallest is kept, when every Δ² ≥ τ),
    every masked Δ² is ≥ every kept one, and keeping the smallest masked token back would break the bound."""
    _, old, mu, mask, _ = batch(seed, spread=0.3)
    keep = L.m2po_mask(old, mu, mask, tau)
    d2 = (old - mu).square()
    valid = mask.bool()
    kept, dropped = d2[valid & (keep == 1)], d2[valid & (keep == 0)]
    assert (keep[~valid] == 1).all()
    assert len(kept) >= 1 or not valid.any()
    if len(kept) == 1 and len(dropped):  # either it alone is under τ, or every Δ² ≥ τ and it is the smallest
        assert kept.item() < tau or kept.item() <= dropped.min()
    elif len(kept):
        assert kept.mean() < tau
    if len(kept) > 1 and len(dropped):
        assert dropped.min() >= kept.max()
        assert torch.cat([kept, dropped.min().view(1)]).mean() >= tau


def test_cispo_gmpo_dual_clip_minirl_golden():
    m = torch.ones(1, 1, dtype=torch.float64)
    # CISPO, ρ = 3, A = 1, cap 1 + 0.2: loss −1.2·1·log π_θ; log π_θ = log 0.3, so 1.2·1.2039728 = 1.4447674
    logp = t(math.log(0.3)).view(1, 1)
    old = logp - math.log(3.0)
    loss, grad = loss_and_grad(config("cispo", clip_eps_high=0.2), logp, old, t(1.0), m)
    assert loss.item() == pytest.approx(-1.2 * math.log(0.3), abs=1e-12)
    assert grad.item() == pytest.approx(-1.2, abs=1e-12)  # the weight's clip never removes the gradient
    # GMPO, c = 0.4, Δ = (0.5, −0.1): A = +1 -> Δ̃ = (0.4, −0.1), loss −exp(0.15); A = −1 -> Δ̃ = (0.5, −0.1), +exp(0.2)
    m2 = torch.ones(1, 2, dtype=torch.float64)
    logp2 = t(-1.0, -2.0).view(1, 2)
    old2 = logp2 - t(0.5, -0.1).view(1, 2)
    assert loss_and_grad(config("gmpo"), logp2, old2, t(1.0), m2)[0].item() == pytest.approx(-math.exp(0.15))
    assert loss_and_grad(config("gmpo"), logp2, old2, t(-1.0), m2)[0].item() == pytest.approx(math.exp(0.2))
    # dual-clip, A = −1, ρ = 5, ε = 0.2: min(ρA, clip·A) = −5; with c = 3 bounded at −3: loss 3, no gradient
    cfg = config("grpo", beta=0.0, clip_ratio_c=3.0)
    loss, grad = loss_and_grad(cfg, t(math.log(5.0)).view(1, 1), torch.zeros(1, 1, dtype=torch.float64), t(-1.0), m)
    assert loss.item() == pytest.approx(3.0) and grad.item() == 0.0
    off = loss_and_grad(replace(cfg, clip_ratio_c=None), t(math.log(5.0)).view(1, 1), 0 * m, t(-1.0), m)[0]
    assert off.item() == pytest.approx(5.0)
    # MiniRL: π_θ/μ = 20 capped at C = 10; ρ = π_θ/π_old = 1.1 inside 1 + 0.2: loss −A·10·log π_θ = −10·log 0.2
    lp = t(math.log(0.2)).view(1, 1)
    loss, grad = loss_and_grad(config("minirl"), lp, lp - math.log(1.1), t(1.0), m, sampler_logp=lp - math.log(20.0))
    assert loss.item() == pytest.approx(-10 * math.log(0.2)) and grad.item() == pytest.approx(-10.0)
    # ρ = 1.3 > 1.2 with A > 0: masked (loss and gradient 0); with A < 0 it is not (only ρ < 0.8 masks then)
    loss, grad = loss_and_grad(config("minirl"), lp, lp - math.log(1.3), t(1.0), m, sampler_logp=lp)
    assert loss.item() == 0.0 and grad.item() == 0.0
    assert loss_and_grad(config("minirl"), lp, lp - math.log(1.3), t(-1.0), m, sampler_logp=lp)[1].item() == 1.0


def test_kl_cov_and_clip_cov_golden():
    # A = (1, −1), log π = (−1, −3) on two one-token rows: means 0 and −2, Cov = (1·1, −1·−1) = (1, 1)
    logp, adv, m = t(-1.0, -3.0).view(2, 1), t(1.0, -1.0).view(2, 1), torch.ones(2, 1, dtype=torch.float64)
    assert L.covariance(adv, logp, m).flatten().tolist() == [1.0, 1.0]
    # KL-Cov with r = 0.5: k = 1 token, the first of the tie; its loss −ρA + λ|Δ|, Δ = 0.2: −e^0.2 + 0.2
    old = logp - 0.2
    loss, _ = policy_loss(logp, old, adv.squeeze(1), m, config("kl_cov", kl_cov_ratio=0.5), L.Norm.of(m))
    assert loss.item() == pytest.approx(((-math.exp(0.2) + 0.2) + math.exp(0.2)) / 2)
    # Clip-Cov: Cov = (1, 1) is not strictly inside (1, 5): no token is chosen; with lb = 0.5 one is (r·N < 1 -> 1)
    cov = L.covariance(adv, logp, m)
    none_clipped = torch.zeros(2, 1, dtype=torch.bool)
    assert L.clip_cov_keep(cov, none_clipped, m, 2e-4, 1.0, 5.0).sum() == 2
    assert L.clip_cov_keep(cov, none_clipped, m, 2e-4, 0.5, 5.0).sum() == 1
    assert L.clip_cov_keep(cov, torch.ones(2, 1, dtype=torch.bool), m, 2e-4, 0.5, 5.0).sum() == 2  # clipped: spared


def test_prompt_mean_golden_and_micro_batch_invariant():
    # prompt 0: rows of 1 and 3 tokens, loss 1 per token -> (1 + 3)/4 = 1; prompt 1: 2 and 2 tokens, loss 2 -> 2
    mask = t(1, 0, 0, 1, 1, 1, 1, 1, 0, 1, 1, 0).view(4, 3)
    loss_mat = torch.tensor([[1.0] * 3, [1.0] * 3, [2.0] * 3, [2.0] * 3], dtype=torch.float64)
    groups = torch.tensor([0, 0, 1, 1])
    norm = L.Norm.of(mask, groups=groups)
    assert L.agg_loss(loss_mat, mask, "prompt-mean", norm, groups).item() == pytest.approx(1.5)
    parts = sum(L.agg_loss(loss_mat[i], mask[i], "prompt-mean", norm, groups[i]) for i in ([0, 2], [1], [3]))
    assert parts.item() == pytest.approx(1.5, abs=1e-12)
    with pytest.raises(ValueError, match="prompt-mean needs"):
        L.agg_loss(loss_mat, mask, "prompt-mean", L.Norm.of(mask))


def test_log_ratio_cap_bounds_the_ratio_and_cuts_its_gradient():
    m = torch.ones(1, 2, dtype=torch.float64)
    logp, old = t(-1.0, -1.0).view(1, 2), t(-31.0, -1.5).view(1, 2)  # Δ = 30 (capped at 20), 0.5
    cfg = config("grpo", beta=0.0, trust_region="none", log_ratio_cap=20.0)
    loss, grad = loss_and_grad(cfg, logp, old, t(1.0), m)
    assert loss.item() == pytest.approx(-(math.exp(20.0) + math.exp(0.5)) / 2)
    assert grad[0, 0].item() == 0.0 and grad[0, 1].item() == pytest.approx(-math.exp(0.5) / 2)


# ---- reductions (loss and gradient to 1e-6) ----------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_cispo_with_infinite_cap_on_policy_is_token_mean_reinforce(seed):
    logp, _, _, mask, adv = batch(seed)
    cispo = config("cispo", clip_eps_high=INF)
    reinforce = config("grpo", ratio="none", trust_region="none", loss_agg="token-mean", beta=0.0)
    a = loss_and_grad(cispo, logp, logp.detach(), adv, mask)
    b = loss_and_grad(reinforce, logp, logp.detach(), adv, mask)
    torch.testing.assert_close(a, b, **TOL)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_corrections_reduce_to_no_correction(seed):
    """TIS with C = ∞ and μ = π_old is no correction; a band of [0, ∞] is no mask (IcePop = token IS, Seq-MIS =
    sequence IS); M2PO with μ = π_old masks nothing."""
    logp, old, mu, mask, adv = batch(seed)
    cfg = config("grpo", beta=0.0)
    plain = loss_and_grad(cfg, logp, old, adv, mask)
    for name, kw in (("tis", dict(tis_cap=INF)), ("seq_tis", dict(seq_tis_cap=INF)), ("m2po", {})):
        w, _ = behaviour_weights(replace(cfg, is_correction=name, **kw), old, old, mask)
        torch.testing.assert_close(loss_and_grad(cfg, logp, old, adv, mask, is_weight=w), plain, **TOL)
    pairs = (
        (dict(is_correction="icepop", icepop_low=0.0, icepop_high=INF), dict(is_correction="tis", tis_cap=INF)),
        (dict(is_correction="seq_mask", mis_low=0.0, mis_high=INF), dict(is_correction="seq_tis", seq_tis_cap=INF)),
    )
    for band, unmasked in pairs:
        w1, _ = behaviour_weights(replace(cfg, **band), old, mu, mask)
        w2, _ = behaviour_weights(replace(cfg, **unmasked), old, mu, mask)
        torch.testing.assert_close(w1, w2, **TOL)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), c=st.floats(0.05, 1.0))
def test_gmpo_on_one_token_completions_is_token_ratio_grpo(seed, c):
    logp, old, _, _, adv = batch(seed, T=1, spread=0.6)
    mask = torch.ones_like(logp)
    gmpo = config("gmpo", gmpo_clip=c)
    grpo = config("grpo", beta=0.0, clip_eps_low=1 - math.exp(-c), clip_eps_high=math.exp(c) - 1)
    torch.testing.assert_close(
        loss_and_grad(gmpo, logp, old, adv, mask), loss_and_grad(grpo, logp, old, adv, mask), **TOL
    )


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_minirl_on_policy_is_token_mean_reinforce_and_dual_clip_inactive_is_clip(seed):
    logp, old, mu, mask, adv = batch(seed)
    reinforce = config("grpo", ratio="none", trust_region="none", loss_agg="token-mean", beta=0.0)
    a = loss_and_grad(config("minirl"), logp, logp.detach(), adv, mask, sampler_logp=logp.detach())
    torch.testing.assert_close(a, loss_and_grad(reinforce, logp, logp.detach(), adv, mask), **TOL)
    grpo = config("grpo", beta=0.0)
    huge = loss_and_grad(replace(grpo, clip_ratio_c=1e9), logp, old, adv, mask)
    torch.testing.assert_close(huge, loss_and_grad(grpo, logp, old, adv, mask), **TOL)


# ---- the behaviour policy: staleness and precision -------------------------------------------------------------------
def test_behaviour_policy_samples_from_the_weights_k_steps_ago():
    lin = torch.nn.Linear(2, 2)
    frozen = torch.nn.Linear(2, 2)
    for p in frozen.parameters():
        p.requires_grad_(False)
    net = torch.nn.Sequential(lin, frozen)
    assert BehaviourPolicy("float32", 0).model(net, 0) is net  # on-policy float32: the policy itself, no copy
    b = BehaviourPolicy("float32", 2)
    seen = []
    for step in range(5):
        with torch.no_grad():
            lin.weight.fill_(float(step))  # the policy's weights at step s are all s
        model = b.model(net, step)
        assert b.model(net, step) is model  # a second sampling round of the same step changes nothing
        seen.append(model[0].weight[0, 0].item())
    assert seen == [0.0, 0.0, 0.0, 1.0, 2.0]  # max(0, s − 2)
    assert torch.equal(model[1].weight, frozen.weight) and not any(p.requires_grad for p in model.parameters())
    state = b.state_dict()
    resumed = BehaviourPolicy("float32", 2)
    resumed.load_state_dict(state, "cpu")
    with torch.no_grad():
        lin.weight.fill_(5.0)
    assert resumed.model(net, 5)[0].weight[0, 0].item() == b.model(net, 5)[0].weight[0, 0].item() == 3.0
    half = BehaviourPolicy("bfloat16", 0).model(net, 0)
    assert half[0].weight.dtype == torch.bfloat16 and lin.weight.dtype == torch.float32
    with pytest.raises(ValueError, match="sampler_dtype"):
        BehaviourPolicy("fp8", 0)


@pytest.fixture
def tiny_module(store):
    """(make(**overrides) -> a fresh GRPO module on the same random tiny model, a batch of 2 Countdown prompts)."""

    def make(**overrides):
        args = ["algorithm=grpo", "task=countdown", "algorithm.beta=0", *SMALL, *store["args"]]
        args += [f"{k}={v}" for k, v in overrides.items()]
        obj = OmegaConf.to_object(compose(args))
        policy, tok = load_policy(obj.model, obj.seed)
        task = TASKS.get("countdown")(obj.task, tok, seed=0, prompts_per_step=2)
        make.task = task
        return ALGORITHMS.get("grpo")(obj, policy, tok, task)

    make()
    return make, make.task.collate_prompts(make.task.examples("train")[:2])


def test_stale_and_low_precision_sampling_through_the_module(tiny_module):
    """staleness 1 at step 0 samples from an exact float32 copy of θ_0: the on-policy samples token for token, and
    their log μ to float32 rounding; bfloat16 sampling gives log μ that differ from the learner's float32 log π_old,
    which the module records."""
    make, batch_ = tiny_module
    on = make()
    stale = make(**{"rollout.staleness": 1})
    assert all(torch.equal(p, q) for p, q in zip(on.policy.parameters(), stale.policy.parameters(), strict=True))
    a, b = on.make_rollout(batch_), stale.make_rollout(batch_)
    assert all(
        torch.equal(p, q) for p, q in zip(on.policy.parameters(), stale.behaviour.copy.parameters(), strict=True)
    )
    assert torch.equal(a.completion_ids, b.completion_ids)
    # Not bit for bit: on some CPUs (this one: 4.8e-7 at most) the matmul kernels round the last bit of the same
    # weights differently in another allocation, so the copy's log-probs can differ by float32 rounding, no more.
    torch.testing.assert_close(a.sampler_logp, b.sampler_logp, rtol=0, atol=1e-5)
    fused = make(**{"rollout.sampler_dtype": "bfloat16", "algorithm.is_correction": "tis"})
    ro = fused.make_rollout(batch_)
    fused.behaviour_logprobs(ro)
    assert ro.old_logp is None  # one update per rollout: log π_old comes from the update's forward (perf tests)
    bf = make(
        **{"rollout.sampler_dtype": "bfloat16", "algorithm.is_correction": "tis", "train.old_logp_from_update": False}
    )
    ro = bf.make_rollout(batch_)
    bf.behaviour_logprobs(ro)
    assert ro.old_logp is not ro.sampler_logp  # the learner recomputes log π_old
    gap = ((ro.old_logp - ro.sampler_logp).abs() * ro.mask).max().item()
    assert 0 < gap < 1.0, gap
    bf.correct_behaviour(ro)
    assert ro.is_weight is not None and bf.step_stats["rollout/mismatch_logp_max"] == pytest.approx(gap, rel=1e-6)


def test_sampler_attention_gives_the_copy_its_own_kernel_and_leaves_the_policy_alone(tiny_module):
    """rollout.sampler_attention=eager: the sampler is a copy (even at staleness 0 in float32) decoding with the
    plain matmul attention while the learner keeps SDPA; in float32 the two kernels give the same log-probs to
    rounding, so the logged mismatch is ~0 (the setting changes the kernel, not the policy); a bad value names the
    choices."""
    make, batch_ = tiny_module
    on = make()
    eager = make(**{"rollout.sampler_attention": "eager", "train.old_logp_from_update": False})
    assert not eager.behaviour.is_policy and on.behaviour.is_policy
    ro = eager.make_rollout(batch_)
    sampler = eager.behaviour.model(eager.policy, eager.behaviour.step)
    assert sampler is not eager.policy and sampler.config._attn_implementation == "eager"
    assert eager.policy.config._attn_implementation == on.policy.config._attn_implementation == "sdpa"
    eager.behaviour_logprobs(ro)
    assert ((ro.old_logp - ro.sampler_logp).abs() * ro.mask).max().item() < 1e-4
    eager.correct_behaviour(ro)
    assert abs(eager.step_stats["rollout/mismatch_kl"]) < 1e-5, eager.step_stats
    with pytest.raises(ValueError, match=r"'rollout.sampler_attention'.*'flash', expected one of \['model', 'eager'"):
        make(**{"rollout.sampler_attention": "flash"})


# ---- against the peers' own code on the same tensors ---------------------------------------------------------------
# verl's wheel ships a top-level `tests` package, so `make install` puts it (with --no-deps, and the four modules its
# loss code imports) in a folder of its own, <venv>/peers, appended to sys.path only here.
PEERS = Path(sys.prefix) / "peers"
verl_missing = not (PEERS / "verl").is_dir()
needs_verl = pytest.mark.skipif(verl_missing, reason=f"verl is not installed in {PEERS} (make install puts it there)")


def _verl(loss_mode: str, **kw):
    if str(PEERS) not in sys.path:
        sys.path.append(str(PEERS))
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.workers.config.actor import ActorConfig, PolicyLossConfig

    pl = {k: kw.pop(k) for k in list(kw) if k in ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio",
                                                   "ppo_kl_coef")}  # fmt: skip
    cfg = ActorConfig(
        strategy="fsdp",
        ppo_micro_batch_size_per_gpu=1,
        rollout_n=1,
        policy_loss=PolicyLossConfig(loss_mode=loss_mode, **pl),
        **kw,
    )
    return get_policy_loss_fn(loss_mode), cfg


def _verl_loss_and_grad(loss_mode, logp, old, adv, mask, agg="token-mean", **kw):
    fn, cfg = _verl(loss_mode, **kw)
    leaf = logp.detach().clone().requires_grad_(True)
    A = adv.unsqueeze(-1).expand_as(logp) * mask
    loss, _ = fn(old, leaf, A, mask, agg, cfg)
    (grad,) = torch.autograd.grad(loss, leaf)
    return loss.detach(), grad


@needs_verl
@pytest.mark.parametrize("seed", range(5))
def test_against_verl_cispo_geo_mean_dual_clip_kl_cov(seed):
    logp, old, _, mask, adv = batch(seed, spread=0.5)
    logp, old, mask, adv = logp.float(), old.float(), mask.float(), adv.float()
    pairs = [
        (config("cispo"), ("cispo", dict(clip_ratio=0.2, clip_ratio_low=1.0, clip_ratio_high=4.0))),
        (config("cispo", clip_eps_high=0.2), ("cispo", dict(clip_ratio=0.2, clip_ratio_low=1.0, clip_ratio_high=0.2))),
        (config("gmpo"), ("geo_mean", dict(clip_ratio=0.4, clip_ratio_low=0.4, clip_ratio_high=0.4))),
        (
            config("grpo", beta=0.0, loss_agg="token-mean", clip_ratio_c=3.0),
            ("vanilla", dict(clip_ratio=0.2, clip_ratio_c=3.0)),
        ),
        (config("kl_cov", kl_cov_ratio=0.1), ("kl_cov", dict(kl_cov_ratio=0.1, ppo_kl_coef=1.0))),
    ]
    for ours, (mode, kw) in pairs:
        agg = "seq-mean-token-mean" if mode == "geo_mean" else "token-mean"
        theirs = _verl_loss_and_grad(mode, logp, old, adv, mask, agg, **kw)
        torch.testing.assert_close(loss_and_grad(ours, logp, old, adv, mask), theirs, **TOL, msg=mode)


@needs_verl
@pytest.mark.parametrize("seed", range(5))
def test_against_verl_clip_cov_with_the_same_seeded_choice(seed):
    """Clip-Cov chooses tokens at random: verl draws from torch's global generator, ours from a seeded one; seeding
    both alike makes the choice equal (lb and ub wide enough that there are candidates to choose among)."""
    logp, old, _, mask, adv = batch(seed, spread=0.5)
    logp, old, mask, adv = logp.float(), old.float(), mask.float(), adv.float()
    cfg = config("clip_cov", clip_cov_ratio=0.1, clip_cov_lb=-1.0, clip_cov_ub=5.0)
    kw = dict(clip_ratio=1.0, clip_ratio_low=1.0, clip_ratio_high=1.0, clip_ratio_c=10.0)  # verl ignores c here
    torch.manual_seed(1234)
    theirs = _verl_loss_and_grad("clip_cov", logp, old, adv, mask, **kw, clip_cov_ratio=0.1, clip_cov_lb=-1.0,
                                 clip_cov_ub=5.0)  # fmt: skip
    ours = loss_and_grad(cfg, logp, old, adv, mask, generator=torch.Generator().manual_seed(1234))
    torch.testing.assert_close(ours, theirs, **TOL)


@needs_verl
def test_clip_cov_has_no_dual_clip_as_in_the_authors_code_and_verl():
    """One token, A = −1, log ρ = 3 (ρ = 20.09 > c = 10): the Clip-Cov loss is −ρA = 20.09 with gradient 20.09 in
    verl (which never applies its clip_ratio_c to clip_cov) and here (clip_cov's clip_ratio_c is None); with c = 10
    applied, as before, it was 10 with gradient 0."""
    logp, old = torch.tensor([[3.0]]), torch.tensor([[0.0]])
    adv, mask = torch.tensor([-1.0]), torch.ones(1, 1)
    kw = dict(clip_ratio=1.0, clip_ratio_low=1.0, clip_ratio_high=1.0, clip_ratio_c=10.0)
    torch.manual_seed(0)
    theirs = _verl_loss_and_grad("clip_cov", logp, old, adv, mask, **kw)
    ours = loss_and_grad(config("clip_cov"), logp, old, adv, mask, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(ours, theirs, **TOL)
    assert ours[0].item() == pytest.approx(math.exp(3.0)) and ours[1].item() == pytest.approx(math.exp(3.0))
    dual = loss_and_grad(config("clip_cov", clip_ratio_c=10.0), logp, old, adv, mask)  # what c = 10 would do
    assert dual[0].item() == pytest.approx(10.0) and dual[1].item() == 0.0


class _Accel:
    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x

    def reduce(self, x, reduction="sum"):
        return x

    gather_for_metrics = gather


@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="trl is not installed (the bench extra)")
@pytest.mark.parametrize("seed", range(5))
def test_against_trl_cispo(seed):
    """TRL's GRPOTrainer._compute_loss with loss_type=cispo (epsilon_high is TRL's absolute cap, 5.0 = our 1 + 4)."""
    from trl.trainer.grpo_trainer import GRPOTrainer

    logp, old, _, mask, adv = batch(seed, spread=0.5)
    logp, old, mask, adv = logp.float(), old.float(), mask.float(), adv.float()
    leaf = logp.detach().clone().requires_grad_(True)
    stub = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (leaf, torch.zeros_like(leaf), None),
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level="token",
        beta=0.0,
        loss_type="cispo",
        epsilon_high=5.0,
        epsilon_low=0.2,
        use_vllm=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        accelerator=_Accel(),
        args=SimpleNamespace(steps_per_generation=1, delta=None),
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )
    B, T = logp.shape
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": adv,
        "old_per_token_logps": old,
        "num_items_in_batch": mask.sum(),
    }
    theirs = GRPOTrainer._compute_loss(stub, None, inputs)
    (g_theirs,) = torch.autograd.grad(theirs, leaf)
    torch.testing.assert_close(loss_and_grad(config("cispo"), logp, old, adv, mask), (theirs.detach(), g_theirs), **TOL)
