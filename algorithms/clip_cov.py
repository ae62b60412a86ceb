"""Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs", arXiv 2505.22617, §4, Eq. 11-12).

    Cov_t = (A_t − mean A)·(log π_θ(y_t) − mean log π_θ)          (means over the valid tokens)
    choose max(1, ⌊r·N⌋) tokens at random among {lb < Cov_t < ub, not clipped by PPO}; detach their loss
    elsewhere ℒ_t = −min(ρ_t A_t, clip(ρ_t, 1−ε, 1+ε) A_t)

High-covariance tokens drive entropy collapse; stopping the gradient of a few keeps entropy up. r = 2e-4, lb = 1,
ub = 5 (the authors' defaults); their scripts set clip_ratio_low = clip_ratio_high = 1 (PPO's clip effectively off:
ratios in [0, 2]). Their scripts also set a dual-clip c = 10, but their actor code never passes it to the Clip-Cov
loss (compute_policy_loss_clip_cov has no dual clip) and verl's clip_cov ignores it too, so there is none here
(clip_ratio_c = None; with c = 10 one token at A = −1, log ρ = 3 had loss 10 and gradient 0, against 20.09 and 20.09
in verl, tests/test_off_policy.py). Token-mean, group advantage, no KL. Choices: trust_region=clip_cov.
Reference: ../shared/docs/algorithms-round2.md (B7, [primary]: PRIME-RL/Entropy-Mechanism-of-RL core_algos.py).

Deviations from the paper
# NOTE(deviation): the covariance means, N and the random choice are per micro-batch, as in the authors' code and
#   verl (the loss therefore depends on train.micro_batch_size); the choice is seeded by (run seed, step, micro-batch).
# NOTE(deviation): conf/algorithm/clip_cov.yaml splits each rollout into 4 minibatches so that ratios depart from 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.rl.losses import AggMode
from bench.rl.objective import Advantage, AdvScale, KLPlacement, PolicyGradient, PolicyGradientConfig, TrustRegion


@dataclass
class ClipCovConfig(PolicyGradientConfig):
    name: str = "clip_cov"
    advantage: Advantage = "group"
    adv_scale: AdvScale = "group_std"
    trust_region: TrustRegion = "clip_cov"
    clip_eps_low: float = 1.0
    """the authors' clip_ratio_low"""
    clip_eps_high: float = 1.0
    """the authors' clip_ratio_high"""
    clip_ratio_c: float | None = None
    """no dual clip: the authors' Clip-Cov loss never applies their scripts' c = 10 (module docstring)"""
    clip_cov_ratio: float = 2e-4
    """r"""
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    loss_agg: AggMode = "token-mean"
    kl_placement: KLPlacement = "none"
    beta: float = 0.0


class ClipCov(PolicyGradient):
    Config = ClipCovConfig
    description = "Clip-Cov (Cui et al. 2025): detach a random few high-covariance tokens to keep entropy up"
