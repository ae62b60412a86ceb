"""REINFORCE++ (Hu 2025, arXiv 2501.03262, Sec. 3; OpenRLHF `reinforce_plus_plus`).

    r_t = 1[t = L]·clip(r, −c, c) − β·k1_t                       (KL in the per-token reward)
    A_t = Σ_{s≥t} r_s,   Â = (A − mean_batch A) / std_batch A    (return-to-go, whitened over the global batch)
    ℒ_{i,t} = −min(ρ_{i,t} Â_t, clip(ρ_{i,t}, 1−ε, 1+ε) Â_t),  token-mean

Choices: advantage=reinforce_pp, ratio=token, trust_region=clip (0.2), loss_agg=token-mean, KL k1 in the reward,
β = 0.01, reward clip ±10. Reference: ../shared/docs/algorithms.md (REINFORCE++, [primary: OpenRLHF]).

Deviations from the paper
# NOTE(deviation): the global normalisation uses token-weighted mean and population std over the optimizer step's
#   rollout (OpenRLHF whitens over the whole experience buffer, which is the same batch here).
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.rl.losses import AggMode, KLKind
from bench.rl.objective import Advantage, KLPlacement, PolicyGradient, PolicyGradientConfig, Ratio, TrustRegion


@dataclass
class REINFORCEPPConfig(PolicyGradientConfig):
    name: str = "reinforce_pp"
    advantage: Advantage = "reinforce_pp"
    """return-to-go, whitened over the batch"""
    ratio: Ratio = "token"
    trust_region: TrustRegion = "clip"
    clip_eps_low: float = 0.2
    """ε"""
    clip_eps_high: float = 0.2
    """ε"""
    loss_agg: AggMode = "token-mean"
    kl_placement: KLPlacement = "reward"
    """−β·k1_t in the token reward"""
    kl_estimator: KLKind = "k1"
    beta: float = 0.01
    """β"""
    reward_clip: float | None = 10.0
    """c: scores clipped to ±10"""


class REINFORCEPP(PolicyGradient):
    Config = REINFORCEPPConfig
    description = "REINFORCE++ (Hu 2025): per-token KL reward, return-to-go, global whitening, PPO clip"
