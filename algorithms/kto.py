"""KTO: Kahneman-Tversky Optimization (Ethayarajh et al. 2024, arXiv 2402.01306, Eq. 7; HALOs, TRL).

    desirable y:   λ_D·(1 − σ(β(ρ_θ(y) − z_ref)))      undesirable y:   λ_U·(1 − σ(β(z_ref − ρ_θ(y))))
    z_ref = max(0, mean ρ_θ(y'|x') over mismatched prompt/completion pairs), detached

Unpaired: a sample is desirable when it scores above its group's mean, undesirable below it (rows equal to the mean
are left out). β 0.1, λ_D = λ_U = 1 (HALOs kto.yaml, TRL). Reference: ../shared/docs/algorithms-round2.md A12.

Deviations from the paper
# NOTE(deviation): the mismatched pairs shift completions by one group (G rows), so each is scored under another
#   prompt; TRL shifts by one row, which for grouped samples would mostly keep the prompt.
# NOTE(deviation): labels from the task's verifiable reward relative to the group mean, not human labels.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.pref.module import Preference, PreferenceConfig, PrefLoss


@dataclass
class KTOConfig(PreferenceConfig):
    name: str = "kto"
    loss: PrefLoss = "kto"


class KTO(Preference):
    Config = KTOConfig
    description = "KTO (Ethayarajh et al. 2024): unpaired desirable/undesirable samples against a KL reference point"
