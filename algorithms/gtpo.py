"""GTPO: Group Token Policy Optimization, Dynamic Entropy Weighting (Tan et al. 2025, "GTPO and GRPO-S: Token and
Sequence-Level Reward Shaping with Policy Entropy", arXiv 2508.04349 v6; equations as
summarised in ../shared/docs/algorithms.md, the primary text was not read).

The group splits into O+ (correct, n completions) and O− (incorrect, m). H_{i,t} is the full-vocabulary entropy of
π_old at token t (no gradient); d_t, h_t count the O+ / O− completions still generating at t.

    O+:  r̃_{i,t} = α1·r_i + α2·(H_{i,t} / Σ_{k∈O+, L_k≥t} H_{k,t})·d_t
    O−:  r̃_{j,t} = −α1 + α2·((1/H_{j,t}) / Σ_{k∈O−, L_k≥t} 1/H_{k,t})·h_t·(−1)
    Â_{i,t} = (r̃_{i,t} − mean R̃±) / (std R̃± + ε)      over the group's O+ tokens and its O− tokens, separately
    ℒ = 1/Σ_i|o_i| Σ_i Σ_t −min(ρ_{i,t} Â_{i,t}, clip(ρ_{i,t}, 1−ε_low, 1+ε_high) Â_{i,t})   (DAPO-style token-mean)

The entropy weight (H/ΣH·d_t, (1/H)/Σ(1/H)·h_t) averages 1 over the completions alive at t: α2 redistributes a
bonus (O+) or a penalty (O−) of α2 per token towards high-entropy tokens of correct completions and low-entropy
tokens of incorrect ones. Choices: ratio=token, trust_region=clip 0.2 / 0.28, loss_agg=token-mean, no KL; the
advantage is this file's (``advantage=group`` names its group-relative base; ``adv_norm`` the normalisation).
Reference: ../shared/docs/algorithms.md (GTPO and GRPO-S, [secondary]).

Deviations from the paper
# NOTE(deviation): O+ / O− is decided by ``correct_threshold`` (score >= threshold) or, when None, by the task's own
#   is_correct (its task.correct_threshold, 1.0 by default); the paper has binary rewards. r_i is the (shaped) reward.
# NOTE(deviation): separate O+ / O− normalisation is the secondary sources' reading of v6 (the primary text was not
#   readable); ``adv_norm=joint`` z-scores all of the group's tokens together. Both use every token once (token-level
#   statistics), the std of ``adv_std_unbiased`` and ε = adv_eps; a set whose token rewards are all equal (e.g. α2 = 0
#   with binary rewards under separate normalisation) gets Â = 0 exactly. Measured (results/gtpo_normalisation/):
#   with binary rewards every O+ token shares the outcome term, so separate normalisation leaves only the entropy term
#   and Countdown accuracy collapses (0.383 -> 0.043); adv_norm=joint learns (0.440, 3 seeds, dynamic sampling on).
# NOTE(deviation): ε = 1e-8 enters as H/(ΣH + ε) and 1/(H + ε); H is the entropy of the temperature-scaled sampling
#   distribution over the full vocabulary (top-p is not applied).
# NOTE(deviation): a group whose completions are all correct (or all incorrect) still gets entropy-driven token
#   advantages (its O+ or O− tokens differ in r̃); the paper trains beside DAPO, whose dynamic sampling drops such
#   groups: ``algorithm.dynamic_sampling=true`` does the same here (off by default, to share the rollout budget).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from bench.rl.credit import group_token_zscore, masked_stats
from bench.rl.losses import AggMode, masked_mean
from bench.rl.objective import (
    Advantage,
    AdvScale,
    KLPlacement,
    PolicyGradient,
    PolicyGradientConfig,
    Ratio,
    TrustRegion,
)

AdvNorm = Literal["separate", "joint"]


@dataclass
class GTPOConfig(PolicyGradientConfig):
    name: str = "gtpo"
    advantage: Advantage = "group"
    adv_scale: AdvScale = "group_std"
    ratio: Ratio = "token"
    trust_region: TrustRegion = "clip"
    clip_eps_low: float = 0.2
    """ε_low (DAPO)"""
    clip_eps_high: float = 0.28
    """ε_high (DAPO clip-higher)"""
    loss_agg: AggMode = "token-mean"
    kl_placement: KLPlacement = "none"
    beta: float = 0.0
    alpha1: float = 1.0
    """α1: weight of the outcome reward."""
    alpha2: float = 0.1
    """α2: weight of the entropy-weighted bonus (O+) / penalty (O−)."""
    adv_norm: AdvNorm = "separate"
    """z-score the group's O+ and O− tokens separately (v6, as read by secondary sources) or jointly."""
    correct_threshold: float | None = None
    """A completion is in O+ when its score >= this; None: the task's is_correct (task.correct_threshold)."""
    entropy_eps: float = 1e-8
    """ε in the entropy denominators."""

    def choices(self) -> dict[str, str]:
        return {**super().choices(), "adv_norm": self.adv_norm, "correct_threshold": str(self.correct_threshold)}


