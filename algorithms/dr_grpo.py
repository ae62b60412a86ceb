"""Dr. GRPO: GRPO Done Right (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv 2503.20783, Eq. 3).

    A_i = r_i − mean_g r                                   (no division by std: removes the question-difficulty bias)
    ℒ = 1/G Σ_i 1/L_budget Σ_t −min(ρ_{i,t} A_i, clip(ρ_{i,t}, 1−ε, 1+ε) A_i)   (no 1/|o_i|: removes the length bias)

Choices: advantage=group, adv_scale=none, ratio=token, clip 0.2, loss_agg=constant-normalised (L_budget =
rollout.max_new_tokens), β = 0. Reference: ../shared/docs/algorithms.md (Dr. GRPO, [primary]).

Deviations from the paper
# NOTE(deviation): none in the objective; G follows the harness's rollout budget (paper: 8, the harness default).
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
    TrustRegion,
)


@dataclass
class DrGRPOConfig(PolicyGradientConfig):
    name: str = "dr_grpo"
    advantage: Advantage = "group"
    adv_scale: AdvScale = "none"
    """A_i = r_i − mean(r): no std"""
    ratio: Ratio = "token"
    trust_region: TrustRegion = "clip"
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    loss_agg: AggMode = "constant-normalised"
    """Σ_t / generate_max_length"""
    kl_placement: KLPlacement = "none"
    beta: float = 0.0


class DrGRPO(PolicyGradient):
    Config = DrGRPOConfig
    description = "Dr. GRPO (Liu et al. 2025): no std scaling, constant (budget) normalisation, no KL"
