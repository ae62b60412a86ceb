"""GRPO (algorithms/grpo.py): a hand-computed batch (advantages, loss, gradient, with and without the k3 penalty),
properties (constant groups, on-policy = policy gradient, clipping zeroes exactly the flagged gradients), and
gradient-accumulation invariance through a real tiny transformers model."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from algorithms.grpo import GRPOConfig, grpo_advantages, grpo_loss
from bench.config import ModelConfig
from bench.engine.policy import char_tokenizer, completion_logprobs, tiny_model
from bench.rl.losses import Norm, agg_loss, clipped_surrogate

MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "constant-normalised")
F64 = torch.float64
PROPS = settings(max_examples=60, deadline=None)


def t64(x) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


# ---- the hand-built batch -------------------------------------------------------------------------------------------
# P = 1 group of G = 4, rewards [1, 0, 0, 1], T = 3, ε = 0.2 (clip range [0.8, 1.2]).
# Â: mean 0.5, centred ±0.5, sample std sqrt(1/3) = 0.577350, Â = ±a with a = 0.5 / (0.577350 + 1e-6) = 0.866024.
A = 0.5 / (math.sqrt(1 / 3) + 1e-6)
REWARDS = [1.0, 0.0, 0.0, 1.0]
ADV = [A, -A, -A, A]
MASK = [[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 0]]  # L = (3, 2, 1, 2), Σm = 8, B = 4
RHO = [  # ratios ρ on the unmasked tokens (masked: placeholders, the logp there is absurd)
    [1.0, 1.1, 1.5],  # A > 0: inside, inside, above 1 + ε -> clipped (zero gradient)
    [0.5, 0.9, 1.0],  # A < 0: below 1 - ε -> clipped (zero gradient), inside, masked
    [1.5, 1.0, 1.0],  # A < 0: above 1 + ε but unclipped (min picks ρA = -1.5a, pessimistic), masked, masked
    [0.5, 1.15, 1.0],  # A > 0: below 1 - ε but unclipped (min picks ρA = 0.5a), inside, masked
]
CLIPPED = [[0, 0, 1], [1, 0, 0], [0, 0, 0], [0, 0, 0]]
OLD_LOGP = [[-1.0, -2.0, -0.5], [-1.5, -0.7, 0.0], [-3.0, 0.0, 0.0], [-0.2, -1.1, 0.0]]
ABSURD = -1e4  # logp at masked positions: ratio e^-1e4 = 0 and d = 1e4 there; neither may reach loss or gradient
D = [[0.0, 1.0, -1.0], [0.5, -0.5, 0.0], [2.0, 0.0, 0.0], [-2.0, 0.25, 0.0]]  # d = ref - logp on unmasked tokens
#
# Surrogate C = min(ρA, clip(ρ)A) per unmasked token, then the per-row mean over L_i:
#   row 0 (+a): a, 1.1a, 1.2a            -> (1 + 1.1 + 1.2)a / 3 = 1.1a
#   row 1 (-a): -0.8a, -0.9a             -> -1.7a / 2           = -0.85a
#   row 2 (-a): -1.5a                    -> -1.5a
#   row 3 (+a): 0.5a, 1.15a              -> 1.65a / 2           = 0.825a
# seq-mean-token-mean loss (β = 0) = -(1.1 - 0.85 - 1.5 + 0.825)a / 4 = 0.425a / 4 = 0.10625a = 0.0920150
LOSS_BETA0 = 0.10625 * A
# d loss / d logp_{i,t} = -A_i ρ_{i,t} / (B L_i) unclipped; 0 clipped or masked:
#   row 0: -a·1.0/12, -a·1.1/12, 0      row 1: 0, +a·0.9/8, 0
#   row 2: +a·1.5/4, 0, 0               row 3: -a·0.5/8, -a·1.15/8, 0
GRAD_BETA0 = [
    [-A * 1.0 / 12, -A * 1.1 / 12, 0.0],
    [0.0, A * 0.9 / 8, 0.0],
    [A * 1.5 / 4, 0.0, 0.0],
    [-A * 0.5 / 8, -A * 1.15 / 8, 0.0],
]
# β = 0.1, k3 = e^d - d - 1 on the unmasked tokens:
#   row 0: k3(0) = 0, k3(1) = e - 2 = 0.7182818, k3(-1) = 1/e = 0.3678794  -> mean 1.0861613 / 3 = 0.3620538
#   row 1: k3(0.5) = 0.1487213, k3(-0.5) = 0.1065307                      -> mean 0.2552519 / 2 = 0.1276260
#   row 2: k3(2) = e² - 3 = 4.3890561                                      -> 4.3890561
#   row 3: k3(-2) = e⁻² + 1 = 1.1353353, k3(0.25) = 0.0340254             -> mean 1.1693607 / 2 = 0.5846804
#   KL term = (0.3620538 + 0.1276260 + 4.3890561 + 0.5846804) / 4 = 5.4634162 / 4 = 1.3658540
BETA = 0.1
KL_TERM = 1.3658540
# d k3 / d logp = 1 - e^d, so the β term adds β (1 - e^d) / (B L_i) on every unmasked token (clipped or not):
GRAD_KL = [
    [(1 - math.exp(d)) / (4 * L) * m for d, m in zip(row_d, row_m, strict=True)]
    for row_d, row_m, L in zip(D, MASK, (3, 2, 1, 2), strict=True)
]


def hand_batch():
    """(logp leaf, old_logp, ref_logp, adv, mask) of the hand-built batch, float64."""
    mask = t64(MASK)
    old_logp = t64(OLD_LOGP)
    logp = torch.where(mask.bool(), old_logp + t64(RHO).log(), t64(ABSURD)).requires_grad_()
    ref_logp = torch.where(mask.bool(), logp.detach() + t64(D), torch.zeros(4, 3, dtype=F64))
    adv = grpo_advantages(t64(REWARDS), 4, GRPOConfig())
    return logp, old_logp, ref_logp, adv, mask


def test_grpo_advantages_golden():
    """GRPO's Â for rewards [1, 0, 0, 1] is ±0.5 / (sqrt(1/3) + 1e-6) (sample std), ±0.5/(0.5 + 1e-6) (population)."""
    adv = grpo_advantages(t64(REWARDS), 4, GRPOConfig())
    assert torch.allclose(adv, t64(ADV), rtol=1e-12, atol=0), f"{adv.tolist()} != {ADV}"
    pop = grpo_advantages(t64(REWARDS), 4, GRPOConfig(adv_std_unbiased=False))
    want = [0.5 / 0.500001 * s for s in (1, -1, -1, 1)]
    assert torch.allclose(pop, t64(want), rtol=1e-12, atol=0), f"{pop.tolist()} != {want}"


