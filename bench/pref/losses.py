"""Preference-family loss primitives: sequence log-probs, pair losses, token weightings, unpaired and offline-PG losses.

Pure tensor functions, tested once (tests/test_pref_losses.py): hand-computed golden values, reductions to DPO and
agreement with TRL on the same tensors. Notation as ../shared/docs/algorithms-round2.md: ℓ(y) = Σ_t m_t log π(y_t)
the masked sum, ρ(y) = ℓ_θ(y) − ℓ_ref(y), h = ρ(y_w) − ρ(y_l). Every loss here is per pair (or per example) [N]; the
module divides their sum by the optimizer step's count (gradient accumulation leaves it unchanged).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from bench.rl.losses import masked_sum


def seq_logps(logp: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """[B, T] -> [B]: Σ_t m_t w_t log π(y_t); masked positions are inert even when they hold NaN or inf."""
    return masked_sum(logp if weights is None else logp * weights, mask, dim=-1)


def mean_logps(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] -> [B]: ℓ(y) / |y| (|y| at least 1)."""
    return seq_logps(logp, mask) / mask.sum(-1).clamp(min=1)


# ---- pair losses on the DPO logit h (A1, A2, A10, A11) ---------------------------------------------------------------
def sigmoid_loss(h: torch.Tensor, beta: float, smoothing: float = 0.0) -> torch.Tensor:
    """DPO (Rafailov et al. 2023, Eq. 7): −log σ(βh); with ε > 0 conservative DPO (cDPO): (1−ε)(−log σ(βh)) +
    ε(−log σ(−βh))."""
    return -(1 - smoothing) * F.logsigmoid(beta * h) - smoothing * F.logsigmoid(-beta * h)


def robust_loss(h: torch.Tensor, beta: float, eps: float) -> torch.Tensor:
    """Robust DPO (Chowdhury et al. 2024): [(1−ε)(−log σ(βh)) − ε(−log σ(−βh))] / (1 − 2ε), ε in [0, ½)."""
    if not 0 <= eps < 0.5:
        raise ValueError(f"robust DPO needs label_smoothing in [0, 0.5), got {eps}")
    return (-(1 - eps) * F.logsigmoid(beta * h) + eps * F.logsigmoid(-beta * h)) / (1 - 2 * eps)


def ipo_loss(h: torch.Tensor, tau: float) -> torch.Tensor:
    """IPO (Azar et al. 2024, Eq. 17): (h − 1/(2τ))². The caller passes h from length-averaged log-ratios (the form
    TRL and HALOs use, confirmed with the authors per TRL's comment) or from sums (TRL's online trainers)."""
    return (h - 1 / (2 * tau)) ** 2


def hinge_loss(h: torch.Tensor, beta: float) -> torch.Tensor:
    """RSO's hinge-norm (Liu et al. 2024): max(0, 1 − βh), β playing the paper's γ."""
    return torch.relu(1 - beta * h)


def exo_pair_loss(h: torch.Tensor, beta: float, eps: float) -> torch.Tensor:
    """EXO for a pair (Ji et al. 2024, Eq. 16): KL(q ‖ p) with q = (σ(βh), σ(−βh)) and the labels p = (1−ε, ε):
    σ(βh)(log σ(βh) − log(1−ε)) + σ(−βh)(log σ(−βh) − log ε). Needs ε > 0."""
    if not 0 < eps < 1:
        raise ValueError(f"EXO needs label_smoothing in (0, 1) (the paper's labels imply 4.5e-5), got {eps}")
    qw, ql = torch.sigmoid(beta * h), torch.sigmoid(-beta * h)
    return qw * (F.logsigmoid(beta * h) - math.log1p(-eps)) + ql * (F.logsigmoid(-beta * h) - math.log(eps))


