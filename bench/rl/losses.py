"""Shared loss primitives: masked reductions, loss aggregation, KL estimators, clipped surrogate, group advantages.

Pure tensor functions, tested once (tests/test_losses.py). Shapes: B completions, T completion tokens, G group size.
Formulas: ../shared/docs/algorithms.md (Notation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

AggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "constant-normalised"]
KLKind = Literal["k1", "k2", "k3"]


@dataclass(frozen=True)
class Norm:
    """Denominators of one optimizer step. A micro-batch's loss divides by these, not by its own counts, so summing
    micro-batch losses (gradient accumulation) gives exactly the full-batch loss."""

    num_seqs: int
    """B of the whole optimizer step."""
    num_tokens: float
    """Σ m over the whole optimizer step."""
    budget: int = 1
    """L_budget for constant-normalised aggregation (the generation budget)."""

    @staticmethod
    def of(mask: torch.Tensor, budget: int = 1) -> Norm:
        return Norm(num_seqs=mask.shape[0], num_tokens=float(mask.sum()), budget=budget)


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    # where(), not x*mask: a NaN/inf at a masked position must not leak into the sum
    x = torch.where(mask.bool(), x, torch.zeros_like(x))
    return x.sum() if dim is None else x.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    return masked_sum(x, mask, dim) / mask.sum(dim).clamp(min=1)


def agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: AggMode, norm: Norm | None = None) -> torch.Tensor:
    """Aggregate a per-token loss matrix [B, T] to a scalar; ``norm`` holds the optimizer step's denominators
    (default: this batch's own)."""
    norm = norm or Norm.of(mask)
    if mode == "token-mean":
        return masked_sum(loss_mat, mask) / max(norm.num_tokens, 1.0)
    per_seq = masked_sum(loss_mat, mask, dim=-1)  # [B]
    if mode == "seq-mean-token-mean":
        per_seq = per_seq / mask.sum(-1).clamp(min=1)
    elif mode == "constant-normalised":
        per_seq = per_seq / norm.budget
    elif mode != "seq-mean-token-sum":
        raise ValueError(f"unknown loss aggregation {mode!r}: choose one of {AggMode.__args__}")
    return per_seq.sum() / norm.num_seqs


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: KLKind) -> torch.Tensor:
    """Per-token estimate of KL(π_θ || π_ref) from samples of π_θ (Schulman 2020), with d = log π_ref − log π_θ:
    k1 = −d, k2 = ½d², k3 = e^d − d − 1 (≥ 0, unbiased)."""
    d = ref_logp - logp
    if kind == "k1":
        return -d
    if kind == "k2":
        return 0.5 * d.square()
    if kind == "k3":
        # NOTE(deviation): e^d is evaluated at min(d, 20) (e^d overflows fp32 beyond 88); for d > 20, i.e. π_ref/π_θ
        # above 5e8, k3 grows linearly instead of exponentially. Such tokens only arise from a diverged policy.
        return torch.expm1(d.clamp(max=20.0)) - d
    raise ValueError(f"unknown KL estimator {kind!r}: choose one of {KLKind.__args__}")


def token_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """ρ = exp(log π_θ − log π_old) on unmasked tokens, exactly 1 on masked ones: an overflowing or NaN log-ratio at a
    masked position would otherwise turn the backward 0·inf into NaN for every parameter."""
    return torch.exp(torch.where(mask.bool(), logp - old_logp, torch.zeros_like(logp)))


def clipped_surrogate(ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float):
    """C(ρ, A) = min(ρA, clip(ρ, 1−ε_l, 1+ε_h)A), to maximise; also the mask of tokens where the clip is active
    (the gradient through ρ is zero there)."""
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    return torch.minimum(unclipped, clipped), clipped < unclipped


