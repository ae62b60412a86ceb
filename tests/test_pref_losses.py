"""The preference-family primitives (bench/pref/losses.py): hand-computed golden values, masked positions and padding
inert, the reductions to DPO (loss and gradient to 1e-6) and agreement with TRL's own loss code on the same tensors."""

from __future__ import annotations

import importlib.util
import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.pref import losses as P

TOL = dict(atol=1e-6, rtol=1e-6)


def grad_of(fn, *leaves):
    leaves = [x.detach().clone().requires_grad_(True) for x in leaves]
    out = fn(*leaves)
    grads = torch.autograd.grad(out.sum(), leaves, allow_unused=True)
    return out.detach(), [torch.zeros_like(x) if g is None else g for x, g in zip(leaves, grads, strict=True)]


# ---- golden values, each computed by hand in the comment ------------------------------------------------------------
def test_sigmoid_cdpo_and_robust_golden() -> None:
    h = torch.tensor([1.0], dtype=torch.float64)
    # −log σ(0.1) = log(1 + e^−0.1) = 0.6443966600735709
    assert P.sigmoid_loss(h, 0.1).item() == pytest.approx(0.6443966600735709, abs=1e-12)
    # cDPO ε = 0.2: 0.8·0.64439666 + 0.2·log(1 + e^0.1) = 0.5155173281 + 0.2·0.7443966601 = 0.6643966601
    assert P.sigmoid_loss(h, 0.1, 0.2).item() == pytest.approx(0.6643966600735709, abs=1e-12)
    # robust ε = 0.2: (0.5155173281 − 0.1488793320) / 0.6 = 0.6110633267
    assert P.robust_loss(h, 0.1, 0.2).item() == pytest.approx(0.6110633267402376, abs=1e-12)
    with pytest.raises(ValueError, match=r"\[0, 0.5\)"):
        P.robust_loss(h, 0.1, 0.5)


def test_ipo_hinge_exo_golden() -> None:
    h = torch.tensor([1.0, 20.0], dtype=torch.float64)
    assert P.ipo_loss(h, 0.1).tolist() == [16.0, 225.0]  # (1 − 5)², (20 − 5)²
    assert P.hinge_loss(h, 0.1).tolist() == pytest.approx([0.9, 0.0])  # max(0, 1 − 0.1), max(0, 1 − 2)
    zero = torch.zeros(1, dtype=torch.float64)
    # h = 0: q = (½, ½); ε = 0.1: ½(log ½ − log 0.9) + ½(log ½ − log 0.1) = ½ log(0.25/0.09) = 0.5108256238
    assert P.exo_pair_loss(zero, 1.0, 0.1).item() == pytest.approx(0.5 * math.log(0.25 / 0.09), abs=1e-12)
    assert P.exo_pair_loss(zero, 1.0, 0.5).item() == pytest.approx(0.0, abs=1e-12)  # q = p
    with pytest.raises(ValueError, match="EXO needs label_smoothing"):
        P.exo_pair_loss(zero, 1.0, 0.0)


