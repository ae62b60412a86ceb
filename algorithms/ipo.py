"""IPO: Identity Preference Optimisation (Azar et al. 2024, arXiv 2310.12036, Eq. 17).

    ℒ = (h̄ − 1/(2τ))²,  h̄ = ρ_θ(y_w)/|y_w| − ρ_θ(y_l)/|y_l|,  ρ = ℓ_θ − ℓ_ref

Length-normalised as TRL and HALOs compute it (TRL's comment: confirmed with the authors; the paper writes sequence
log-ratios); algorithm.ipo_length_norm=false gives the summed form of TRL's online trainers. τ = β = 0.1 (TRL).
Reference: ../shared/docs/algorithms-round2.md A2 ([framework]).

Deviations from the paper
# NOTE(deviation): the length normalisation above, which the paper does not state.
# NOTE(deviation): pairs from the SFT start's samples and the task's reward, as for DPO (algorithms/dpo.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.pref.module import Preference, PreferenceConfig, PrefLoss


@dataclass
class IPOConfig(PreferenceConfig):
    name: str = "ipo"
    loss: PrefLoss = "ipo"


class IPO(Preference):
    Config = IPOConfig
    description = "IPO (Azar et al. 2024): squared loss to the 1/(2τ) target on length-averaged log-ratios"