def correct_set(scores: torch.Tensor, task_correct: torch.Tensor, threshold: float | None) -> torch.Tensor:
    """[B] bool: membership of O+ (the task's verdict, or score >= threshold)."""
    return task_correct.bool() if threshold is None else scores >= threshold


def entropy_weights(entropy, correct, mask, group_size: int, eps: float) -> torch.Tensor:
    """[B, T]: H_{i,t}/Σ_{O+ alive at t} H·d_t on O+ rows, (1/H_{j,t})/Σ_{O− alive at t} (1/H)·h_t on O− rows, 0 at
    padding. entropy, mask: [B, T]; correct: [B] bool."""
    B, T = mask.shape
    live = mask.bool().view(-1, group_size, T)  # [P, G, T]
    pos = live & correct.view(-1, group_size, 1)
    neg = live & ~correct.view(-1, group_size, 1)
    zero = torch.zeros_like(entropy).view(-1, group_size, T)
    H = torch.where(live, entropy.view(-1, group_size, T), zero)
    inv = torch.where(neg, 1.0 / (H + eps), zero)
    d, h = pos.sum(1, keepdim=True), neg.sum(1, keepdim=True)  # [P, 1, T]: d_t, h_t
    w_pos = H / (torch.where(pos, H, zero).sum(1, keepdim=True) + eps) * d
    w_neg = inv / inv.sum(1, keepdim=True).clamp(min=eps) * h
    return torch.where(pos, w_pos, torch.where(neg, w_neg, zero)).view(B, T)


def gtpo_token_rewards(rewards, correct, entropy, mask, group_size: int, cfg: GTPOConfig):
    """-> (r̃ [B, T], entropy weight [B, T]); rewards, correct: [B]; entropy, mask: [B, T]."""
    w = entropy_weights(entropy, correct, mask, group_size, cfg.entropy_eps)
    pos = cfg.alpha1 * rewards.unsqueeze(-1) + cfg.alpha2 * w
    neg = -cfg.alpha1 - cfg.alpha2 * w
    r_tok = torch.where(correct.unsqueeze(-1), pos, neg)
    return torch.where(mask.bool(), r_tok, torch.zeros_like(r_tok)), w


def gtpo_advantages(token_rewards, correct, mask, group_size: int, cfg: GTPOConfig) -> torch.Tensor:
    """[B, T]: z-scores of the token rewards over the group's O+ and O− tokens (separate) or all its tokens (joint)."""
    m = mask.bool()
    z = lambda sel: group_token_zscore(token_rewards, sel, group_size, cfg.adv_eps, cfg.adv_std_unbiased)  # noqa: E731
    if cfg.adv_norm == "joint":
        return z(m)
    c = correct.unsqueeze(-1)
    return z(m & c) + z(m & ~c)


class GTPO(PolicyGradient):
    Config = GTPOConfig
    multi_turn = False  # its token rewards and entropies run over every completion token
    description = "GTPO (Tan et al. 2025): entropy-weighted token rewards, O+/O- token z-scores, DAPO-style clip"
    needs_entropy = True

    def advantages(self, ro):
        cfg, G = self.acfg, ro.group_size
        correct = correct_set(ro.scores, ro.correct, cfg.correct_threshold)
        r_tok, w = gtpo_token_rewards(ro.rewards, correct, ro.entropy, ro.mask, G, cfg)
        self.step_stats.update(masked_stats(w, ro.train_mask, "stats/entropy_weight"))
        self.step_stats["stats/token_entropy_mean"] = float(masked_mean(ro.entropy, ro.mask))
        return gtpo_advantages(r_tok, correct, ro.train_mask, G, cfg)
