"""Shared loss primitives (bench/rl/losses.py): hand-computed golden values, then properties (masked positions inert,
padding invariance, gradient-accumulation invariance, group advantages centred, k3 >= 0)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.rl.losses import (
    Norm,
    agg_loss,
    clipped_surrogate,
    group_advantages,
    kl_estimate,
    masked_mean,
    masked_sum,
    zero_variance_groups,
)

MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "constant-normalised")
F64 = torch.float64
NAN, INF = float("nan"), float("inf")
GARBAGE = (NAN, INF, -INF, 1e30, -1e30, 1e300, -7.0, 0.0)
PROPS = settings(max_examples=60, deadline=None)


def t64(x) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


# ---- golden values ------------------------------------------------------------------------------------------------
# loss_mat [[1, 2, NaN], [4, inf, -inf]], mask [[1, 1, 0], [1, 0, 0]]: B = 2, L = (2, 1), Σm = 3, row sums (3, 4).
GOLD_LOSS = [[1.0, 2.0, NAN], [4.0, INF, -INF]]
GOLD_MASK = [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
# (mode, norm, expected value, expected d loss / d loss_mat on the unmasked positions (0 elsewhere))
GOLD_AGG = [
    # Σ m ℒ / Σ m = (1 + 2 + 4) / 3 = 7/3; gradient 1/3 per token
    ("token-mean", None, 7 / 3, [[1 / 3, 1 / 3, 0], [1 / 3, 0, 0]]),
    # (1/B) Σ_i (1/L_i) Σ_t = ((1 + 2)/2 + 4/1) / 2 = (1.5 + 4) / 2 = 2.75; gradient 1/(B L_i) = 1/4, 1/2
    ("seq-mean-token-mean", None, 2.75, [[1 / 4, 1 / 4, 0], [1 / 2, 0, 0]]),
    # (1/B) Σ_i Σ_t = (3 + 4) / 2 = 3.5; gradient 1/B = 1/2
    ("seq-mean-token-sum", None, 3.5, [[1 / 2, 1 / 2, 0], [1 / 2, 0, 0]]),
    # default Norm has budget 1: (3/1 + 4/1) / 2 = 3.5
    ("constant-normalised", None, 3.5, [[1 / 2, 1 / 2, 0], [1 / 2, 0, 0]]),
    # L_budget = 4: (3/4 + 4/4) / 2 = (0.75 + 1) / 2 = 0.875; gradient 1/(B L_budget) = 1/8
    ("constant-normalised", Norm(num_seqs=2, num_tokens=3.0, budget=4), 0.875, [[1 / 8, 1 / 8, 0], [1 / 8, 0, 0]]),
    # denominators of a larger optimizer step (B = 4, Σm = 10, L_budget = 4):
    # token-mean 7/10; seq-mean-token-mean (1.5 + 4)/4 = 1.375; seq-mean-token-sum 7/4; constant (0.75 + 1)/4
    ("token-mean", Norm(4, 10.0, 4), 0.7, [[0.1, 0.1, 0], [0.1, 0, 0]]),
    ("seq-mean-token-mean", Norm(4, 10.0, 4), 1.375, [[1 / 8, 1 / 8, 0], [1 / 4, 0, 0]]),
    ("seq-mean-token-sum", Norm(4, 10.0, 4), 1.75, [[1 / 4, 1 / 4, 0], [1 / 4, 0, 0]]),
    ("constant-normalised", Norm(4, 10.0, 4), 0.4375, [[1 / 16, 1 / 16, 0], [1 / 16, 0, 0]]),
]


@pytest.mark.parametrize("mode,norm,expected,grad", GOLD_AGG)
def test_agg_loss_golden(mode, norm, expected, grad):
    """agg_loss matches the hand-computed value and gradient; NaN/inf at masked positions leak into neither."""
    loss_mat = t64(GOLD_LOSS).requires_grad_()
    loss = agg_loss(loss_mat, t64(GOLD_MASK), mode, norm)
    loss.backward()
    assert math.isclose(loss.item(), expected, rel_tol=1e-12), f"{mode} {norm}: {loss.item()} != {expected}"
    assert torch.allclose(loss_mat.grad, t64(grad), rtol=1e-12, atol=0), f"{mode} {norm}: {loss_mat.grad.tolist()}"


@pytest.mark.parametrize("mode", MODES)
def test_agg_loss_all_masked_is_zero(mode):
    """A batch with no unmasked token aggregates to exactly 0 (denominators clamp at 1), not NaN."""
    loss_mat = t64([[NAN, 3.0], [INF, 1.0]]).requires_grad_()
    loss = agg_loss(loss_mat, torch.zeros(2, 2), mode)
    loss.backward()
    assert loss.item() == 0.0, f"{mode}: {loss.item()}"
    assert torch.equal(loss_mat.grad, torch.zeros(2, 2, dtype=F64)), f"{mode}: {loss_mat.grad}"


def test_agg_loss_unknown_mode_raises():
    """An unknown aggregation name fails loudly and lists the valid ones."""
    with pytest.raises(ValueError, match="seq-mean-token-mean"):
        agg_loss(t64([[1.0]]), t64([[1.0]]), "seq-mean")


def test_norm_of_counts_the_whole_batch():
    """Norm.of records B, Σm and the budget of the mask it is given."""
    norm = Norm.of(t64(GOLD_MASK), budget=7)
    assert norm == Norm(num_seqs=2, num_tokens=3.0, budget=7), f"{norm}"
    assert Norm.of(t64(GOLD_MASK)).budget == 1, f"{Norm.of(t64(GOLD_MASK))}"


def test_masked_sum_and_mean_golden():
    """masked_sum/masked_mean: NaN at masked positions does not leak; an empty row has mean 0, not NaN."""
    x, m = t64(GOLD_LOSS), t64(GOLD_MASK)
    assert masked_sum(x, m).item() == 7.0, f"{masked_sum(x, m)}"
    assert masked_sum(x, m, dim=-1).tolist() == [3.0, 4.0], f"{masked_sum(x, m, dim=-1)}"
    assert masked_mean(x, m).item() == 7 / 3, f"{masked_mean(x, m)}"  # 7 / 3 tokens
    assert masked_mean(x, m, dim=-1).tolist() == [1.5, 4.0], f"{masked_mean(x, m, dim=-1)}"  # 3/2, 4/1
    empty = masked_mean(t64([[NAN, 1.0]]), t64([[0.0, 0.0]]), dim=-1)
    assert empty.tolist() == [0.0], f"{empty}"


LN2 = math.log(2.0)
# (logp, ref_logp) -> d = ref - logp; k1 = -d, k2 = d²/2, k3 = e^d - d - 1
GOLD_KL = [
    # d = 0: every estimator is 0
    (0.0, 0.0, 0.0, 0.0, 0.0),
    # logp = 0, ref = log 0.5: d = -ln2 = -0.693147; k1 = ln2; k2 = ln2²/2 = 0.240227; k3 = 0.5 + ln2 - 1 = 0.193147
    (0.0, math.log(0.5), LN2, LN2**2 / 2, 0.5 + LN2 - 1),
    # logp = log 0.5, ref = 0: d = +ln2; k1 = -ln2; k2 = 0.240227; k3 = 2 - ln2 - 1 = 0.306853
    (math.log(0.5), 0.0, -LN2, LN2**2 / 2, 2 - LN2 - 1),
    # logp = -1, ref = 0: d = 1; k1 = -1; k2 = 0.5; k3 = e - 2 = 0.718282
    (-1.0, 0.0, -1.0, 0.5, math.e - 2),
    # logp = 0, ref = -2: d = -2; k1 = 2; k2 = 2; k3 = e^-2 + 2 - 1 = 1.135335
    (0.0, -2.0, 2.0, 2.0, math.exp(-2) + 1),
]


@pytest.mark.parametrize("logp,ref,k1,k2,k3", GOLD_KL)
def test_kl_estimate_golden(logp, ref, k1, k2, k3):
    """k1 = -d, k2 = d²/2, k3 = e^d - d - 1 (d = ref - logp), and their gradients w.r.t. logp: 1, -d, 1 - e^d."""
    d = ref - logp
    for kind, expected, dgrad in (("k1", k1, 1.0), ("k2", k2, -d), ("k3", k3, 1 - math.exp(d))):
        lp = t64([logp]).requires_grad_()
        value = kl_estimate(lp, t64([ref]), kind)
        value.sum().backward()
        assert math.isclose(value.item(), expected, rel_tol=1e-12, abs_tol=1e-15), f"{kind} d={d}: {value.item()}"
        assert math.isclose(lp.grad.item(), dgrad, rel_tol=1e-12, abs_tol=1e-15), f"{kind} d={d}: {lp.grad.item()}"


def test_kl_estimate_unknown_kind_raises():
    """An unknown estimator name fails loudly."""
    with pytest.raises(ValueError, match="k3"):
        kl_estimate(t64([0.0]), t64([0.0]), "k4")


# (ratio, adv, expected C(ρ, A), clip active?) with ε_low = 0.2, ε_high = 0.28 (asymmetric, so each side is checked)
GOLD_CLIP = [
    (1.0, 2.0, 2.0, False),  # ρA = 2, clip(ρ)A = 2
    (1.1, 2.0, 2.2, False),  # inside [0.8, 1.28]
    (1.28, 2.0, 2.56, False),  # on the upper edge: both terms equal 2.56
    (1.5, 2.0, 2.56, True),  # A > 0, ρ > 1 + ε_h: min(3.0, 1.28·2 = 2.56) = 2.56, clipped
    (0.5, 2.0, 1.0, False),  # A > 0, ρ < 1 - ε_l: min(1.0, 0.8·2 = 1.6) = 1.0, unclipped (pessimistic)
    (0.5, -3.0, -2.4, True),  # A < 0, ρ < 1 - ε_l: min(-1.5, 0.8·-3 = -2.4) = -2.4, clipped
    (0.9, -3.0, -2.7, False),  # inside
    (0.8, -3.0, -2.4, False),  # on the lower edge: both terms equal -2.4
    (1.5, -3.0, -4.5, False),  # A < 0, ρ > 1 + ε_h: min(-4.5, 1.28·-3 = -3.84) = -4.5, unclipped (pessimistic)
    (5.0, 0.0, 0.0, False),  # A = 0: no signal, nothing to clip
]


@pytest.mark.parametrize("ratio,adv,expected,clipped", GOLD_CLIP)
def test_clipped_surrogate_golden(ratio, adv, expected, clipped):
    """C(ρ, A) = min(ρA, clip(ρ)A); the flag is set exactly when the clipped term wins; dC/dρ = 0 there, A elsewhere."""
    r = t64([ratio]).requires_grad_()
    value, flag = clipped_surrogate(r, t64([adv]), 0.2, 0.28)
    value.sum().backward()
    assert math.isclose(value.item(), expected, rel_tol=1e-12), f"C({ratio}, {adv}) = {value.item()} != {expected}"
    assert flag.item() is clipped, f"C({ratio}, {adv}): flag {flag.item()} != {clipped}"
    expected_grad = 0.0 if clipped else adv
    assert r.grad.item() == expected_grad, f"dC/dρ at ({ratio}, {adv}) = {r.grad.item()} != {expected_grad}"


def test_group_advantages_golden():
    """Group [1, 0, 0, 1]: mean 0.5, sample std sqrt(1/3) = 0.57735, population std 0.5, hand values for each."""
    r = t64([1.0, 0.0, 0.0, 1.0])
    # centred = [0.5, -0.5, -0.5, 0.5]; sample std = sqrt((4 · 0.25) / 3) = 0.5773502692
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)  # 0.8660239...
    cases = {
        "unbiased, ε=1e-6": (group_advantages(r, 4), [a, -a, -a, a]),
        # ε = 0: ±0.5 / 0.57735 = ±sqrt(3)/2 = ±0.8660254
        "unbiased, ε=0": (group_advantages(r, 4, eps=0.0), [math.sqrt(3) / 2 * s for s in (1, -1, -1, 1)]),
        # population std 0.5: ±0.5 / (0.5 + 1e-6) = ±0.999998
        "population": (group_advantages(r, 4, unbiased=False), [0.5 / 0.500001 * s for s in (1, -1, -1, 1)]),
        "population, ε=0": (group_advantages(r, 4, eps=0.0, unbiased=False), [1.0, -1.0, -1.0, 1.0]),
        # no scaling: the centred rewards
        "scale none": (group_advantages(r, 4, scale="none"), [0.5, -0.5, -0.5, 0.5]),
    }
    for name, (got, want) in cases.items():
        assert torch.allclose(got, t64(want), rtol=1e-12, atol=0), f"{name}: {got.tolist()} != {want}"


def test_group_advantages_constant_group_and_singleton():
    """A constant group (beside an informative one) gives exact zeros; G = 1 gives zeros; never NaN."""
    adv = group_advantages(t64([1.0, 0.0, 0.0, 1.0, 3.0, 3.0, 3.0, 3.0]), 4)
    assert torch.equal(adv[4:], torch.zeros(4, dtype=F64)), f"constant group: {adv[4:].tolist()}"
    assert torch.isfinite(adv).all(), f"{adv.tolist()}"
    for dtype in (torch.float32, F64):
        for scale in ("std", "none"):
            single = group_advantages(torch.tensor([3.0, -1.0, 0.25], dtype=dtype), 1, scale)
            assert torch.equal(single, torch.zeros(3, dtype=dtype)), f"G=1 {dtype} {scale}: {single.tolist()}"


def test_group_advantages_rejects_ragged_batch_and_unknown_scale():
    """A batch that is not whole groups, or an unknown scale, fails loudly instead of being silently reshaped."""
    with pytest.raises(AssertionError, match="whole number of groups"):
        group_advantages(t64([1.0, 0.0, 1.0]), 2)
    with pytest.raises(ValueError, match="std or none"):
        group_advantages(t64([1.0, 0.0]), 2, scale="rank")


@pytest.mark.parametrize(
    "value,G,dtype", [(0.7, 8, torch.float32), (0.1, 8, torch.float32), (0.3, 16, torch.float32), (0.1, 3, F64)]
)
def test_group_advantages_constant_group_nondyadic_is_zero(value, G, dtype):
    """A constant-reward group gives exactly 0 whatever the reward value and dtype (docstring contract)."""
    adv = group_advantages(torch.full((G,), value, dtype=dtype), G)
    assert torch.equal(adv, torch.zeros(G, dtype=dtype)), f"r = {value} x {G} ({dtype}): Â = {adv.tolist()}"


def test_zero_variance_groups_golden():
    """zero_variance_groups flags exactly the groups whose rewards are all equal."""
    rewards = t64([1, 1, 1, 0, 1, 0, 0.5, 0.5, 0.5, 0, 0, 0, 1, 1, 0.999])
    got = zero_variance_groups(rewards, 3)
    assert got.tolist() == [True, False, True, True, False], f"{got.tolist()}"
    assert zero_variance_groups(t64([0.0, 1.0]), 1).tolist() == [True, True], "G = 1: every group is constant"


# ---- properties ---------------------------------------------------------------------------------------------------
@st.composite
def batches(draw, min_rows=1, max_rows=5, max_cols=6):
    """(loss_mat [B, T] float64, mask [B, T] float64, garbage [B, T] float64, budget) with a ragged mask."""
    B = draw(st.integers(min_rows, max_rows))
    T = draw(st.integers(1, max_cols))
    vals = draw(st.lists(st.floats(-1e3, 1e3), min_size=B * T, max_size=B * T))
    bits = draw(st.lists(st.booleans(), min_size=B * T, max_size=B * T))
    junk = draw(st.lists(st.sampled_from(GARBAGE), min_size=B * T, max_size=B * T))
    budget = draw(st.integers(1, 16))
    return (t64(vals).view(B, T), t64(bits).view(B, T), t64(junk).view(B, T), budget)


@PROPS
@given(batch=batches(), mode=st.sampled_from(MODES))
def test_masked_positions_are_inert(batch, mode):
    """Replacing masked entries by garbage (NaN, ±inf, 1e300) that also carries a gradient path (through a finite
    local derivative) changes neither agg_loss nor the gradient w.r.t. the unmasked entries, and sends exactly 0
    gradient into the garbage's path. (A non-finite local derivative upstream would still make 0 · inf = NaN: that
    is the caller's to avoid, see test_grpo.py.)"""
    loss_mat, mask, junk, budget = batch
    norm = Norm.of(mask, budget)
    clean = loss_mat.clone().requires_grad_()
    ref = agg_loss(clean, mask, mode, norm)
    ref.backward()

    dirty = loss_mat.clone().requires_grad_()
    scale = torch.ones((), dtype=F64, requires_grad=True)  # a parameter that only the masked entries depend on
    path = torch.nan_to_num(junk, nan=3.0, posinf=1e30, neginf=-1e30)  # finite d(garbage)/d(scale)
    mixed = torch.where(mask.bool(), dirty, junk + path * scale)
    got = agg_loss(mixed, mask, mode, norm)
    got.backward()
    assert torch.equal(got, ref), f"{mode}: {got.item()} != {ref.item()}"
    assert torch.equal(dirty.grad, clean.grad), f"{mode}: {dirty.grad.tolist()} != {clean.grad.tolist()}"
    assert torch.equal(clean.grad[~mask.bool()], torch.zeros_like(clean.grad[~mask.bool()])), f"{clean.grad}"
    assert scale.grad.item() == 0.0, f"{mode}: gradient {scale.grad.item()} reached a masked-only parameter"