def group_advantages(
    rewards: torch.Tensor,
    group_size: int,
    scale: Literal["std", "none"] = "std",
    eps: float = 1e-6,
    unbiased: bool = True,
) -> torch.Tensor:
    """Â_i = (r_i − mean_g r) / (std_g r + ε) per group of G consecutive rows ([B] -> [B]).

    A constant-reward group gives exactly 0 (its centred rewards are 0; std + ε > 0), never NaN.
    """
    B = rewards.shape[0]
    assert B % group_size == 0, f"batch of {B} is not a whole number of groups of {group_size}"
    r = rewards.view(-1, group_size)  # [P, G]
    centred = r - r.mean(-1, keepdim=True)
    # r - mean(r) is rounding error, not 0, for a constant group of e.g. 0.7s; divided by std + ε it would become a
    # same-sign push on the whole group. Zero such groups exactly.
    centred = torch.where((r == r[:, :1]).all(-1, keepdim=True), torch.zeros_like(centred), centred)
    if scale == "std":
        std = r.std(-1, unbiased=unbiased, keepdim=True) if group_size > 1 else torch.zeros_like(r[:, :1])
        centred = centred / (std + eps)
    elif scale != "none":
        raise ValueError(f"unknown advantage scale {scale!r}: choose std or none")
    return centred.reshape(B)


def zero_variance_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """[P] bool: groups whose rewards are all equal (they carry no group-relative signal)."""
    r = rewards.view(-1, group_size)
    return (r == r[:, :1]).all(-1)


def sequence_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO's s_i = exp((1/L_i) Σ_t m ℓ_{i,t}), the length-normalised sequence ratio ([B, T] -> [B])."""
    return torch.exp(masked_mean(logp - old_logp, mask, dim=-1))


def sequence_token_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO-token's s_{i,t} = sg[s_i] · π_θ(y_t) / sg[π_θ(y_t)]: the value of s_i, the gradient of a token ratio
    ([B, T] -> [B, T])."""
    s = sequence_ratio(logp, old_logp, mask).detach().unsqueeze(-1)
    return s * token_ratio(logp, logp.detach(), mask)


def sequence_mean_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GRPO-S's sequence weight w_i = (1/L_i) Σ_t m ρ_{i,t}, the arithmetic mean of the token ratios ([B, T] -> [B])."""
    return masked_mean(token_ratio(logp, old_logp, mask), mask, dim=-1)


def sapo_gate(ratio: torch.Tensor, adv: torch.Tensor, tau_pos: float, tau_neg: float) -> torch.Tensor:
    """SAPO's soft trust region f_τ(ρ)·A with f_τ(ρ) = (4/τ)·σ(τ(ρ − 1)), τ = τ_pos if A > 0 else τ_neg.
    df/dρ at ρ = 1 is 1, so on-policy it is the plain policy gradient."""
    tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
    return (4.0 / tau) * torch.sigmoid(tau * (ratio - 1.0)) * adv


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """A_i = R_i − mean_{j≠i} R_j = G/(G−1)·(R_i − mean_g R) (Ahmadian et al. 2024) ([B] -> [B])."""
    assert group_size > 1, "RLOO needs at least 2 samples per prompt"
    centred = group_advantages(rewards, group_size, scale="none")
    return centred * group_size / (group_size - 1)


def whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8, shift_mean: bool = True) -> torch.Tensor:
    """(x − mean)/(std + eps) with token-weighted statistics over the unmasked entries of the whole batch
    (REINFORCE++'s global normalisation). Population std."""
    m = mask.bool()
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean).square(), mask)
    out = (x - mean) if shift_mean else x
    out = torch.where(m, out / (var.sqrt() + eps), torch.zeros_like(x))
    # A constant batch: x − mean is rounding error, which /(std + eps) would blow up into a same-sign push.
    constant = bool(m.any()) and bool(x[m].max() == x[m].min())
    return torch.zeros_like(x) if constant and shift_mean else out


