"""GMPO: Geometric-Mean Policy Optimization (Zhao et al. 2025, arXiv 2507.20673, Eq. 3-4).

    ℒ_i = −Â_i · exp( 1/|o_i| Σ_t Δ̃_{i,t} ),   Δ_t = log π_θ(o_t) − log π_old(o_t)
    Δ̃_t = min(Δ_t, clip(Δ_t, −c, c)) if Â > 0,   max(Δ_t, clip(Δ_t, −c, c)) if Â < 0     (a sign-aware log-space clip)

The geometric mean of the clipped token ratios replaces GRPO's arithmetic mean, so one outlier token moves the
sequence's weight far less. Mean over sequences (the loss value is the same on every token of o_i and aggregated
seq-mean-token-mean, as verl's geo_mean, which ignores loss_agg_mode). c = 0.4; no KL. Choices: advantage=group,
ratio=token (read by the trust region only for logging), trust_region=gmpo.
Reference: ../shared/docs/algorithms-round2.md (B5, [primary]: callsys/GMPO train_zero_math_gmpo.py).

Deviations from the paper
# NOTE(deviation): conf/algorithm/gmpo.yaml splits each rollout into 4 minibatches so that the clip can act; the paper
#   uses 1 PPO epoch over several minibatches too (lr 1e-6, G = 8); lr and G here are the harness's shared ones.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.rl.losses import AggMode
from bench.rl.objective import Advantage, AdvScale, KLPlacement, PolicyGradient, PolicyGradientConfig, TrustRegion


@dataclass
class GMPOConfig(PolicyGradientConfig):
    name: str = "gmpo"
    advantage: Advantage = "group"
    adv_scale: AdvScale = "group_std"
    trust_region: TrustRegion = "gmpo"
    gmpo_clip: float = 0.4
    """c: Δ clipped to [−0.4, 0.4], the ratio to [0.67, 1.49]"""
    loss_agg: AggMode = "seq-mean-token-mean"
    """the mean over sequences of a per-sequence loss"""
    kl_placement: KLPlacement = "none"
    beta: float = 0.0


class GMPO(PolicyGradient):
    Config = GMPOConfig
    description = "GMPO (Zhao et al. 2025): geometric mean of log-space-clipped token ratios per sequence"
