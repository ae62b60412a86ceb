"""GPG: Group Policy Gradient (Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline",
arXiv 2504.02546, Eq. 6-8).

    Â_i = α·(r_i − mean_g r)/F,   α = B/(B − M),  M = samples in zero-variance groups,  F ∈ {1, std_g}
    ℒ_{i,t} = −Â_i · log π_θ(y_{i,t}),   token-mean;  no ratio, no clip, no KL

α rescales the batch so groups without signal do not dilute the gradient. Choices: advantage=gpg, adv_scale=none
(F = 1), ratio=none, trust_region=none, loss_agg=token-mean, no KL. Reference: ../shared/docs/algorithms.md (GPG,
[seeds + framework]).

Deviations from the paper
# NOTE(deviation): F = 1 by default (adv_scale=group_std gives F = std); the paper reports both.
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
class GPGConfig(PolicyGradientConfig):
    name: str = "gpg"
    advantage: Advantage = "gpg"
    adv_scale: AdvScale = "none"
    """F = 1"""
    ratio: Ratio = "none"
    trust_region: TrustRegion = "none"
    loss_agg: AggMode = "token-mean"
    kl_placement: KLPlacement = "none"
    beta: float = 0.0


class GPG(PolicyGradient):
    Config = GPGConfig
    description = "GPG (Chu et al. 2025): plain policy gradient, group baseline rescaled by the zero-variance fraction"
