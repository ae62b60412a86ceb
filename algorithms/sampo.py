"""SamPO: down-sampled DPO (Lu et al. 2024, arXiv 2406.10957, Eq. 9; LuJunru/SamPO dpo_trainer.py).

    ℒ = −log σ(β·h) with each pair's longer response summed over T_m = min(|y_w|, |y_l|) of its tokens, drawn
    uniformly without replacement; the shorter keeps all of its tokens

A DPO variant that removes the length bias of summed log-ratios. β = 0.1 (the authors' dpo.sh).
Reference: ../shared/docs/algorithms-round2.md A4 ([primary]).

Deviations from the paper
# NOTE(deviation): the policy and reference sums share one draw of positions; the authors' reference pass draws its
#   own subset (bench/pref/losses.sampo_masks).
# NOTE(deviation): pairs from the SFT start's samples and the task's reward (algorithms/dpo.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.pref.module import Preference, PreferenceConfig, TokenWeighting


@dataclass
class SamPOConfig(PreferenceConfig):
    name: str = "sampo"
    token_weighting: TokenWeighting = "sampo"


class SamPO(Preference):
    Config = SamPOConfig
    description = "SamPO (Lu et al. 2024): DPO with the longer response down-sampled to the shorter's length"
