"""XPO: Exploratory Preference Optimization (Xie et al. 2024, arXiv 2405.21046; TRL's XPOTrainer).

    ℒ = DPO_sigmoid(y_w, y_l) + α·ℓ_θ(ỹ),  ỹ ~ π_ref   (online pairs; minimising α·log π_θ(ỹ) is the optimism bonus)

Defaults of TRL's XPOConfig: α = 1e-5, β = 0.1. Reference: ../shared/docs/algorithms-round2.md A8 ([framework]).

Deviations from the paper
# NOTE(deviation): the pair is two samples of the current policy (as online DPO, algorithms/online_dpo.py); TRL
#   pairs a policy sample against the reference sample ỹ. Here ỹ (one per prompt, its tokens counted in
#   rollout/tokens_generated) enters only the exploration term.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.pref.module import PairSource, Preference, PreferenceConfig


@dataclass
class XPOConfig(PreferenceConfig):
    name: str = "xpo"
    pair_source: PairSource = "online"
    xpo_alpha: float = 1e-05


class XPO(Preference):
    Config = XPOConfig
    description = "XPO (Xie et al. 2024): online DPO plus an exploration term on reference samples"
