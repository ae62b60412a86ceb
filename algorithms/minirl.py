"""MiniRL (Zheng et al. 2025, Qwen, "Stabilizing RL with LLMs: formulation and practices", arXiv 2512.01374).

    ℒ_t = −Â_i · sg[min(π_θ(y_t)/μ(y_t), C)] · M_t · log π_θ(y_t)
    M_t = 0 if (Â_i > 0 and π_θ/π_old > 1 + ε_h) or (Â_i < 0 and π_θ/π_old < 1 − ε_l), else 1

REINFORCE whose importance weight goes to the inference policy μ (the sampler), with a trust-region mask decided
against the training engine's π_old: the paper's point is that the token-level surrogate is a first-order
approximation valid only when both π_old/μ and π_θ/π_old stay near 1. Group z-score advantage, token-mean, C = 10,
ε = 0.2, no KL. Choices: advantage=group, trust_region=minirl.
Reference: ../shared/docs/algorithms-round2.md (B10, [primary for claims; framework for the formula]).

Deviations from the paper
# NOTE(deviation): the formula is sail-sg/Stable-RL's re-implementation (loss_mode="ppo_recompute  # MiniRL"); the
#   paper's normalisation (1/|y| or token-mean) and ε are [unverified]: token-mean and ε_l = ε_h = 0.2 here.
# NOTE(deviation): no Routing Replay (a mixture-of-experts fix; the models here are dense).
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.rl.losses import AggMode
from bench.rl.objective import Advantage, AdvScale, KLPlacement, PolicyGradient, PolicyGradientConfig, TrustRegion


@dataclass
class MiniRLConfig(PolicyGradientConfig):
    name: str = "minirl"
    advantage: Advantage = "group"
    adv_scale: AdvScale = "group_std"
    trust_region: TrustRegion = "minirl"
    clip_eps_low: float = 0.2
    """ε_l of the mask"""
    clip_eps_high: float = 0.2
    """ε_h of the mask"""
    minirl_is_cap: float = 10.0
    """C"""
    loss_agg: AggMode = "token-mean"
    kl_placement: KLPlacement = "none"
    beta: float = 0.0


class MiniRL(PolicyGradient):
    Config = MiniRLConfig
    description = "MiniRL (Zheng et al. 2025): REINFORCE with IS to the sampler and a trust-region mask vs pi_old"
