"""WPO: Weighted Preference Optimization (Zhou et al. 2024, arXiv 2406.11827, Eq. 2; wzhouad/WPO run_wpo.py).

    ℒ = w·(−log σ(β·h)),  w = min(1, exp(ā(y_w) + ā(y_l))),  ā(y) = (1/|y|) Σ_t [log π_θ(y_t) − log Σ_v π_θ(v)²]

w is detached: it reweights off-policy pairs by how likely the current policy is to produce them. β = 0.01 (the
authors' training configs). Reference: ../shared/docs/algorithms-round2.md A6 ([primary]).

Deviations from the paper
# NOTE(deviation): log Σ_v π_θ(v)² comes from a no-grad forward at the step's θ, before the step's one update
#   (the same value as in the loss forward, computed once).
# NOTE(deviation): pairs from the SFT start's samples and the task's reward (algorithms/dpo.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.pref.module import Preference, PreferenceConfig, TokenWeighting


@dataclass
class WPOConfig(PreferenceConfig):
    name: str = "wpo"
    token_weighting: TokenWeighting = "wpo"
    beta: float = 0.01


class WPO(Preference):
    Config = WPOConfig
    description = "WPO (Zhou et al. 2024): DPO with pairs reweighted by their likelihood under the current policy"
