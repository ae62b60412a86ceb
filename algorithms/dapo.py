"""DAPO: Decoupled Clip and Dynamic sAmpling Policy Optimization (Yu et al. 2025, arXiv 2503.14476).

    ℒ = 1/Σ_i|o_i| Σ_i Σ_t −min(ρ_{i,t} Â_i, clip(ρ_{i,t}, 1−ε_low, 1+ε_high) Â_i)   (token-mean, Eq. 8)
    s.t. 0 < |{o_i correct}| < G                                                     (dynamic sampling, Eq. 8)
    R_length(y) = 0 | ((L_max − L_cache) − |y|)/L_cache | −1                         (soft overlong penalty, Eq. 13)

Choices: advantage=group (z-score), ratio=token, trust_region=clip with ε_low = 0.2, ε_high = 0.28,
loss_agg=token-mean, no KL, truncation=overlong_penalty (L_max = rollout.max_new_tokens), dynamic_sampling.
Reference: ../shared/docs/algorithms.md (DAPO, [primary]).

Deviations from the paper
# NOTE(deviation): L_cache = 4 tokens of a 32-token budget here (paper: 4096 of 20480); the paper's reward is ±1,
#   the task's score is used as is (0/1 for Countdown), which changes only the scale of the z-scored advantage.
# NOTE(deviation): dynamic sampling stops after max_sampling_rounds generation rounds and trains on the groups it has
#   (the paper samples until the batch is full); rollout/groups_kept and rollout/sampling_rounds log what happened.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.rl.losses import AggMode
from bench.rl.objective import (
    Advantage,
    AdvScale,
    KLPlacement,
    PolicyGradient,
    PolicyGradientConfig,
    Ratio,
    Truncation,
    TrustRegion,
)


@dataclass
class DAPOConfig(PolicyGradientConfig):
    name: str = "dapo"
    advantage: Advantage = "group"
    adv_scale: AdvScale = "group_std"
    ratio: Ratio = "token"
    trust_region: TrustRegion = "clip"
    clip_eps_low: float = 0.2
    """ε_low"""
    clip_eps_high: float = 0.28
    """ε_high (clip-higher)"""
    loss_agg: AggMode = "token-mean"
    """1/Σ_i|o_i| Σ_i Σ_t"""
    kl_placement: KLPlacement = "none"
    beta: float = 0.0
    truncation: Truncation = "overlong_penalty"
    overlong_buffer: int = 4
    """L_cache"""
    dynamic_sampling: bool = True


class DAPO(PolicyGradient):
    Config = DAPOConfig
    description = "DAPO (Yu et al. 2025): clip-higher, token-mean, dynamic sampling, soft overlong penalty"
