"""SimPO: Simple Preference Optimization (Meng et al. 2024, arXiv 2405.14734, Eq. 6).

    ℒ = −log σ( β·(ℓ_θ(y_w)/|y_w| − ℓ_θ(y_l)/|y_l|) − γ )          (no reference model)

Defaults of the authors' dataclass (princeton-nlp/SimPO scripts/simpo_config.py): β = 2.0, γ/β = 0.25, so the
absolute γ = 0.5 (TRL's CPOTrainer takes the absolute γ as simpo_gamma, as here). Label smoothing as in cDPO.
Reference: ../shared/docs/algorithms-round2.md A3 ([primary]).

Deviations from the paper
# NOTE(deviation): the optional SFT term of the authors' code (sft_weight, default 0) is left out.
# NOTE(deviation): pairs from the SFT start's samples and the task's reward (algorithms/dpo.py); the reference
#   model is used only to draw them, never in the loss.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.pref.module import Preference, PreferenceConfig, PrefLoss


@dataclass
class SimPOConfig(PreferenceConfig):
    name: str = "simpo"
    loss: PrefLoss = "simpo"
    beta: float = 2.0
    simpo_gamma: float = 0.5


class SimPO(Preference):
    Config = SimPOConfig
    description = "SimPO (Meng et al. 2024): reference-free, length-averaged log-probs with a margin γ"
