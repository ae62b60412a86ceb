"""Online DPO (Guo et al. 2024, "Direct language model alignment from online AI feedback", OAIF).

    Each step: sample completions of the step's prompts from the current π_θ, score them (here the task's
    verifiable reward replaces the AI judge), chosen = higher score, and take a DPO step: −log σ(β·h).

Defaults of TRL's OnlineDPOConfig: β 0.1, the sigmoid loss; the reference is the frozen SFT start.
Reference: ../shared/docs/algorithms-round2.md A9 ([framework], TRL experimental).

Deviations from the paper
# NOTE(deviation): G samples per prompt (the rollout's group size) and one random strictly ordered pair among them;
#   TRL samples exactly 2 and keeps ties.
# NOTE(deviation): no missing-EOS penalty (TRL's optional missing_eos_penalty); truncated completions score as the
#   task scores them.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.pref.module import PairSource, Preference, PreferenceConfig


@dataclass
class OnlineDPOConfig(PreferenceConfig):
    name: str = "online_dpo"
    pair_source: PairSource = "online"


class OnlineDPO(Preference):
    Config = OnlineDPOConfig
    description = "Online DPO (Guo et al. 2024): DPO on pairs sampled from the current policy each step"
