"""Shared loss primitives: masked reductions, loss aggregation, KL estimators, clipped surrogate, group advantages.

Pure tensor functions, tested once (tests/test_losses.py). Shapes: B completions, T completion tokens, G group size.
Formulas: ../shared/docs/algorithms.md (Notation).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from bench.registry import Choices

AggMode = str  # a name in AGGREGATIONS (below): token-mean | seq-mean-token-mean | seq-mean-token-sum | ...
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
    group_tokens: torch.Tensor | None = field(default=None, compare=False)
    """[number of groups] tokens of each prompt's group in the optimizer step (prompt-mean); None: not known."""
    num_prompts: int = 0
    """Prompts with at least one row in the optimizer step (prompt-mean)."""

    @staticmethod
    def of(mask: torch.Tensor, budget: int = 1, groups: torch.Tensor | None = None) -> Norm:
        """``groups`` [B]: each row's prompt index (row // G), for prompt-mean aggregation."""
        if groups is None:
            return Norm(num_seqs=mask.shape[0], num_tokens=float(mask.sum()), budget=budget)
        groups = groups.to(mask.device)
        tokens = torch.zeros(int(groups.max()) + 1, dtype=mask.dtype, device=mask.device)
        tokens = tokens.index_add(0, groups, mask.sum(-1))
        return Norm(mask.shape[0], float(mask.sum()), budget, tokens, int(groups.unique().numel()))


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    # where(), not x*mask: a NaN/inf at a masked position must not leak into the sum
    x = torch.where(mask.bool(), x, torch.zeros_like(x))
    return x.sum() if dim is None else x.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    return masked_sum(x, mask, dim) / mask.sum(dim).clamp(min=1)


def _prompt_mean(loss_mat, mask, norm, groups):
    """SkyRL's prompt_mean: (1/P) Σ_p (1/N_p) Σ_{i∈p} Σ_t m ℓ, P prompts and N_p the tokens of prompt p's rows in
    the optimizer step, so every prompt counts equally whatever its completions' lengths."""
    if groups is None or norm.group_tokens is None:
        raise ValueError("loss_agg=prompt-mean needs each row's prompt (groups) and the step's Norm.of(..., groups=)")
    per_row = masked_sum(loss_mat, mask, dim=-1) / norm.group_tokens[groups.to(mask.device)].clamp(min=1)
    return per_row.sum() / max(norm.num_prompts, 1)


# loss aggregation: (per-token loss [B, T], mask [B, T], the step's Norm, row prompts [B] | None) -> scalar
AGGREGATIONS = Choices(
    "loss_agg",
    "bench.rl.losses.AGGREGATIONS",
    {
        "token-mean": lambda x, m, n, g: masked_sum(x, m) / max(n.num_tokens, 1.0),
        "seq-mean-token-mean": lambda x, m, n, g: (
            (masked_sum(x, m, dim=-1) / m.sum(-1).clamp(min=1)).sum() / n.num_seqs
        ),
        "seq-mean-token-sum": lambda x, m, n, g: masked_sum(x, m, dim=-1).sum() / n.num_seqs,
        "constant-normalised": lambda x, m, n, g: (masked_sum(x, m, dim=-1) / n.budget).sum() / n.num_seqs,
        "prompt-mean": _prompt_mean,
    },
)


def agg_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: AggMode,
    norm: Norm | None = None,
    groups: torch.Tensor | None = None,
) -> torch.Tensor:
    """Aggregate a per-token loss matrix [B, T] to a scalar; ``norm`` holds the optimizer step's denominators
    (default: this batch's own), ``groups`` [B] each row's prompt (prompt-mean only)."""
    if mode not in AGGREGATIONS:
        AGGREGATIONS.check(mode)
    if norm is None:
        norm = Norm.of(mask, groups=groups) if groups is not None else Norm.of(mask)
    return AGGREGATIONS[mode](loss_mat, mask, norm, groups)


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
    """Place each sequence's score on its last unmasked token ([B], [B, T] -> [B, T]). The mask may have holes (an
    episode's loss mask leaves out the environment's tokens): the last unmasked position, not the count."""
    t = torch.arange(mask.shape[-1], device=mask.device)
    last = torch.where(mask.bool(), t, torch.zeros_like(t)).argmax(-1)  # a prefix mask: its length − 1
    out = torch.zeros_like(mask, dtype=scores.dtype)
    return out.scatter(-1, last.unsqueeze(-1), scores.unsqueeze(-1)) * (mask.sum(-1, keepdim=True) > 0)


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int) -> torch.Tensor:
    """DAPO's soft overlong punishment: 0 up to L_max − L_cache, then linear down to −1 at L_max, −1 beyond."""
    if buffer <= 0:
        return torch.where(lengths > max_len, -1.0, 0.0)
    start = max_len - buffer
    return (-(lengths.float() - start) / buffer).clamp(min=-1.0, max=0.0)