def test_grpo_loss_golden_beta0():
    """β = 0: loss 0.10625a and d loss/d logp = -A ρ / (B L_i), exactly 0 where clipped or masked (absurd logp)."""
    logp, old_logp, _, adv, mask = hand_batch()
    cfg = GRPOConfig(beta=0.0)
    loss, stats = grpo_loss(logp, old_logp, adv, mask, cfg, Norm.of(mask))
    loss.backward()
    assert math.isclose(loss.item(), LOSS_BETA0, rel_tol=1e-9), f"loss {loss.item()} != {LOSS_BETA0}"
    assert torch.allclose(logp.grad, t64(GRAD_BETA0), rtol=1e-9, atol=1e-12), f"{logp.grad.tolist()} != {GRAD_BETA0}"
    zero = t64(CLIPPED).bool() | ~mask.bool()
    assert (logp.grad[zero] == 0).all(), f"clipped/masked gradient not exactly 0: {logp.grad[zero].tolist()}"
    # 2 of the 8 unmasked tokens are clipped; mean ρ = (1 + 1.1 + 1.5 + 0.5 + 0.9 + 1.5 + 0.5 + 1.15) / 8 = 1.01875
    assert math.isclose(stats["stats/clip_frac"].item(), 0.25), f"{stats['stats/clip_frac']}"
    assert math.isclose(stats["stats/ratio_mean"].item(), 1.01875, rel_tol=1e-9), f"{stats['stats/ratio_mean']}"
    assert math.isclose(stats["loss/policy"].item(), LOSS_BETA0, rel_tol=1e-9), f"{stats['loss/policy']}"
    assert "stats/kl" not in stats, f"β = 0 must not compute a KL: {sorted(stats)}"


