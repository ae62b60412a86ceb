"""REINFORCE++-baseline (Hu 2025, arXiv 2501.03262; OpenRLHF `reinforce_plus_plus_baseline`).

    A_i = r_i − mean_g r                     (group-mean baseline of the scalar reward)
    Â = (A − mean_batch A) / std_batch A      (then the same global normalisation as REINFORCE++, token-weighted)
    ℒ_{i,t} = −min(ρ Â, clip(ρ, 1−ε, 1+ε) Â) + β·k2_{i,t},  token-mean

Choices: advantage=reinforce_pp_baseline, ratio=token, clip 0.2, token-mean, KL k2 in the loss, β = 1e-5 (the
author's default for this variant; G = 8). Reference: ../shared/docs/algorithms.md (REINFORCE++, [primary]).

Deviations from the paper
# NOTE(deviation): none beyond REINFORCE++'s batch-scope note.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.rl.losses import AggMode, KLKind
from bench.rl.objective import Advantage, KLPlacement, PolicyGradient, PolicyGradientConfig, Ratio, TrustRegion


@dataclass
class REINFORCEPPBaselineConfig(PolicyGradientConfig):
    name: str = "reinforce_pp_baseline"
    advantage: Advantage = "reinforce_pp_baseline"
    ratio: Ratio = "token"
    trust_region: TrustRegion = "clip"
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    loss_agg: AggMode = "token-mean"
    kl_placement: KLPlacement = "loss"
    kl_estimator: KLKind = "k2"
    beta: float = 1e-5
    """KL coefficient (author default)"""


class REINFORCEPPBaseline(PolicyGradient):
    Config = REINFORCEPPBaselineConfig
    description = "REINFORCE++-baseline (Hu 2025): group-mean baseline, then global whitening; k2 KL in loss"