def simpo_loss(avg_w: torch.Tensor, avg_l: torch.Tensor, beta: float, gamma: float, smoothing: float = 0.0):
    """SimPO (Meng et al. 2024, Eq. 6): −log σ(β(ℓ_w/|y_w| − ℓ_l/|y_l|) − γ), no reference; ``gamma`` is the
    absolute margin γ (the authors' code takes γ/β; γ = β·gamma_beta_ratio). Label smoothing as in cDPO."""
    z = beta * (avg_w - avg_l) - gamma
    return -(1 - smoothing) * F.logsigmoid(z) - smoothing * F.logsigmoid(-z)


# ---- token weightings (A4, A5, A6) -------------------------------------------------------------------------------
def sampo_masks(mask_w: torch.Tensor, mask_l: torch.Tensor, generator: torch.Generator | None = None):
    """SamPO (Lu et al. 2024): per pair T_m = min(|y_w|, |y_l|); the longer response keeps T_m of its valid positions
    drawn uniformly without replacement, the shorter keeps all. -> the two new masks (same shapes, same dtype).
    NOTE(deviation): the policy and the reference sums use the same draw; the authors' code lets the reference pass
    draw its own subset."""
    out_w, out_l = mask_w.clone(), mask_l.clone()
    for i in range(mask_w.shape[0]):
        nw, nl = int(mask_w[i].sum()), int(mask_l[i].sum())
        longer, n_keep = (out_w, nl) if nw > nl else (out_l, nw)
        if nw == nl or n_keep == 0:
            if n_keep == 0:
                longer[i] = 0  # an empty response: the pair carries no tokens on either side
            continue
        valid = longer[i].float()
        keep = torch.multinomial(valid.cpu(), n_keep, replacement=False, generator=generator).to(valid.device)
        row = torch.zeros_like(longer[i])
        row[keep] = 1
        longer[i] = row
    return out_w, out_l


def tgdpo_weights(token_reward_w: torch.Tensor, token_reward_l: torch.Tensor, alpha: float):
    """TGDPO (Zhu et al. 2025, Eq. 12 as in the authors' trainer): token weights 1 + α·r̂_t(y_w) on the chosen and
    1 − α·r̂_t(y_l) on the rejected, with r̂_t = β(log π_r − log π_ref) from a frozen DPO-trained model π_r; unclipped."""
    return 1 + alpha * token_reward_w, 1 - alpha * token_reward_l


def wpo_weights(
    logp_w: torch.Tensor,
    log_sum_sq_w: torch.Tensor,
    mask_w: torch.Tensor,
    logp_l: torch.Tensor,
    log_sum_sq_l: torch.Tensor,
    mask_l: torch.Tensor,
    clamp: bool = True,
) -> torch.Tensor:
    """WPO (Zhou et al. 2024, Eq. 2 with the aligned normaliser): per pair w = min(1, exp(ā(y_w) + ā(y_l))), detached,
    where ā(y) = (1/|y|) Σ_t m_t [log π_θ(y_t) − log Σ_v π_θ(v)²]. ``clamp=False`` drops the min(1, ·) (TRL f2cd577)."""
    with torch.no_grad():
        a_w = mean_logps(logp_w - log_sum_sq_w, mask_w)
        a_l = mean_logps(logp_l - log_sum_sq_l, mask_l)
        w = torch.exp(a_w + a_l)
    return w.clamp(max=1.0) if clamp else w


def log_sum_sq_probs(logits: torch.Tensor) -> torch.Tensor:
    """[.., V] -> [..]: log Σ_v π(v)², the log-probability that two samples of π agree (WPO's normaliser)."""
    return torch.logsumexp(
        2 * torch.log_softmax(logits, -1, dtype=torch.promote_types(logits.dtype, torch.float32)), -1
    )


def xpo_term(ref_sample_logps: torch.Tensor, alpha: float) -> torch.Tensor:
    """XPO (Xie et al. 2024; TRL's XPOTrainer): α·ℓ_θ(ỹ) for a reference sample ỹ, added to the DPO loss; minimising
    it lowers the likelihood of what the reference would say (the exploration bonus)."""
    return alpha * ref_sample_logps