def test_simpo_kto_alol_copg_golden() -> None:
    t = lambda *v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    # SimPO: β = 2, γ = 0.5, averages −1 and −2: z = 2·1 − 0.5 = 1.5, −log σ(1.5) = log(1 + e^−1.5) = 0.2014132780
    assert P.simpo_loss(t(-1.0), t(-2.0), 2.0, 0.5).item() == pytest.approx(math.log1p(math.exp(-1.5)), abs=1e-12)
    # KTO: ρ = 0.5, z_ref = 0.1, β = 1: desirable 1 − σ(0.4) = 0.4013123399, undesirable 1 − σ(−0.4) = 0.5986876601
    out = P.kto_loss(t(0.5, 0.5), torch.tensor([True, False]), t(0.1), 1.0)
    assert out.tolist() == pytest.approx([0.401312339887548, 0.598687660112452], abs=1e-12)
    assert P.kto_loss(t(0.5), torch.tensor([True]), t(0.1), 1.0, lam_d=2.0).item() == pytest.approx(0.802624679775096)
    assert P.kto_z_ref(t(-1.0, 0.5)).item() == 0.0 and P.kto_z_ref(t(1.0, 0.5)).item() == 0.75  # max(0, mean)
    # A-LoL: one sequence of two tokens, log π_θ = (−1, −1), log π_ref = (−1.5, −1.5), A = 2
    logp, ref, mask = t(-1.0, -1.0)[None], t(-1.5, -1.5)[None], torch.ones(1, 2)
    adv = t(2.0)
    assert P.a_lol_loss(logp, ref, mask, adv, "ref_free").item() == pytest.approx(4.0)  # 2·2
    # w = clip(e^{−2+3}, 0.1, 1.9) = clip(2.718, .) = 1.9: 1.9·2·2 = 7.6
    assert P.a_lol_loss(logp, ref, mask, adv, "a_lol").item() == pytest.approx(7.6)
    # per token w_t = clip(e^{0.5}, 0.1, 1.9) = 1.6487212707: 2·(1.6487·1 + 1.6487·1) = 6.5948850828
    assert P.a_lol_loss(logp, ref, mask, adv, "seq").item() == pytest.approx(4 * math.exp(0.5), abs=1e-9)
    # KL: 2·2 + 0.5·(−2 − (−3)) = 4.5
    assert P.a_lol_loss(logp, ref, mask, adv, "kl", kl_beta=0.5).item() == pytest.approx(4.5)
    # CoPG: R = (1, 0), ρ = (0.5, −0.5), β = 0.5: (1 − 0.25) − (0 + 0.25) = 0.5; 0.5² / (2·0.5) = 0.25
    assert P.copg_loss(t(1.0), t(0.0), t(0.5), t(-0.5), 0.5).item() == pytest.approx(0.25)


def test_wpo_weights_golden() -> None:
    # a uniform policy over V = 4: log π = log ¼, log Σπ² = log ¼, so ā = 0 and w = min(1, e^0) = 1
    logits = torch.zeros(1, 3, 4, dtype=torch.float64)
    lss = P.log_sum_sq_probs(logits)
    assert torch.allclose(lss, torch.full((1, 3), math.log(0.25), dtype=torch.float64))
    logp = torch.full((1, 3), math.log(0.25), dtype=torch.float64)
    mask = torch.ones(1, 3)
    assert P.wpo_weights(logp, lss, mask, logp, lss, mask).item() == pytest.approx(1.0)
    # a token half as likely as under "agreement": ā = log ½ per side, w = e^{2 log ½} = ¼
    half = lss + math.log(0.5)
    assert P.wpo_weights(half, lss, mask, half, lss, mask).item() == pytest.approx(0.25)
    # above agreement the clamp holds w at 1 (TRL f2cd577 drops it: e^{2 log 2} = 4)
    dbl = lss + math.log(2.0)
    assert P.wpo_weights(dbl, lss, mask, dbl, lss, mask).item() == pytest.approx(1.0)
    assert P.wpo_weights(dbl, lss, mask, dbl, lss, mask, clamp=False).item() == pytest.approx(4.0)


def test_tgdpo_weights_and_xpo_golden() -> None:
    w_w, w_l = P.tgdpo_weights(torch.tensor([0.2, -0.4]), torch.tensor([0.2]), alpha=0.5)
    assert w_w.tolist() == pytest.approx([1.1, 0.8]) and w_l.tolist() == pytest.approx([0.9])
    assert P.xpo_term(torch.tensor([-10.0]), 1e-5).item() == pytest.approx(-1e-4)


