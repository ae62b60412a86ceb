"""M2PO: Second-Moment Trust Policy Optimization (Zheng, Zhao, Chen 2025, "Prosperity before Collapse", arXiv
2510.01161).

    Δ²_t = (log π_old(y_t) − log μ(y_t))²; mask the tokens with the largest Δ² until mean(Δ² of the rest) < τ_M2
    ℒ = 1/Σ m Σ_t −M_t·(π_θ/μ)(y_t)·Â_i          (the unclipped surrogate against the behaviour policy, token-mean)

Training on stale data needs only its extreme tokens masked: the second moment of the log importance weight is held
below τ_M2 = 0.04 instead of clipping every ratio. Group z-score advantage, no KL. Choices: is_correction=m2po (the
weight M_t·π_old/μ), ratio=token (π_θ/π_old), trust_region=none.
Reference: ../shared/docs/algorithms-round2.md (B4, [primary: code; framework: AReaL]).

Variant: AReaL's (`_apply_m2po_masking`): the mask is computed once per step over all valid tokens of the rollout,
from π_old (the learner's recomputed log-probs, AReaL's proximal policy) against μ, before the update. The authors'
code instead finds, per micro-batch, one τ over the "harmful" tokens and turns it into PPO clip bounds [e^−τ, e^τ].

Deviations from the paper
# NOTE(deviation): AReaL's variant (above), not the authors' adaptive clip; both use τ = 0.04.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.rl.losses import AggMode
from bench.rl.objective import (
    Advantage,
    AdvScale,
    ISCorrection,
    KLPlacement,
    PolicyGradient,
    PolicyGradientConfig,
    TrustRegion,
)


@dataclass
class M2POConfig(PolicyGradientConfig):
    name: str = "m2po"
    advantage: Advantage = "group"
    adv_scale: AdvScale = "group_std"
    trust_region: TrustRegion = "none"
    is_correction: ISCorrection = "m2po"
    m2_threshold: float = 0.04
    """τ_M2"""
    loss_agg: AggMode = "token-mean"
    kl_placement: KLPlacement = "none"
    beta: float = 0.0


class M2PO(PolicyGradient):
    Config = M2POConfig
    description = "M2PO (Zheng et al. 2025): mask the tokens of extreme log-weight until its second moment < 0.04"
