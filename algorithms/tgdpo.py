"""TGDPO: token-level reward guidance for DPO (Zhu et al., ICML 2025; dvlab-research/TGDPO trainer.py).

    ℒ = −log σ( Σ_t β(1 + α·r̂_t(y_w))·δ_t(y_w) − Σ_t β(1 − α·r̂_t(y_l))·δ_t(y_l) )
    r̂_t = β(log π_r(y_t) − log π_ref(y_t)),  δ_t = log π_θ(y_t) − log π_ref(y_t)

π_r is a frozen DPO-trained model: by default (algorithm.tgdpo_model=dpo) a DPO run from the same start and budget,
trained once and cached like the SFT warm start; or any HF folder (a finished run's <run dir>/final).
Defaults: β 0.1, α 0.5 (the authors' configs). Reference: ../shared/docs/algorithms-round2.md A5 ([primary]).

Deviations from the paper
# NOTE(deviation): pairs from the SFT start's samples and the task's reward (algorithms/dpo.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.pref.module import Preference, PreferenceConfig, TokenWeighting


@dataclass
class TGDPOConfig(PreferenceConfig):
    name: str = "tgdpo"
    token_weighting: TokenWeighting = "tgdpo"
    tgdpo_alpha: float = 0.5
    tgdpo_model: str | None = "dpo"


class TGDPO(Preference):
    Config = TGDPOConfig
    description = "TGDPO (Zhu et al. 2025): DPO with token weights from a DPO-trained model's token rewards"