# ---- properties ---------------------------------------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(st.integers(1, 5), st.integers(1, 7), st.integers(0, 2**31 - 1))
def test_masked_positions_are_inert_and_padding_invariant(B: int, T: int, seed: int) -> None:
    """Any value (NaN, inf) at a masked position changes no sum and no gradient; extra padding columns change
    nothing."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64)
    mask = (torch.rand(B, T, generator=g) < 0.7).double()
    junk = torch.where(mask.bool(), logp, torch.full_like(logp, float("nan")))
    assert torch.equal(P.seq_logps(junk, mask), P.seq_logps(logp, mask))
    _, (grad,) = grad_of(lambda x: P.seq_logps(x, mask), junk)
    assert torch.isfinite(grad).all() and torch.equal(grad, mask)
    padded, pmask = (
        torch.cat([logp, torch.full((B, 3), float("inf"), dtype=torch.float64)], 1),
        torch.cat([mask, torch.zeros(B, 3, dtype=torch.float64)], 1),
    )
    assert torch.allclose(P.mean_logps(padded, pmask), P.mean_logps(logp, mask), **TOL)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 6), st.integers(1, 9), st.integers(0, 2**31 - 1))
def test_sampo_keeps_min_length_tokens_of_the_longer_side(B: int, T: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    mw = (torch.rand(B, T, generator=g) < 0.6).float()
    ml = (torch.rand(B, T, generator=g) < 0.6).float()
    nw, nl = P.sampo_masks(mw, ml, torch.Generator().manual_seed(seed))
    assert torch.equal(nw.sum(1), torch.minimum(mw.sum(1), ml.sum(1)))
    assert torch.equal(nl.sum(1), torch.minimum(mw.sum(1), ml.sum(1)))
    assert bool((nw <= mw).all() and (nl <= ml).all()), "a kept position must be a valid one"


# ---- reductions to DPO: loss and gradient to 1e-6 -----------------------------------------------------------------
def pair_batch(seed=0, B=4, T=6):
    g = torch.Generator().manual_seed(seed)
    mk = lambda: -torch.rand(B, T, generator=g, dtype=torch.float64) * 2  # noqa: E731
    lw, ll, rw, rl = mk(), mk(), mk(), mk()
    mw = (torch.rand(B, T, generator=g) < 0.8).double()
    ml = (torch.rand(B, T, generator=g) < 0.8).double()
    mw[:, 0] = ml[:, 0] = 1
    return lw, ll, rw, rl, mw, ml


def dpo(lw, ll, rw, rl, mw, ml, beta=0.1, ww=None, wl=None):
    h = (P.seq_logps(lw, mw, ww) - P.seq_logps(rw, mw, ww)) - (P.seq_logps(ll, ml, wl) - P.seq_logps(rl, ml, wl))
    return P.sigmoid_loss(h, beta)


def test_sampo_with_equal_lengths_equals_dpo() -> None:
    lw, ll, rw, rl, mw, _ = pair_batch()
    ml = mw.clone()  # equal lengths: nothing to down-sample
    nw, nl = P.sampo_masks(mw, ml, torch.Generator().manual_seed(0))
    assert torch.equal(nw, mw) and torch.equal(nl, ml)
    a, ga = grad_of(lambda x, y: dpo(x, y, rw, rl, nw, nl), lw, ll)
    b, gb = grad_of(lambda x, y: dpo(x, y, rw, rl, mw, ml), lw, ll)
    assert torch.allclose(a, b, **TOL) and all(torch.allclose(x, y, **TOL) for x, y in zip(ga, gb, strict=True))


def test_tgdpo_with_alpha_zero_equals_dpo() -> None:
    lw, ll, rw, rl, mw, ml = pair_batch(1)
    rew = torch.randn(lw.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    ww, wl = P.tgdpo_weights(rew, rew, alpha=0.0)
    a, ga = grad_of(lambda x, y: dpo(x, y, rw, rl, mw, ml, ww=ww, wl=wl), lw, ll)
    b, gb = grad_of(lambda x, y: dpo(x, y, rw, rl, mw, ml), lw, ll)
    assert torch.allclose(a, b, **TOL) and all(torch.allclose(x, y, **TOL) for x, y in zip(ga, gb, strict=True))


def test_wpo_with_unit_weights_equals_dpo() -> None:
    lw, ll, rw, rl, mw, ml = pair_batch(2)
    lss_w, lss_l = lw.detach().clone(), ll.detach().clone()  # log π = log Σπ² on every token: ā = 0, w = 1
    w = P.wpo_weights(lw, lss_w, mw, ll, lss_l, ml)
    assert torch.equal(w, torch.ones_like(w))
    a, ga = grad_of(lambda x, y: w * dpo(x, y, rw, rl, mw, ml), lw, ll)
    b, gb = grad_of(lambda x, y: dpo(x, y, rw, rl, mw, ml), lw, ll)
    assert torch.allclose(a, b, **TOL) and all(torch.allclose(x, y, **TOL) for x, y in zip(ga, gb, strict=True))


def test_alol_ref_free_is_advantage_weighted_nll_and_alol_at_the_reference_too() -> None:
    lw, _, _, _, mw, _ = pair_batch(3)
    adv = torch.tensor([0.0, 0.5, 1.0, 2.0], dtype=torch.float64)
    a, ga = grad_of(lambda x: P.a_lol_loss(x, x.detach(), mw, adv, "ref_free"), lw)
    b, gb = grad_of(lambda x: adv * -(x * mw).sum(1), lw)
    assert torch.allclose(a, b, **TOL) and torch.allclose(ga[0], gb[0], **TOL)
    # at π_θ = π_ref the clipped weight is 1: A-LoL and A-LoL seq reduce to ref-free
    for variant in ("a_lol", "seq"):
        c, gc = grad_of(lambda x, v=variant: P.a_lol_loss(x, x.detach(), mw, adv, v), lw)
        assert torch.allclose(c, b, **TOL) and torch.allclose(gc[0], gb[0], **TOL), variant


def test_copg_with_a_constant_reward_gap_is_ipo_up_to_beta_over_two() -> None:
    """CoPG's stated relation to IPO: with R(y_w) − R(y_l) = c it is (β/2)·IPO on summed log-ratios, τ = β/(2c)."""
    lw, ll, rw, rl, mw, ml = pair_batch(4)
    beta, c = 0.5, 2.0

    def copg(x, y):
        rho_w, rho_l = P.seq_logps(x, mw) - P.seq_logps(rw, mw), P.seq_logps(y, ml) - P.seq_logps(rl, ml)
        return P.copg_loss(torch.full_like(rho_w, c), torch.zeros_like(rho_l), rho_w, rho_l, beta)

    def ipo(x, y):
        h = (P.seq_logps(x, mw) - P.seq_logps(rw, mw)) - (P.seq_logps(y, ml) - P.seq_logps(rl, ml))
        return beta / 2 * P.ipo_loss(h, beta / (2 * c))

    a, ga = grad_of(copg, lw, ll)
    b, gb = grad_of(ipo, lw, ll)
    assert torch.allclose(a, b, **TOL) and all(torch.allclose(x, y, **TOL) for x, y in zip(ga, gb, strict=True))


