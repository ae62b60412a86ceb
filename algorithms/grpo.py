"""GRPO: Group Relative Policy Optimization (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300, Eq. 3).

    J(θ) = E[ 1/G Σ_i 1/|o_i| Σ_t { min(ρ_{i,t} Â_i, clip(ρ_{i,t}, 1−ε, 1+ε) Â_i) − β D_KL[π_θ || π_ref] } ]
    Â_i  = (r_i − mean(r)) / std(r)           (outcome supervision: the same advantage for every token of o_i)
    D_KL = π_ref/π_θ − log(π_ref/π_θ) − 1      (the k3 estimator, Eq. 4)

Minimised here as ℒ_{i,t} = −[C(ρ, Â_i; ε, ε) − β·k3_{i,t}], aggregated seq-mean-token-mean.
Reference: ../shared/docs/algorithms.md (GRPO, [primary]).

Deviations from the paper
# NOTE(deviation): std is the sample std (unbiased, as TRL and verl compute it) plus ε = 1e-6 in the denominator,
#   so a constant-reward group gets Â = 0 instead of 0/0; the paper does not state either.
# NOTE(deviation): defaults in conf/algorithm/grpo.yaml are scaled for a tiny model on CPU (G = 8, lr 1e-4);
#   the paper uses G = 64, lr 1e-6, β = 0.04.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bench.losses import (
    AggMode,
    KLKind,
    Norm,
    agg_loss,
    clipped_surrogate,
    group_advantages,
    kl_estimate,
    masked_mean,
    token_ratio,
)
from bench.module import AlgorithmConfig, RLModule


@dataclass
class GRPOConfig(AlgorithmConfig):
    name: str = "grpo"
    clip_eps: float = 0.2
    """ε in Eq. 3 (symmetric clip)."""
    beta: float = 0.04
    """β in Eq. 3: coefficient of the KL penalty in the loss; 0 disables the reference forward pass."""
    kl_estimator: KLKind = "k3"
    """Estimator of D_KL (Eq. 4 is k3)."""
    loss_agg: AggMode = "seq-mean-token-mean"
    """1/G Σ_i 1/|o_i| Σ_t in Eq. 3."""
    adv_eps: float = 1e-6
    """ε added to std(r)."""
    adv_std_unbiased: bool = True
    """Sample (True) or population (False) std of the group rewards."""


def grpo_advantages(rewards: torch.Tensor, group_size: int, cfg: GRPOConfig) -> torch.Tensor:
    """[B] -> [B]: group z-score."""
    return group_advantages(rewards, group_size, "std", cfg.adv_eps, cfg.adv_std_unbiased)


def grpo_loss(logp, old_logp, adv, mask, cfg: GRPOConfig, norm: Norm, ref_logp=None):
    """Per-token clipped surrogate minus β·KL, aggregated; shapes [B, T] except adv [B]."""
    ratio = token_ratio(logp, old_logp, mask)  # ρ_{i,t}
    surrogate, clipped = clipped_surrogate(ratio, adv.unsqueeze(-1), cfg.clip_eps, cfg.clip_eps)
    per_token = -surrogate
    stats = {
        "stats/clip_frac": masked_mean(clipped.float(), mask).detach(),
        "stats/ratio_mean": masked_mean(ratio, mask).detach(),
    }
    if cfg.beta > 0:
        kl = kl_estimate(logp, ref_logp, cfg.kl_estimator)
        per_token = per_token + cfg.beta * kl
        stats["stats/kl"] = masked_mean(kl, mask).detach()
    loss = agg_loss(per_token, mask, cfg.loss_agg, norm)
    stats["loss/policy"] = agg_loss(-surrogate, mask, cfg.loss_agg, Norm.of(mask, norm.budget)).detach()
    return loss, stats


class GRPO(RLModule):
    Config = GRPOConfig
    description = "Group Relative Policy Optimization (Shao et al. 2024): group z-score advantage, token clip, k3 KL"

    @property
    def needs_reference(self) -> bool:
        return self.acfg.beta > 0

    def advantages(self, ro):
        return grpo_advantages(ro.rewards, ro.group_size, self.acfg)

    def loss(self, rows, logp, norm):
        return grpo_loss(logp, rows["old_logp"], rows["adv"], rows["mask"], self.acfg, norm, rows.get("ref_logp"))
