"""REINFORCE with a baseline (Williams 1992, "Simple statistical gradient-following algorithms", Eq. 11).

    ∇J = E[(R − b) ∇ log π_θ(y|x)],   ℒ_{i,t} = −(R_i − b)·log π_θ(y_{i,t}),   b = mean of the batch's rewards

aggregated seq-mean-token-sum (the gradient of the sequence log-probability). Optional KL folded into R as Σ_t k1.
Choices: advantage=batch_mean, ratio=none (plain log-probability: no importance ratio, no trust region),
loss_agg=seq-mean-token-sum, KL none. Reference: ../shared/docs/algorithms.md (REINFORCE, [primary]).

Deviations from the paper
# NOTE(deviation): the baseline is the batch mean of the current rollout (Williams allows any b independent of the
#   action; b = 0 and an EMA are the other documented choices: advantage=none gives b = 0).
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.rl.losses import AggMode, KLKind
from bench.rl.objective import Advantage, KLPlacement, PolicyGradient, PolicyGradientConfig, Ratio, TrustRegion


@dataclass
class REINFORCEConfig(PolicyGradientConfig):
    name: str = "reinforce"
    advantage: Advantage = "batch_mean"
    """b = mean_batch(R)"""
    ratio: Ratio = "none"
    """∇ log π_θ: no importance ratio"""
    trust_region: TrustRegion = "none"
    loss_agg: AggMode = "seq-mean-token-sum"
    """Σ_t log π_θ(y_t): the sequence log-probability"""
    kl_placement: KLPlacement = "none"
    kl_estimator: KLKind = "k1"
    """KL folded into R as Σ_t k1 when kl_placement=reward"""
    beta: float = 0.0


class REINFORCE(PolicyGradient):
    Config = REINFORCEConfig
    description = "REINFORCE (Williams 1992): batch-mean baseline, plain log-prob surrogate, no clip"
