"""KL-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs", arXiv 2505.22617, §4, Eq. 13).

    Cov_t = (A_t − mean A)·(sg log π_θ(y_t) − mean sg log π_θ)
    ℒ_t = −ρ_t A_t + λ·|log π_θ(y_t) − log π_old(y_t)|   for the top k = max(1, ⌊r·N⌋) tokens by Cov_t
    ℒ_t = −ρ_t A_t                                        otherwise (the unclipped surrogate)

λ = 1; r = 0.002 (the authors' 7B k_percent 0.2, a percent; verl's kl_cov_ratio 2e-4 is their 32B value). Token-mean,
group advantage, no KL to a reference. Choices: trust_region=kl_cov.
Reference: ../shared/docs/algorithms-round2.md (B7, [primary]: PRIME-RL/Entropy-Mechanism-of-RL core_algos.py).

Deviations from the paper
# NOTE(deviation): Cov_t's means and k are per micro-batch, as in the authors' code and verl.
# NOTE(deviation): conf/algorithm/kl_cov.yaml splits each rollout into 4 minibatches so that the penalty is not 0
#   (it is |log π_θ − log π_old|, 0 on the first minibatch).
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.rl.losses import AggMode
from bench.rl.objective import Advantage, AdvScale, KLPlacement, PolicyGradient, PolicyGradientConfig, TrustRegion


@dataclass
class KLCovConfig(PolicyGradientConfig):
    name: str = "kl_cov"
    advantage: Advantage = "group"
    adv_scale: AdvScale = "group_std"
    trust_region: TrustRegion = "kl_cov"
    kl_cov_ratio: float = 2e-3
    """r = k_percent / 100 (7B setting)"""
    kl_cov_coef: float = 1.0
    """λ"""
    loss_agg: AggMode = "token-mean"
    kl_placement: KLPlacement = "none"
    beta: float = 0.0


class KLCov(PolicyGradient):
    Config = KLCovConfig
    description = "KL-Cov (Cui et al. 2025): |log-ratio| penalty on the top-covariance tokens, unclipped surrogate"
