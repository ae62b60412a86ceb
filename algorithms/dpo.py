"""DPO: Direct Preference Optimization (Rafailov et al. 2023, arXiv 2305.18290, Eq. 7).

    ℒ = −log σ(β·h),  h = [ℓ_θ(y_w) − ℓ_ref(y_w)] − [ℓ_θ(y_l) − ℓ_ref(y_l)]   (ℓ: summed completion log-probs)

With algorithm.label_smoothing = ε > 0 it is conservative DPO (cDPO: (1−ε)(−log σ(βh)) + ε(−log σ(−βh))), with
algorithm.loss=robust robust DPO, =hinge RSO's hinge, =exo_pair EXO's pair form (all in bench/pref/losses.py).
Pairs from verifiable rewards: G samples per training prompt drawn once from the SFT start (the reference) and
cached, chosen = higher score, ties dropped. Reference: ../shared/docs/algorithms-round2.md A1 ([framework], TRL).

Deviations from the paper
# NOTE(deviation): the paper trains on a fixed human-preference dataset; here the pairs come from the SFT start's
#   own samples scored by the task's verifiable reward (one random strictly ordered pair per prompt and step).
# NOTE(deviation): conf/config.yaml's lr 1e-4 for the tiny model (TRL's default 1e-6 is for billion-parameter models).
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.pref.module import Preference, PreferenceConfig


@dataclass
class DPOConfig(PreferenceConfig):
    name: str = "dpo"


class DPO(Preference):
    Config = DPOConfig
    description = (
        "Direct Preference Optimization (Rafailov et al. 2023): sigmoid loss on offline pairs from the SFT start"
    )
