"""CISPO: Clipped IS-weight Policy Optimization (MiniMax 2025, MiniMax-M1 tech report, arXiv 2506.13585, Eq. 4-5).

    J = 1/Σ_i|o_i| Σ_i Σ_t sg(r̂_{i,t})·Â_{i,t}·log π_θ(o_{i,t}),   r̂ = clip(π_θ/π_old, 1 − ε_low^IS, 1 + ε_high^IS)

The clip bounds each token's importance weight but, unlike PPO's, never removes a token's gradient (it flows through
log π_θ). Â is the GRPO group z-score; token-mean; no KL. Choices: advantage=group, ratio=token, trust_region=cispo.
Reference: ../shared/docs/algorithms-round2.md (B1, [primary: tech report]).

Cap convention (the report gives no number): the weight is clamped to [1 − ε_low, 1 + ε_high] with ε_low = 1 (no
lower bound: the report "did not impose a lower bound") and ε_high = 4, a cap of 5 = TRL's epsilon_high 5.0 (ScaleRL)
= slime's 1 + 4; verl's example is ε_high = 0.2 (cap 1.2).

Deviations from the paper
# NOTE(deviation): ε_high = 4 is the frameworks' choice (TRL, slime); the report tunes ε_high and does not publish it.
# NOTE(deviation): conf/algorithm/cispo.yaml splits each rollout into 4 minibatches so that π_θ departs from π_old and
#   the weight's cap can act (on one minibatch per rollout r = 1 and CISPO is token-mean REINFORCE).
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.rl.losses import AggMode
from bench.rl.objective import Advantage, AdvScale, KLPlacement, PolicyGradient, PolicyGradientConfig, TrustRegion


@dataclass
class CISPOConfig(PolicyGradientConfig):
    name: str = "cispo"
    advantage: Advantage = "group"
    adv_scale: AdvScale = "group_std"
    trust_region: TrustRegion = "cispo"
    clip_eps_low: float = 1.0
    """ε_low^IS: 1, i.e. no lower bound on the weight"""
    clip_eps_high: float = 4.0
    """ε_high^IS: cap 1 + 4 = 5"""
    loss_agg: AggMode = "token-mean"
    """1/Σ_i|o_i| Σ_i Σ_t"""
    kl_placement: KLPlacement = "none"
    beta: float = 0.0


class CISPO(PolicyGradient):
    Config = CISPOConfig
    description = "CISPO (MiniMax-M1 2025): clipped, stop-gradient IS weight on log π; every token keeps its gradient"