@PROPS
@given(batch=batches(), mode=st.sampled_from(MODES), extra=st.integers(1, 3))
def test_padding_columns_change_nothing(batch, mode, extra):
    """Appending all-masked columns (more padding, any values) leaves every mode unchanged: B, Σm and each L_i are
    the same, with the default Norm as well as an explicit one."""
    loss_mat, mask, junk, budget = batch
    B = loss_mat.shape[0]
    padded_loss = torch.cat([loss_mat, junk[:, :1].expand(B, extra)], 1)  # [B, T + extra]
    padded_mask = torch.cat([mask, torch.zeros(B, extra, dtype=F64)], 1)
    for norm_of in (lambda m: None, lambda m: Norm.of(m, budget)):
        want = agg_loss(loss_mat, mask, mode, norm_of(mask))
        got = agg_loss(padded_loss, padded_mask, mode, norm_of(padded_mask))
        # equal up to summation order (a wider row is reduced in a different order)
        assert torch.allclose(got, want, rtol=1e-12, atol=1e-300), f"{mode} +{extra}: {got.item()} != {want.item()}"


@PROPS
@given(batch=batches(), mode=st.sampled_from(MODES), extra=st.integers(1, 3))
def test_padding_rows_change_nothing_under_the_step_norm(batch, mode, extra):
    """Appending fully-masked rows: under the optimizer step's Norm every mode is unchanged (an empty row adds 0 to
    the numerator and the denominators are fixed); under the batch's own Norm only token-mean is, while the seq
    modes divide by B + extra instead of B (empty rows count as sequences there, by design)."""
    loss_mat, mask, junk, budget = batch
    B, T = loss_mat.shape
    padded_loss = torch.cat([loss_mat, junk[:1].expand(extra, T)], 0)  # [B + extra, T]
    padded_mask = torch.cat([mask, torch.zeros(extra, T, dtype=F64)], 0)
    norm = Norm.of(mask, budget)
    want = agg_loss(loss_mat, mask, mode, norm)
    got = agg_loss(padded_loss, padded_mask, mode, norm)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-300), f"{mode} +{extra} rows: {got.item()} != {want.item()}"

    want_own = agg_loss(loss_mat, mask, mode)
    got_own = agg_loss(padded_loss, padded_mask, mode)
    expected = want_own if mode == "token-mean" else want_own * B / (B + extra)
    assert torch.allclose(got_own, expected, rtol=1e-12, atol=1e-300), (
        f"{mode} +{extra} rows, own Norm: {got_own.item()} != {expected.item()}"
    )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("micro", [1, 4])
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_gradient_accumulation_matches_full_batch(mode, micro, data):
    """Σ over micro-batches of agg_loss(rows, Norm of the WHOLE batch) equals agg_loss of the full batch, value
    and gradient, for every mode (8 x B=1 and 2 x B=4 against 1 x B=8)."""
    loss_mat, mask, _, budget = data.draw(batches(min_rows=8, max_rows=8, max_cols=7))
    norm = Norm.of(mask, budget)
    full_in = loss_mat.clone().requires_grad_()
    full = agg_loss(full_in, mask, mode, norm)
    full.backward()

    acc_in = loss_mat.clone().requires_grad_()
    total = torch.zeros((), dtype=F64)
    for i in range(0, 8, micro):
        part = agg_loss(acc_in[i : i + micro], mask[i : i + micro], mode, norm)
        part.backward()
        total = total + part.detach()
    assert torch.allclose(total, full.detach(), rtol=1e-9, atol=1e-6), f"{mode} {8 // micro}x{micro}: {total} != {full}"
    assert torch.allclose(acc_in.grad, full_in.grad, rtol=0, atol=1e-6), (
        f"{mode} {8 // micro}x{micro}: max grad diff {(acc_in.grad - full_in.grad).abs().max()}"
    )


