"""GRPO-S: Sequence-Level GRPO with Dynamic Entropy Weighting (Tan et al. 2025, "GTPO and GRPO-S: Token and
Sequence-Level Reward Shaping with Policy Entropy", arXiv 2508.04349 v6; equations as
summarised in ../shared/docs/algorithms.md, the primary text was not read).

Ĥ_i = mean token entropy of completion i under π_old; O+ (correct, n) and O− (incorrect, m) as in GTPO:

    O+:  r̂_i = β1·r_i + β2·(Ĥ_i / Σ_{k∈O+} Ĥ_k)·n
    O−:  r̂_j = −β1 + β2·((1/Ĥ_j) / Σ_{k∈O−} 1/Ĥ_k)·m·(−1)
    Â_i = (r̂_i − mean_g r̂) / (std_g r̂ + ε)                                   (group z-score)
    w_i = (1/|o_i|) Σ_t ρ_{i,t}                                              (arithmetic mean of the token ratios)
    ℒ = 1/G Σ_i −min(w_i Â_i, clip(w_i, 1−ε_low, 1+ε_high) Â_i)

Choices: advantage=group (z-score of r̂, this file's reward), ratio=sequence_mean, trust_region=clip 0.2 / 0.28 (on
w_i: a sequence clip), loss_agg=seq-mean-token-mean (w_i and Â_i are constant in a sequence, so this is the mean over
sequences), no KL. Reference: ../shared/docs/algorithms.md (GTPO and GRPO-S, [secondary]).

Deviations from the paper
# NOTE(deviation): as GTPO: O+ / O− from ``correct_threshold`` or the task's is_correct; ε = 1e-8 as Ĥ/(ΣĤ + ε) and
#   1/(Ĥ + ε); the entropy is the temperature-scaled sampling distribution's over the full vocabulary.
# NOTE(deviation): the group std is the sample std (adv_std_unbiased, as GRPO here); the paper does not say.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms.gtpo import correct_set
from bench.rl.credit import masked_stats
from bench.rl.losses import AggMode, masked_mean
from bench.rl.objective import (
    Advantage,
    AdvScale,
    KLPlacement,
    PolicyGradient,
    PolicyGradientConfig,
    Ratio,
    TrustRegion,
    advantages,
)


@dataclass
class GRPOSConfig(PolicyGradientConfig):
    name: str = "grpo_s"
    advantage: Advantage = "group"
    adv_scale: AdvScale = "group_std"
    ratio: Ratio = "sequence_mean"
    """w_i = (1/|o_i|) Σ_t ρ_{i,t}"""
    trust_region: TrustRegion = "clip"
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.28
    loss_agg: AggMode = "seq-mean-token-mean"
    kl_placement: KLPlacement = "none"
    beta: float = 0.0
    beta1: float = 1.0
    """β1: weight of the outcome reward."""
    beta2: float = 0.1
    """β2: weight of the entropy-weighted sequence bonus (O+) / penalty (O−)."""
    correct_threshold: float | None = None
    """A completion is in O+ when its score >= this; None: the task's is_correct (task.correct_threshold)."""
    entropy_eps: float = 1e-8
    """ε in the entropy denominators."""

    def choices(self) -> dict[str, str]:
        return {**super().choices(), "correct_threshold": str(self.correct_threshold)}


def sequence_entropy_weights(mean_entropy, correct, group_size: int, eps: float) -> torch.Tensor:
    """[B]: Ĥ_i/Σ_{O+} Ĥ·n on O+ rows, (1/Ĥ_j)/Σ_{O−} (1/Ĥ)·m on O− rows. mean_entropy: [B]; correct: [B] bool."""
    H, c = mean_entropy.view(-1, group_size), correct.view(-1, group_size)  # [P, G]
    zero = torch.zeros_like(H)
    inv = torch.where(c, zero, 1.0 / (H + eps))
    n, m = c.sum(-1, keepdim=True), (~c).sum(-1, keepdim=True)
    w_pos = H / (torch.where(c, H, zero).sum(-1, keepdim=True) + eps) * n
    w_neg = inv / inv.sum(-1, keepdim=True).clamp(min=eps) * m
    return torch.where(c, w_pos, w_neg).reshape(-1)


def grpo_s_rewards(rewards, correct, mean_entropy, group_size: int, cfg: GRPOSConfig):
    """-> (r̂ [B], entropy weight [B])."""
    w = sequence_entropy_weights(mean_entropy, correct, group_size, cfg.entropy_eps)
    return torch.where(correct, cfg.beta1 * rewards + cfg.beta2 * w, -cfg.beta1 - cfg.beta2 * w), w


class GRPOS(PolicyGradient):
    Config = GRPOSConfig
    multi_turn = False  # its entropy statistics run over every completion token
    description = "GRPO-S (Tan et al. 2025): entropy-weighted sequence rewards, mean token ratio, clip 0.2/0.28"
    needs_entropy = True

    def advantages(self, ro):
        cfg, G = self.acfg, ro.group_size
        correct = correct_set(ro.scores, ro.correct, cfg.correct_threshold)
        mean_entropy = masked_mean(ro.entropy, ro.mask, dim=-1)  # [B]: Ĥ_i
        r_hat, w = grpo_s_rewards(ro.rewards, correct, mean_entropy, G, cfg)
        self.step_stats.update(masked_stats(w, torch.ones_like(w), "stats/entropy_weight"))
        self.step_stats["stats/token_entropy_mean"] = float(masked_mean(ro.entropy, ro.mask))
        return advantages(cfg, r_hat, None, ro.train_mask, G)  # the family's estimator on r̂ (group z-score)