def test_grpo_loss_golden_with_k3_penalty():
    """β = 0.1: loss adds β·(seq-mean-token-mean of k3) and the gradient adds β (1 - e^d) / (B L_i) per token."""
    logp, old_logp, ref_logp, adv, mask = hand_batch()
    cfg = GRPOConfig(beta=BETA)
    loss, stats = grpo_loss(logp, old_logp, adv, mask, cfg, Norm.of(mask), ref_logp)
    loss.backward()
    want = LOSS_BETA0 + BETA * KL_TERM
    assert math.isclose(loss.item(), want, rel_tol=1e-6), f"loss {loss.item()} != {want}"
    grad = t64(GRAD_BETA0) + BETA * t64(GRAD_KL)
    assert torch.allclose(logp.grad, grad, rtol=1e-9, atol=1e-12), f"{logp.grad.tolist()} != {grad.tolist()}"
    assert (logp.grad[~mask.bool()] == 0).all(), f"masked gradient not 0: {logp.grad[~mask.bool()].tolist()}"
    # stats/kl is the token mean of k3: (1.0861613 + 0.2552519 + 4.3890561 + 1.1693607) / 8 = 0.8624788
    assert math.isclose(stats["stats/kl"].item(), 6.8998300 / 8, rel_tol=1e-6), f"{stats['stats/kl']}"
    assert math.isclose(stats["loss/policy"].item(), LOSS_BETA0, rel_tol=1e-9), f"{stats['loss/policy']}"


@pytest.mark.parametrize("masked_logp,dtype", [(1e3, F64), (0.0, torch.float32), (float("nan"), F64)])
def test_grpo_loss_masked_overflow_gives_finite_gradient(masked_logp, dtype):
    """Masked positions are inert in the backward too: any logp there (overflowing ratio, NaN) leaves logp.grad
    finite and 0 at that position."""
    mask = torch.tensor([[1.0, 0.0]], dtype=dtype)
    old_logp = torch.tensor([[-1.0, -100.0]], dtype=dtype)  # fp32: e^(0 - (-100)) overflows
    logp = torch.tensor([[-1.0, masked_logp]], dtype=dtype, requires_grad=True)
    loss, _ = grpo_loss(logp, old_logp, torch.tensor([1.0], dtype=dtype), mask, GRPOConfig(beta=0.0), Norm.of(mask))
    loss.backward()
    assert torch.isfinite(loss), f"loss {loss}"
    assert torch.isfinite(logp.grad).all() and logp.grad[0, 1] == 0, f"logp.grad {logp.grad.tolist()}"


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_constant_reward_group_gives_zero_loss_and_gradient(dtype, beta):
    """Equal rewards give Â = 0, so with β = 0 the loss and gradient are exactly 0 (and finite with β > 0)."""
    adv = grpo_advantages(torch.ones(4, dtype=dtype), 4, GRPOConfig())
    assert torch.equal(adv, torch.zeros(4, dtype=dtype)), f"Â {adv.tolist()}"
    mask = torch.tensor(MASK, dtype=dtype)
    logp = (torch.tensor(OLD_LOGP, dtype=dtype) + 0.3).requires_grad_()
    loss, stats = grpo_loss(
        logp,
        torch.tensor(OLD_LOGP, dtype=dtype),
        adv,
        mask,
        GRPOConfig(beta=beta),
        Norm.of(mask),
        torch.tensor(OLD_LOGP, dtype=dtype),
    )
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all(), f"loss {loss}, grad {logp.grad}"
    assert all(math.isfinite(float(v)) for v in stats.values()), f"{stats}"
    if beta == 0:
        assert loss.item() == 0.0, f"loss {loss.item()}"
        assert torch.equal(logp.grad, torch.zeros_like(logp)), f"grad {logp.grad.tolist()}"


# ---- properties ---------------------------------------------------------------------------------------------------
@st.composite
def rl_batches(draw, G=4):
    """(logp [B, T], rewards [B], mask [B, T], budget) float64, B = P·G with a ragged mask (every row non-empty)."""
    P = draw(st.integers(1, 2))
    T = draw(st.integers(1, 5))
    B = P * G
    logp = draw(st.lists(st.floats(-8.0, -0.01), min_size=B * T, max_size=B * T))
    rewards = draw(st.lists(st.sampled_from([0.0, 1.0, 0.5]), min_size=B, max_size=B))
    lengths = draw(st.lists(st.integers(1, T), min_size=B, max_size=B))
    mask = t64([[1.0 if t < L else 0.0 for t in range(T)] for L in lengths])
    return t64(logp).view(B, T), t64(rewards), mask, draw(st.integers(1, 8))


