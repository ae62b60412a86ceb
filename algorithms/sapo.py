"""SAPO: Soft Adaptive Policy Optimization (Qwen team 2025; as implemented in the frameworks that cite it).

    f_τ(ρ) = (4/τ)·σ(τ(ρ − 1)),   τ = τ_pos if Â > 0 else τ_neg
    ℒ_{i,t} = −f_τ(ρ_{i,t})·Â_i,   seq-mean-token-mean, no clip

A smooth, temperature-controlled gate instead of a hard clip; df/dρ = 1 at ρ = 1, so on-policy it is the plain
policy gradient. Choices: advantage=group, ratio=token, trust_region=sapo (τ_pos = 1.0, τ_neg = 1.05), no KL.
Reference: ../shared/docs/algorithms.md (SAPO, [framework]).

Deviations from the paper
# NOTE(deviation): formula taken from a framework implementation ([framework] in algorithms.md), not the PDF.
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
class SAPOConfig(PolicyGradientConfig):
    name: str = "sapo"
    advantage: Advantage = "group"
    adv_scale: AdvScale = "group_std"
    ratio: Ratio = "token"
    trust_region: TrustRegion = "sapo"
    sapo_tau_pos: float = 1.0
    """τ_pos"""
    sapo_tau_neg: float = 1.05
    """τ_neg"""
    loss_agg: AggMode = "seq-mean-token-mean"
    kl_placement: KLPlacement = "none"
    beta: float = 0.0


class SAPO(PolicyGradient):
    Config = SAPOConfig
    description = "SAPO (Qwen 2025): soft sigmoid gate on the token ratio instead of a hard clip"
