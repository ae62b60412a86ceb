"""LitePPO (Liu et al. 2025, "Part I: Tricks or Traps? A Deep Dive into RL for LLM Reasoning", arXiv 2508.08221).

    A_i = (R_i − mean_{group(i)} R) / (std_{batch} R + ε)          (group mean, batch std)
    ℒ = 1/Σ_i|o_i| Σ_i Σ_t −min(ρ_t A_i, clip(ρ_t, 1−ε, 1+ε) A_i)  (vanilla clip 0.2, token-level aggregation)

The paper's two tricks on a critic-free PPO and nothing else: a configuration of existing choices (advantage=group,
adv_scale=batch_std, ratio=token, trust_region=clip, loss_agg=token-mean, no KL).
Reference: ../shared/docs/algorithms-round2.md (B8, [framework]: alibaba/ROLL functionals.py reward_norm).

Deviations from the paper
# NOTE(deviation): ROLL's LitePPO doc lists loss_agg_mode seq-mean-token-mean and a GAE estimator with group size 1
#   next to token_level_loss: true; this follows the paper's two ingredients (group mean / batch std and token-mean)
#   with G > 1 and no critic.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.rl.losses import AggMode
from bench.rl.objective import Advantage, AdvScale, KLPlacement, PolicyGradient, PolicyGradientConfig, TrustRegion


@dataclass
class LitePPOConfig(PolicyGradientConfig):
    name: str = "lite_ppo"
    advantage: Advantage = "group"
    adv_scale: AdvScale = "batch_std"
    """the batch's std of the raw rewards"""
    trust_region: TrustRegion = "clip"
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    loss_agg: AggMode = "token-mean"
    kl_placement: KLPlacement = "none"
    beta: float = 0.0


class LitePPO(PolicyGradient):
    Config = LitePPOConfig
    description = "LitePPO (Liu et al. 2025): group-mean / batch-std advantage and token-level loss, nothing else"