def test_gradient_accumulation_needs_the_step_norm():
    """Negative control: micro-batches normalised by their own counts do NOT sum to the full-batch loss, so the
    invariance above is a property of passing the step Norm, not of the data."""
    loss_mat, mask = t64([[1.0, 1.0, 1.0], [5.0, 0.0, 0.0]]), t64([[1, 1, 1], [1, 0, 0]])
    full = agg_loss(loss_mat, mask, "token-mean")  # (3 + 5) / 4 = 2
    own = sum(agg_loss(loss_mat[i : i + 1], mask[i : i + 1], "token-mean") for i in range(2))  # 3/3 + 5/1 = 6
    assert full.item() == 2.0 and own.item() == 6.0, f"full {full.item()}, own-norm micro-batches {own.item()}"


@PROPS
@given(
    rewards=st.lists(st.floats(-10, 10), min_size=1, max_size=32),
    G=st.sampled_from([1, 2, 3, 4, 8]),
    unbiased=st.booleans(),
    scale=st.sampled_from(["std", "none"]),
)
def test_group_advantages_are_centred_and_finite(rewards, G, unbiased, scale):
    """Per group, advantages sum to 0 (1e-5) and are finite, for sample/population std and no scaling."""
    r = t64(rewards[: len(rewards) // G * G] or [0.0] * G)
    adv = group_advantages(r, G, scale, unbiased=unbiased)
    assert adv.shape == r.shape, f"{adv.shape} != {r.shape}"
    assert torch.isfinite(adv).all(), f"r = {r.tolist()}: Â = {adv.tolist()}"
    sums = adv.view(-1, G).sum(-1)
    assert sums.abs().max() <= 1e-5, f"r = {r.tolist()}: group sums {sums.tolist()}"


DYADIC = st.sampled_from([0.0, 1.0, -1.0, 0.5, 0.25, 2.0, 3.0, -0.75, 10.0])


@PROPS
@given(
    values=st.lists(DYADIC, min_size=1, max_size=4),
    G=st.sampled_from([1, 2, 4, 8, 16]),
    dtype=st.sampled_from([torch.float32, F64]),
    unbiased=st.booleans(),
)
def test_constant_reward_groups_give_exact_zero(values, G, dtype, unbiased):
    """Groups of equal, exactly representable rewards (0/1, ±1, halves: what verifiable rewards give) get Â = 0
    exactly, never NaN. (Non-dyadic values: see the test above.)"""
    r = torch.tensor([v for v in values for _ in range(G)], dtype=dtype)  # [P·G], each group constant
    adv = group_advantages(r, G, unbiased=unbiased)
    assert torch.equal(adv, torch.zeros_like(adv)), f"r = {r.tolist()}: Â = {adv.tolist()}"
    assert zero_variance_groups(r, G).all(), f"{zero_variance_groups(r, G)}"


@PROPS
@given(
    d=st.one_of(st.floats(-1e4, 1e4), st.sampled_from([-50.0, 50.0, -88.0, 88.0, -1e4, 1e4, 0.0, 20.0])),
    dtype=st.sampled_from([torch.float32, F64]),
)
def test_k3_and_k2_are_nonnegative(d, dtype):
    """k3 >= 0 and k2 >= 0 for every d (large |d| included); k3 is finite and, for d <= 20, e^d - d - 1."""
    logp = torch.zeros(1, dtype=dtype)
    ref = torch.tensor([d], dtype=dtype)
    k3 = kl_estimate(logp, ref, "k3").item()
    k2 = kl_estimate(logp, ref, "k2").item()
    assert k3 >= 0 and math.isfinite(k3), f"k3(d={d}, {dtype}) = {k3}"
    assert k2 >= 0, f"k2(d={d}) = {k2}"
    dd = ref.item()
    if dd <= 20:
        want = math.expm1(dd) - dd
        tol = 1e-12 if dtype == F64 else 1e-5
        assert math.isclose(k3, want, rel_tol=tol, abs_tol=tol * max(1.0, abs(dd))), f"k3(d={dd}) = {k3} != {want}"


def test_k1_and_k3_estimate_kl_from_policy_samples():
    """Averaged over tokens sampled from π, k1 and k3 estimate KL(π || π_ref) (both unbiased), within 5 std errors."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.tensor([2.0, 0.5, 0.0, -1.0, 1.0], dtype=F64)
    logits_ref = torch.tensor([0.0, 1.0, 0.5, 0.0, -0.5], dtype=F64)
    logpi, logref = logits.log_softmax(-1), logits_ref.log_softmax(-1)
    kl = (logpi.exp() * (logpi - logref)).sum().item()
    idx = torch.multinomial(logpi.exp(), 200_000, replacement=True, generator=gen)
    for kind in ("k1", "k3"):
        k = kl_estimate(logpi[idx], logref[idx], kind)
        err = 5 * k.std().item() / math.sqrt(k.numel())
        assert abs(k.mean().item() - kl) < err, f"{kind}: mean {k.mean().item()} vs KL {kl} (±{err})"