def return_to_go(token_rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Undiscounted Σ_{s≥t} r_s over unmasked tokens ([B, T] -> [B, T])."""
    r = torch.where(mask.bool(), token_rewards, torch.zeros_like(token_rewards))
    return torch.where(mask.bool(), r.flip(-1).cumsum(-1).flip(-1), torch.zeros_like(r))


def step_return(step_rewards: torch.Tensor, steps: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Σ_{k ≥ j} γ^{k−j} r_k for each token of step j, discounted per step, not per token ([B, T] -> [B, T]).

    ``steps`` marks each step's last token, where its reward sits; a token belongs to the first step ending at or after
    it. γ = 1 is the undiscounted return-to-go; γ = 0 credits each token with its own step's reward only.
    """
    if gamma == 1.0:
        return return_to_go(step_rewards, mask)
    s, m = steps.bool() & mask.bool(), mask.bool()
    out, run = torch.zeros_like(step_rewards), torch.zeros_like(step_rewards[:, 0])
    for t in range(step_rewards.shape[1] - 1, -1, -1):  # right to left: a step's end folds the steps after it in
        run = torch.where(s[:, t], step_rewards[:, t] + gamma * run, run)
        out[:, t] = torch.where(m[:, t], run, torch.zeros_like(run))
    return out


def process_advantages(
    step_rewards: torch.Tensor,
    steps: torch.Tensor,
    mask: torch.Tensor,
    group_size: int,
    eps: float = 1e-6,
    unbiased: bool = True,
    gamma: float = 1.0,
) -> torch.Tensor:
    """GRPO's process supervision (DeepSeekMath, Shao et al. 2024, §4.1.3): each step reward is normalised by the mean
    and std of all step rewards of its group, r̃ = (r − mean R) / (std R + ε), and token t's advantage is the sum of
    the normalised rewards of the steps that end at or after t, Â_t = Σ_{end(j) ≥ t} r̃_j ([B, T] -> [B, T]).

    ``step_rewards`` [B, T]: each step's reward on its last token; ``steps`` [B, T] bool marks those tokens (a step
    rewarded 0 is still a step). A group whose step rewards are all equal gives exactly 0. Tokens after a row's last
    step get 0. ``gamma`` < 1 discounts later steps (``step_return``); 1 is the paper's sum.
    """
    B, T = step_rewards.shape
    assert B % group_size == 0, f"batch of {B} is not a whole number of groups of {group_size}"
    s = steps.bool() & mask.bool()
    r = torch.where(s, step_rewards, torch.zeros_like(step_rewards)).view(-1, group_size * T)  # [P, G·T]
    sg = s.view(-1, group_size * T)
    n = sg.sum(-1, keepdim=True)
    mean = r.sum(-1, keepdim=True) / n.clamp(min=1)
    dev = torch.where(sg, r - mean, torch.zeros_like(r))
    var = dev.square().sum(-1, keepdim=True) / (n - int(unbiased)).clamp(min=1)
    inf = torch.full_like(r, float("inf"))
    constant = torch.where(sg, r, -inf).amax(-1, keepdim=True) <= torch.where(sg, r, inf).amin(-1, keepdim=True)
    # all of a group's steps equal (or none): no signal, exactly 0 (not rounding error divided by ε)
    norm = torch.where(constant, torch.zeros_like(dev), dev / (var.sqrt() + eps)).view(B, T)
    return step_return(norm, steps, mask, gamma)


def terminal_rewards(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Place each sequence's score on its last unmasked token ([B], [B, T] -> [B, T])."""
    last = (mask.sum(-1).long() - 1).clamp(min=0)  # masks are prefixes
    out = torch.zeros_like(mask, dtype=scores.dtype)
    return out.scatter(-1, last.unsqueeze(-1), scores.unsqueeze(-1)) * (mask.sum(-1, keepdim=True) > 0)


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int) -> torch.Tensor:
    """DAPO's soft overlong punishment: 0 up to L_max − L_cache, then linear down to −1 at L_max, −1 beyond."""
    if buffer <= 0:
        return torch.where(lengths > max_len, -1.0, 0.0)
    start = max_len - buffer
    return (-(lengths.float() - start) / buffer).clamp(min=-1.0, max=0.0)