@PROPS
@given(batch=rl_batches(), mode=st.sampled_from(MODES))
def test_on_policy_gradient_is_the_policy_gradient(batch, mode):
    """At ρ = 1 (logp == old_logp, β = 0) grpo_loss has the gradient, and value, of the plain policy-gradient loss
    -Â_i·logp aggregated the same way (the clip is inactive at ρ = 1)."""
    logp0, rewards, mask, budget = batch
    cfg = dataclasses.replace(GRPOConfig(beta=0.0), loss_agg=mode)
    adv = grpo_advantages(rewards, 4, cfg)
    norm = Norm.of(mask, budget)
    logp = logp0.clone().requires_grad_()
    loss, _ = grpo_loss(logp, logp0.clone(), adv, mask, cfg, norm)
    loss.backward()
    pg_logp = logp0.clone().requires_grad_()
    pg = agg_loss(-adv.unsqueeze(-1) * pg_logp, mask, mode, norm)  # [B, 1] * [B, T]
    pg.backward()
    assert torch.allclose(logp.grad, pg_logp.grad, rtol=1e-12, atol=1e-12), (
        f"{mode}: {logp.grad.tolist()} != {pg_logp.grad.tolist()}"
    )
    # value: -agg(Â) because ρ = 1
    want = agg_loss(-adv.unsqueeze(-1).expand_as(mask), mask, mode, norm)
    assert torch.allclose(loss, want, rtol=1e-12, atol=1e-12), f"{mode}: {loss.item()} != {want.item()}"


def far_from_edges(ratio: torch.Tensor, eps_low: float, eps_high: float) -> bool:
    """No ratio within 1e-9 of a clip edge, where ρA and clip(ρ)A may round equal and torch.minimum splits the
    gradient between the two terms (exactly at the edge the split still sums to A)."""
    edges = torch.tensor([1 - eps_low, 1 + eps_high], dtype=ratio.dtype)
    return bool(((ratio.reshape(-1, 1) - edges).abs() > 1e-9).all())


@PROPS
@given(
    ratio=st.lists(st.floats(0.05, 4.0), min_size=1, max_size=16),
    data=st.data(),
    eps_low=st.floats(0.01, 0.5),
    eps_high=st.floats(0.01, 0.5),
)
def test_clipped_surrogate_gradient_is_zero_exactly_where_flagged(ratio, data, eps_low, eps_high):
    """dC/dρ is exactly 0 where clipped_surrogate flags the clip as active, and exactly A everywhere else."""
    adv = data.draw(
        st.lists(st.floats(-5, 5).filter(lambda a: abs(a) > 1e-3), min_size=len(ratio), max_size=len(ratio))
    )
    r = t64(ratio).requires_grad_()
    assume(far_from_edges(r.detach(), eps_low, eps_high))
    value, clipped = clipped_surrogate(r, t64(adv), eps_low, eps_high)
    value.sum().backward()
    assert (r.grad[clipped] == 0).all(), f"flagged but gradient {r.grad[clipped].tolist()}"
    assert torch.equal(r.grad[~clipped], t64(adv)[~clipped]), f"unflagged: {r.grad[~clipped]} != {t64(adv)[~clipped]}"
    # the flag is the PPO rule: ρ > 1 + ε_h with A > 0, or ρ < 1 - ε_l with A < 0
    rule = ((r > 1 + eps_high) & (t64(adv) > 0)) | ((r < 1 - eps_low) & (t64(adv) < 0))
    assert torch.equal(clipped, rule), f"ρ {ratio}, A {adv}: flags {clipped.tolist()} != rule {rule.tolist()}"


@PROPS
@given(batch=rl_batches(), data=st.data(), eps=st.floats(0.05, 0.4))
def test_grpo_gradient_is_zero_exactly_where_clipped(batch, data, eps):
    """Through grpo_loss (β = 0): logp.grad is 0 exactly on clipped or masked tokens and -Â ρ / (B L_i) elsewhere."""
    old_logp, rewards, mask, _ = batch
    B, T = old_logp.shape
    log_ratio = t64(data.draw(st.lists(st.floats(-1.5, 1.5), min_size=B * T, max_size=B * T))).view(B, T)
    cfg = GRPOConfig(beta=0.0, clip_eps_low=eps, clip_eps_high=eps)
    adv = grpo_advantages(rewards, 4, cfg)
    assume((adv != 0).all())
    logp = (old_logp + log_ratio).requires_grad_()
    ratio = torch.exp(logp.detach() - old_logp)  # the same expression grpo_loss evaluates
    assume(far_from_edges(ratio, eps, eps))
    _, clipped = clipped_surrogate(ratio, adv.unsqueeze(-1), eps, eps)
    loss, stats = grpo_loss(logp, old_logp, adv, mask, cfg, Norm.of(mask))
    loss.backward()
    zero = clipped | ~mask.bool()
    assert (logp.grad[zero] == 0).all(), f"clipped/masked gradient {logp.grad[zero].tolist()}"
    want = -adv.unsqueeze(-1) * ratio / (B * mask.sum(-1, keepdim=True))  # [B, T]
    assert torch.allclose(logp.grad[~zero], want[~zero], rtol=1e-12, atol=0), (
        f"{logp.grad[~zero].tolist()} != {want[~zero].tolist()}"
    )
    frac = (clipped & mask.bool()).sum() / mask.sum()
    assert math.isclose(stats["stats/clip_frac"].item(), frac.item(), rel_tol=1e-12), f"{stats} vs {frac}"