# ---- against TRL on the same tensors ------------------------------------------------------------------------------
needs_trl = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="trl is not installed (make install)")


class _Accel(SimpleNamespace):
    device = torch.device("cpu")

    def gather_for_metrics(self, x):
        return x

    gather = gather_for_metrics


def _trl_self(**kw):
    base = dict(
        model=SimpleNamespace(training=True),
        accelerator=_Accel(),
        aux_loss_enabled=False,
        ld_alpha=None,
        precompute_ref_logps=True,
        f_divergence_type="reverse_kl",
        loss_weights=[1.0],
        label_smoothing=0.0,
        use_weighting=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        _total_train_tokens=0,
        _tp_size=1,
        calculate_KL=False,
        desirable_weight=1.0,
        undesirable_weight=1.0,
    )
    return SimpleNamespace(**{**base, **kw})


def _trl_model(per_token_logps, log_sum_sq=None):
    """A stand-in for TRL's fused-head forward: returns our per-token log-probs (0 at masked positions, as the fused
    head gives for label −100) and the statistics TRL logs."""

    def forward(**kwargs):
        z = torch.zeros_like(per_token_logps)
        return SimpleNamespace(
            log_probs=per_token_logps,
            entropy=z,
            mean_logits=z,
            is_top1=z.bool(),
            log_sum_sq_probs=log_sum_sq if log_sum_sq is not None else z,
        )

    return forward


