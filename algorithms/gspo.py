"""GSPO: Group Sequence Policy Optimization (Zheng et al. 2025, Qwen, arXiv 2507.18071, Eq. 5-7).

    s_i(θ) = (π_θ(y_i|x) / π_old(y_i|x))^{1/|y_i|} = exp(1/|y_i| Σ_t log ρ_{i,t})
    ℒ = 1/G Σ_i −min(s_i Â_i, clip(s_i, 1−ε_l, 1+ε_h) Â_i)      (a sequence-level ratio and clip)

Choices: advantage=group (z-score), ratio=sequence, trust_region=clip (on s_i: a sequence clip), ε_l = 3e-4,
ε_h = 4e-4, loss_agg=seq-mean-token-mean (with s_i and Â_i constant in a sequence this is the mean over sequences),
no KL. Reference: ../shared/docs/algorithms.md (GSPO, [framework]).

Deviations from the paper
# NOTE(deviation): conf/algorithm/gspo.yaml splits each rollout into 4 minibatches (the paper uses several) so the
#   ratio departs from 1 and the tiny clip range is exercised.
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
class GSPOConfig(PolicyGradientConfig):
    name: str = "gspo"
    advantage: Advantage = "group"
    adv_scale: AdvScale = "group_std"
    ratio: Ratio = "sequence"
    """s_i, Eq. 7"""
    trust_region: TrustRegion = "clip"
    clip_eps_low: float = 3e-4
    """ε_l"""
    clip_eps_high: float = 4e-4
    """ε_h"""
    loss_agg: AggMode = "seq-mean-token-mean"
    kl_placement: KLPlacement = "none"
    beta: float = 0.0


class GSPO(PolicyGradient):
    Config = GSPOConfig
    description = "GSPO (Zheng et al. 2025): length-normalised sequence ratio and sequence clip"