# ---- 1 x B=8 equals 8 x B=1 through a real model -------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_batch():
    """A 2-layer float64 Llama with the character tokenizer, and a rollout-shaped batch of two groups of 4:
    left-padded prompts [8, 5], ragged completions [8, 6], noisy old_logp (some tokens clip) and ref_logp."""
    tok = char_tokenizer()
    cfg = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    model = tiny_model(cfg, vocab_size=len(tok), seed=0).double().eval()
    gen = torch.Generator().manual_seed(0)
    V, pad = len(tok), tok.pad_token_id
    prompt_ids = torch.randint(4, V, (8, 5), generator=gen)
    prompt_mask = torch.ones(8, 5, dtype=torch.long)
    for row, n_pad in ((1, 2), (6, 1), (7, 3)):  # left padding
        prompt_mask[row, :n_pad] = 0
        prompt_ids[row, :n_pad] = pad
    lengths = torch.tensor([6, 3, 1, 5, 2, 6, 4, 3])
    mask = (torch.arange(6) < lengths.unsqueeze(-1)).to(F64)  # [8, 6]
    completion_ids = torch.where(mask.bool(), torch.randint(4, V, (8, 6), generator=gen), torch.full((8, 6), pad))
    with torch.no_grad():
        logp, _ = completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, mask)
    old_logp = logp.double() + 0.3 * torch.randn(8, 6, generator=gen, dtype=F64)
    ref_logp = logp.double() + 0.2 * torch.randn(8, 6, generator=gen, dtype=F64)
    rewards = t64([1, 0, 0, 1, 0, 1, 1, 1])
    return model, dict(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        mask=mask,
        old_logp=old_logp,
        ref_logp=ref_logp,
        rewards=rewards,
    )


@pytest.fixture
def single_thread():
    """One intra-op thread for the tiny model: its tensors are far too small to gain from threads, and with the cores
    busy (a training run alongside) oversubscribed threads made each forward/backward ~300x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def grpo_grads(model, rows, adv, cfg, norm):
    """(loss, stats, parameter gradients) of grpo_loss on ``rows`` of the batch."""
    logp, _ = completion_logprobs(model, rows["prompt_ids"], rows["prompt_mask"], rows["completion_ids"], rows["mask"])
    loss, stats = grpo_loss(logp, rows["old_logp"], adv, rows["mask"], cfg, norm, rows["ref_logp"])
    params = [p for p in model.parameters() if p.requires_grad]
    return loss, stats, torch.autograd.grad(loss, params)


@pytest.mark.parametrize("micro", [1, 4])
@pytest.mark.parametrize("mode", MODES)
def test_gradient_accumulation_through_a_real_model(single_thread, tiny_batch, mode, micro):
    """Accumulating grpo_loss over micro-batches (8 x B=1, 2 x B=4), each with the full batch's Norm, gives the same
    loss and parameter gradients as one B=8 pass (1e-6), for every loss aggregation, with β = 0.04 and k3."""
    model, batch = tiny_batch
    cfg = dataclasses.replace(GRPOConfig(beta=0.04), loss_agg=mode)
    adv = grpo_advantages(batch["rewards"], 4, cfg)  # [8]
    norm = Norm.of(batch["mask"], budget=6)
    loss, stats, full = grpo_grads(model, batch, adv, cfg, norm)
    assert stats["stats/clip_frac"] > 0, f"the noise should make some tokens clip: {stats['stats/clip_frac']}"
    assert max(g.abs().max().item() for g in full) > 1e-4, "the full-batch gradient is trivially 0"

    total, acc = 0.0, [torch.zeros_like(g) for g in full]
    for i in range(0, 8, micro):
        rows = {k: v[i : i + micro] for k, v in batch.items()}
        part, _, grads = grpo_grads(model, rows, adv[i : i + micro], cfg, norm)
        total += part.item()
        acc = [a + g for a, g in zip(acc, grads, strict=True)]
    assert math.isclose(total, loss.item(), rel_tol=1e-6, abs_tol=1e-6), f"{mode}: Σ micro {total} != full {loss}"
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    for name, a, g in zip(names, acc, full, strict=True):
        diff = (a - g).abs().max().item()
        assert diff <= 1e-6, f"{mode} {8 // micro}x{micro}: {name} max |Δgrad| = {diff} (|grad| max {g.abs().max()})"
