"""GRPO: Group Relative Policy Optimization (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300, Eq. 3).

    J(θ) = E[ 1/G Σ_i 1/|o_i| Σ_t { min(ρ_{i,t} Â_i, clip(ρ_{i,t}, 1−ε, 1+ε) Â_i) − β D_KL[π_θ || π_ref] } ]
    Â_i  = (r_i − mean(r)) / std(r)           (outcome supervision: the same advantage for every token of o_i)
    D_KL = π_ref/π_θ − log(π_ref/π_θ) − 1      (the k3 estimator, Eq. 4)

Minimised here as ℒ_{i,t} = −[C(ρ, Â_i; ε, ε) − β·k3_{i,t}], aggregated seq-mean-token-mean.
Choices: advantage=group, adv_scale=group_std, ratio=token, trust_region=clip (ε_low = ε_high = ε),
loss_agg=seq-mean-token-mean, KL k3 in the loss. Reference: ../shared/docs/algorithms.md (GRPO, [primary]).

Deviations from the paper
# NOTE(deviation): std is the sample std (unbiased, as TRL and verl compute it) plus ε = 1e-6 in the denominator,
#   so a constant-reward group gets Â = 0 instead of 0/0; the paper does not state either.
# NOTE(deviation): conf/algorithm/grpo.yaml scales the defaults for a tiny model on CPU (G = 8, lr 1e-4);
#   the paper uses G = 64, lr 1e-6.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.rl.losses import AggMode, KLKind
from bench.rl.objective import (
    Advantage,
    AdvScale,
    KLPlacement,
    PolicyGradient,
    PolicyGradientConfig,
    Ratio,
    TrustRegion,
    advantages,
    policy_loss,
)


@dataclass
class GRPOConfig(PolicyGradientConfig):
    name: str = "grpo"
    advantage: Advantage = "group"
    adv_scale: AdvScale = "group_std"
    """Â_i = (r_i − mean(r)) / std(r)."""
    ratio: Ratio = "token"
    """ρ_{i,t} = π_θ(o_{i,t}) / π_old(o_{i,t})."""
    trust_region: TrustRegion = "clip"
    clip_eps_low: float = 0.2
    """ε in Eq. 3."""
    clip_eps_high: float = 0.2
    """ε in Eq. 3 (symmetric clip)."""
    loss_agg: AggMode = "seq-mean-token-mean"
    """1/G Σ_i 1/|o_i| Σ_t in Eq. 3."""
    kl_placement: KLPlacement = "loss"
    kl_estimator: KLKind = "k3"
    """Eq. 4."""
    beta: float = 0.04
    """β in Eq. 3."""


def grpo_advantages(rewards, group_size: int, cfg: GRPOConfig):
    """[B] -> [B]: group z-score."""
    return advantages(cfg, rewards, None, None, group_size)


def grpo_loss(logp, old_logp, adv, mask, cfg: GRPOConfig, norm, ref_logp=None):
    """Per-token clipped surrogate minus β·KL, aggregated; shapes [B, T] except adv [B]."""
    return policy_loss(logp, old_logp, adv, mask, cfg, norm, ref_logp)


class GRPO(PolicyGradient):
    Config = GRPOConfig
    description = "Group Relative Policy Optimization (Shao et al. 2024): group z-score advantage, token clip, k3 KL"