def _trl_dpo_inputs(mw, ml, rw, rl):
    """TRL's batch layout: [chosen; rejected] rows, completion_mask over input_ids (shifted by one inside)."""
    B, T = mw.shape
    cm = torch.cat([mw, ml]).long()
    full = torch.cat([torch.zeros(2 * B, 1, dtype=torch.long), cm], 1)  # one prompt token before the completion
    return {
        "input_ids": torch.ones_like(full),
        "attention_mask": torch.ones_like(full),
        "completion_mask": full,
        "ref_chosen_logps": P.seq_logps(rw, mw),
        "ref_rejected_logps": P.seq_logps(rl, ml),
    }


TRL_PAIR_CASES = {
    # TRL loss_type: (its settings, ours per pair from (h, h from length-averaged log-ratios))
    "sigmoid": ({"beta": 0.1}, lambda h, hbar: P.sigmoid_loss(h, 0.1)),
    "robust": ({"beta": 0.1, "label_smoothing": 0.2}, lambda h, hbar: P.robust_loss(h, 0.1, 0.2)),
    "hinge": ({"beta": 0.5}, lambda h, hbar: P.hinge_loss(h, 0.5)),
    "ipo": ({"beta": 0.1}, lambda h, hbar: P.ipo_loss(hbar, 0.1)),
    "exo_pair": ({"beta": 0.1, "label_smoothing": 1e-3}, lambda h, hbar: P.exo_pair_loss(h, 0.1, 1e-3)),
}


@needs_trl
@pytest.mark.parametrize("loss_type", sorted(TRL_PAIR_CASES))
def test_pair_losses_match_trl_dpo_trainer(loss_type: str) -> None:
    from trl.trainer.dpo_trainer import DPOTrainer

    settings_, ours = TRL_PAIR_CASES[loss_type]
    lw, ll, rw, rl, mw, ml = pair_batch(5)

    def trl_loss(x, y):
        per_token = torch.cat([x * mw, y * ml])
        stub = _trl_self(loss_types=[loss_type], **settings_)
        return DPOTrainer._compute_loss(stub, _trl_model(per_token), _trl_dpo_inputs(mw, ml, rw, rl), False)

    def our_loss(x, y):
        rho_w, rho_l = P.seq_logps(x, mw) - P.seq_logps(rw, mw), P.seq_logps(y, ml) - P.seq_logps(rl, ml)
        hbar = rho_w / mw.sum(1) - rho_l / ml.sum(1)
        return ours(rho_w - rho_l, hbar).mean()

    a, ga = grad_of(trl_loss, lw, ll)
    b, gb = grad_of(our_loss, lw, ll)
    assert torch.allclose(a, b, **TOL), (loss_type, a, b)
    assert all(torch.allclose(x, y, **TOL) for x, y in zip(ga, gb, strict=True)), loss_type


@needs_trl
@pytest.mark.parametrize("clamp", [False])
def test_wpo_weighting_matches_trl_use_weighting(clamp: bool) -> None:
    """TRL f2cd577's use_weighting: the same aligned weight, without the clamp at 1 (ours with clamp=False)."""
    from trl.trainer.dpo_trainer import DPOTrainer

    B, T, V = 3, 5, 7
    g = torch.Generator().manual_seed(6)
    logits_w, logits_l = (
        torch.randn(B, T, V, generator=g, dtype=torch.float64),
        torch.randn(B, T, V, generator=g, dtype=torch.float64),
    )
    tok_w, tok_l = torch.randint(V, (B, T), generator=g), torch.randint(V, (B, T), generator=g)
    _, _, rw, rl, mw, ml = pair_batch(6, B, T)

    def logps(logits, tok):
        return torch.log_softmax(logits, -1).gather(-1, tok[..., None])[..., 0]

    def trl_loss(a, b):
        per_token = torch.cat([logps(a, tok_w) * mw, logps(b, tok_l) * ml])
        lss = torch.cat([P.log_sum_sq_probs(a), P.log_sum_sq_probs(b)])
        stub = _trl_self(loss_types=["sigmoid"], beta=0.1, use_weighting=True)
        return DPOTrainer._compute_loss(stub, _trl_model(per_token, lss), _trl_dpo_inputs(mw, ml, rw, rl), False)

    def our_loss(a, b):
        pw, pl = logps(a, tok_w), logps(b, tok_l)
        w = P.wpo_weights(pw, P.log_sum_sq_probs(a), mw, pl, P.log_sum_sq_probs(b), ml, clamp=clamp)
        return (w * dpo(pw, pl, rw, rl, mw, ml)).mean()

    x, gx = grad_of(trl_loss, logits_w, logits_l)
    y, gy = grad_of(our_loss, logits_w, logits_l)
    assert torch.allclose(x, y, **TOL) and all(torch.allclose(a, b, **TOL) for a, b in zip(gx, gy, strict=True))