# ---- unpaired and off-policy policy-gradient losses (A12, A14, A15) ----------------------------------------------
def kto_z_ref(mismatched_rho: torch.Tensor) -> torch.Tensor:
    """KTO's reference point: max(0, mean ρ_θ(y'|x)) over mismatched (prompt, completion) pairs, detached."""
    return mismatched_rho.detach().mean().clamp(min=0)


def kto_loss(
    rho: torch.Tensor, desirable: torch.Tensor, z_ref: torch.Tensor, beta: float, lam_d: float = 1.0, lam_u: float = 1.0
) -> torch.Tensor:
    """KTO (Ethayarajh et al. 2024, Eq. 7 as in HALOs and TRL): λ_D(1 − σ(β(ρ − z_ref))) for desirable y,
    λ_U(1 − σ(β(z_ref − ρ))) for undesirable y. [N] per example."""
    d = desirable.to(rho.device, torch.bool)  # labels come from the host-side pairing (bench/pref/pairs.py)
    return torch.where(
        d, lam_d * (1 - torch.sigmoid(beta * (rho - z_ref))), lam_u * (1 - torch.sigmoid(beta * (z_ref - rho)))
    )


def a_lol_loss(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    mask: torch.Tensor,
    adv: torch.Tensor,
    variant: str = "a_lol",
    clip: float = 0.9,
    kl_beta: float = 0.0,
) -> torch.Tensor:
    """A-LoL (Baheti et al. 2024, Eq. 4 and §3's variants; the authors' lolrl code), per example [N], the whole
    completion one action, A = max(0, R − V_ref) ≥ 0 given:
    ``a_lol``: clip(exp(ℓ_θ − ℓ_ref), 1−ε, 1+ε)·A·(−ℓ_θ), the weight detached; ``ref_free``: A·(−ℓ_θ);
    ``seq``: A·Σ_t clip(π_θ(y_t)/π_ref(y_t), 1−ε, 1+ε)·(−log π_θ(y_t)), per-token weights detached;
    ``kl``: A·(−ℓ_θ) + kl_beta·(ℓ_θ − ℓ_ref)."""
    nll = -seq_logps(logp, mask)
    if variant == "ref_free":
        return adv * nll
    if variant == "a_lol":
        w = torch.exp((seq_logps(logp, mask) - seq_logps(ref_logp, mask)).detach()).clamp(1 - clip, 1 + clip)
        return w * adv * nll
    if variant == "seq":
        w_t = torch.exp(torch.where(mask.bool(), logp - ref_logp, torch.zeros_like(logp)).detach()).clamp(
            1 - clip, 1 + clip
        )
        return adv * -seq_logps(logp, mask, w_t)
    if variant == "kl":
        return adv * nll + kl_beta * (seq_logps(logp, mask) - seq_logps(ref_logp, mask))
    raise ValueError(f"unknown A-LoL variant {variant!r}: choose one of a_lol, ref_free, seq, kl")


def copg_loss(reward_1: torch.Tensor, reward_2: torch.Tensor, rho_1: torch.Tensor, rho_2: torch.Tensor, beta: float):
    """CoPG (Flet-Berliac et al. 2024), as reconstructed in ../shared/docs/algorithms-round2.md A15 [secondary]:
    (1/(2β))·(R^β(y) − R^β(y'))² with R^β(y) = R(y) − β·ρ_θ(y); its gradient is −(R^β(y) − R^β(y'))·∇(ℓ_θ(y) −
    ℓ_θ(y')), a policy gradient in which each sample is the other's baseline. Writing h = ρ_1 − ρ_2 and ΔR = R_1 − R_2
    it equals (β/2)·(h − ΔR/β)²: for a constant ΔR = c, β/2 times IPO on summed log-ratios with 1/(2τ) = c/β."""
    diff = (reward_1 - beta * rho_1) - (reward_2 - beta * rho_2)
    return diff.square() / (2 * beta)