# ---- off-policy and training-inference mismatch: behaviour weights from π_old (recomputed) and μ (the sampler) ----
# Every weight below is constant in θ (computed from log π_old and log μ before the update) and multiplies the
# per-token policy loss. Formulas and sources: ../shared/docs/algorithms-round2.md, part B.
def token_tis(old_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor, cap: float) -> torch.Tensor:
    """Token TIS (Yao et al. 2025): w_t = min(π_old(y_t)/μ(y_t), C), one-sided ([B, T] -> [B, T])."""
    return token_ratio(old_logp, sampler_logp, mask).clamp(max=cap)


def sequence_is_ratio(old_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Π_t π_old(y_t)/μ(y_t) per sequence, as exp of the masked log-sum; the exponent is capped at 80 (e^80 ≈ 5e34,
    inside float32), which changes no weight a cap or band below 1e34 would keep ([B, T] -> [B])."""
    return torch.exp(masked_sum(old_logp - sampler_logp, mask, dim=-1).clamp(max=80.0))


def sequence_tis(old_logp, sampler_logp, mask, cap: float) -> torch.Tensor:
    """Sequence TIS: w_i = min(Π_t π_old/μ, C), the same for every token of the sequence ([B, T] -> [B, T])."""
    return sequence_is_ratio(old_logp, sampler_logp, mask).clamp(max=cap).unsqueeze(-1).expand_as(mask)


def sequence_masked_is(old_logp, sampler_logp, mask, low: float, high: float) -> torch.Tensor:
    """Sequence-masked IS (Seq-MIS): w_i = ρ_i·1[a ≤ ρ_i ≤ b], ρ_i = Π_t π_old/μ: sequences outside the band are
    rejected, the others keep their IS weight ([B, T] -> [B, T])."""
    rho = sequence_is_ratio(old_logp, sampler_logp, mask)
    w = torch.where((rho >= low) & (rho <= high), rho, torch.zeros_like(rho))
    return w.unsqueeze(-1).expand_as(mask)


def icepop(old_logp, sampler_logp, mask, low: float, high: float) -> torch.Tensor:
    """IcePop: k_t = π_old(y_t)/μ(y_t); w_t = k_t if α ≤ k_t ≤ β else 0 (the in-band weight is the ratio k, as verl,
    slime and OpenRLHF implement it; SkyRL uses 1) ([B, T] -> [B, T])."""
    k = token_ratio(old_logp, sampler_logp, mask)
    return torch.where((k >= low) & (k <= high), k, torch.zeros_like(k))


def m2po_mask(old_logp, sampler_logp, mask, threshold: float) -> torch.Tensor:
    """M2PO, AReaL's variant (Zheng, Zhao, Chen 2025): over all valid tokens, mask those with the largest
    Δ² = (log π_old − log μ)² until the mean Δ² of the rest is below τ_M2 ([B, T] -> [B, T] float, 1 kept, 0 masked).
    When no such rest exists (every Δ² ≥ τ), the single smallest-Δ² token is kept, as AReaL does
    (``num_to_mask = n − 1``): a step is never left without a token to learn from. Ties are broken by position (a
    stable sort), so the mask is a pure function of its inputs."""
    m = mask.bool()
    d2 = torch.where(m, (old_logp - sampler_logp).square(), torch.zeros_like(old_logp)).flatten()
    valid = m.flatten()
    n = int(valid.sum())
    keep = torch.ones_like(d2)
    if n == 0:
        return keep.view_as(mask)
    vals = torch.where(valid, d2, torch.full_like(d2, -1.0))
    order = vals.argsort(descending=True, stable=True)[:n]  # the valid tokens, largest Δ² first
    sorted_d2 = d2[order]
    rest_sum = sorted_d2.sum() - torch.cat([sorted_d2.new_zeros(1), sorted_d2.cumsum(0)[:-1]])  # Σ after removing k
    rest_mean = rest_sum / torch.arange(n, 0, -1, device=d2.device, dtype=d2.dtype)  # k = 0 .. n−1
    below = (rest_mean < threshold).nonzero()
    k = int(below[0]) if len(below) else n - 1  # masked: the fewest that bring the mean below τ, else all but one
    keep[order[:k]] = 0.0
    return keep.view_as(mask)


# ---- surrogates beyond the clip (each returns the objective to maximise per token and where its gradient is cut) ----
def dual_clip(objective: torch.Tensor, adv: torch.Tensor, c: float):
    """Dual-clip PPO (Ye et al. 2019): for A < 0 the clipped objective is bounded below by c·A, so a huge ratio on a
    negative-advantage token cannot dominate; returns (objective, where the bound is active)."""
    bounded = (adv < 0) & (objective < c * adv)
    return torch.where(bounded, c * adv, objective), bounded


def cispo_objective(logp, ratio, adv, eps_low: float, eps_high: float):
    """CISPO (MiniMax-M1, Eq. 4-5): sg(clip(ρ, 1−ε_low, 1+ε_high))·A·log π_θ; every token keeps a gradient (through
    log π), the clip only bounds its weight. Returns (objective, where the weight is clipped)."""
    w = ratio.detach().clamp(1.0 - eps_low, 1.0 + eps_high)
    return w * adv * logp, w != ratio.detach()


def gmpo_objective(logp, old_logp, adv, mask, c_low: float, c_high: float):
    """GMPO (Zhao et al. 2025): a sign-aware clip of Δ_t = log π_θ − log π_old in log space, Δ̃ = sgn(A)·min(sgn(A)·Δ,
    sgn(A)·clip(Δ, −c_low, c_high)), then the geometric mean of the token ratios, A_i·exp(mean_t Δ̃_t), the same value
    on every token of sequence i (with seq-mean-token-mean this is the mean over sequences, as the paper's loss).
    adv [B, T] (constant along T). Returns (objective [B, T], where the clip is active)."""
    delta = torch.where(mask.bool(), logp - old_logp, torch.zeros_like(logp))
    sgn = torch.sign(adv)
    clamped = delta.clamp(-c_low, c_high)
    tilde = sgn * torch.minimum(sgn * delta, sgn * clamped)
    geo = torch.exp(masked_mean(tilde, mask, dim=-1)).unsqueeze(-1)  # [B, 1]
    return adv * geo, (delta != clamped) & mask.bool()


def covariance(adv: torch.Tensor, logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Cui et al. 2025: Cov_t = (A_t − mean A)·(log π_θ(y_t) − mean log π_θ), means over the valid tokens, the second
    one detached ([B, T] -> [B, T])."""
    return (adv - masked_mean(adv, mask)) * (logp - masked_mean(logp.detach(), mask))


def clip_cov_keep(cov, clipped, mask, ratio: float, lb: float, ub: float, generator=None) -> torch.Tensor:
    """Clip-Cov: among valid tokens with lb < Cov < ub that the PPO clip has not already cut, choose
    max(1, ⌊ratio·N_valid⌋) at random and zero their loss ([B, T] float: 0 on the chosen tokens, 1 elsewhere)."""
    candidates = ((cov > lb) & (cov < ub) & mask.bool() & ~clipped).nonzero()
    keep = torch.ones_like(mask, dtype=cov.dtype)
    n = max(int(ratio * float(mask.sum())), 1)
    if len(candidates):
        # host: an index
        chosen = candidates[torch.randperm(len(candidates), generator=generator)[: min(n, len(candidates))]]
        keep[chosen[:, 0], chosen[:, 1]] = 0.0
    return keep


def kl_cov_select(cov: torch.Tensor, mask: torch.Tensor, ratio: float) -> torch.Tensor:
    """KL-Cov: the top max(1, ⌊ratio·N_valid⌋) valid tokens by Cov_t ([B, T] bool). ``ratio`` is a fraction (verl's
    kl_cov_ratio; the authors' k_percent / 100)."""
    m = mask.bool()
    n_valid = int(m.sum())
    out = torch.zeros_like(m)
    if n_valid == 0:
        return out
    k = max(1, int(n_valid * ratio))
    where = m.flatten().nonzero().squeeze(-1)  # the valid tokens in row-major order, as verl lists them
    out.view(-1)[where[cov.detach().flatten()[where].topk(k).indices]] = True  # ties: as verl, padding never counts
    return out