@needs_trl
def test_simpo_matches_trl_cpo_trainer() -> None:
    """TRL's CPOTrainer(loss_type="simpo") on length-averaged log-probs, simpo_gamma the absolute γ, cpo_alpha 0."""
    from trl.experimental.cpo.cpo_trainer import CPOTrainer

    g = torch.Generator().manual_seed(7)
    avg_w, avg_l = -torch.rand(5, generator=g, dtype=torch.float64), -torch.rand(5, generator=g, dtype=torch.float64)
    stub = SimpleNamespace(
        alpha=0.0, loss_type="simpo", simpo_gamma=0.5, beta=2.0, label_smoothing=0.1, accelerator=_Accel()
    )
    a, ga = grad_of(lambda x, y: CPOTrainer.cpo_loss(stub, x, y)[0], avg_w, avg_l)
    b, gb = grad_of(lambda x, y: P.simpo_loss(x, y, 2.0, 0.5, 0.1), avg_w, avg_l)
    assert torch.allclose(a, b, **TOL) and all(torch.allclose(x, y, **TOL) for x, y in zip(ga, gb, strict=True))


@needs_trl
def test_kto_matches_trl_kto_trainer() -> None:
    """TRL's KTOTrainer with precomputed reference log-probs and its mismatched-pair KL estimate."""
    from trl.trainer.kto_trainer import KTOTrainer

    B, T = 6, 5
    g = torch.Generator().manual_seed(8)
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64)
    ref = -torch.rand(B, T, generator=g, dtype=torch.float64)
    mask = (torch.rand(B, T, generator=g) < 0.8).double()
    mask[:, 0] = 1
    labels = torch.tensor([True, False, True, True, False, False])
    kl_logp, kl_ref = (
        -torch.rand(B, generator=g, dtype=torch.float64),
        -torch.rand(B, generator=g, dtype=torch.float64) * 2,
    )

    def trl_loss(x):
        full = torch.cat([torch.zeros(B, 1), mask], 1).long()

        def forward(**kwargs):
            if kwargs["input_ids"].shape[1] == 2:  # the KL pass: its sums are given
                return SimpleNamespace(log_probs=kl_logp[:, None])
            z = torch.zeros(B, T, dtype=torch.float64)
            return SimpleNamespace(log_probs=x * mask, entropy=z, mean_logits=z)

        batch = {
            "input_ids": torch.ones_like(full),
            "attention_mask": torch.ones_like(full),
            "completion_mask": full,
            "label": labels,
            "ref_logps": P.seq_logps(ref, mask),
            "KL_input_ids": torch.ones(B, 2, dtype=torch.long),
            "KL_attention_mask": torch.ones(B, 2, dtype=torch.long),
            "KL_completion_mask": torch.ones(B, 2, dtype=torch.long),
            "ref_KL_logps": kl_ref,
        }
        stub = _trl_self(loss_type="kto", beta=0.1, calculate_KL=True, desirable_weight=1.3, undesirable_weight=0.7)
        stub._compute_kl_logps = lambda model, b: KTOTrainer._compute_kl_logps(stub, model, b)
        return KTOTrainer._compute_loss(stub, forward, batch, False)

    def our_loss(x):
        z = P.kto_z_ref(kl_logp - kl_ref)
        rho = P.seq_logps(x, mask) - P.seq_logps(ref, mask)
        return P.kto_loss(rho, labels, z, 0.1, lam_d=1.3, lam_u=0.7).mean()

    a, ga = grad_of(trl_loss, logp)
    b, gb = grad_of(our_loss, logp)
    assert torch.allclose(a, b, **TOL) and torch.allclose(ga[0], gb[0], **TOL)
