"""A-LoL: Advantage-Leftover Lunch RL (Baheti et al., ICLR 2024, arXiv 2305.14718, Eq. 4; abaheti95/LoL-RL).

    ℒ = clip(π_θ(y)/π_ref(y), 1−ε, 1+ε)·A·(−ℓ_θ(y)),  A = max(0, R(x, y) − V_ref(x)),  weight detached, ε = 0.9

The whole completion is one action; only positive-advantage samples train. Variants (algorithm.alol_variant):
ref_free (weight 1), seq (per-token clipped weights), kl (weight 1 plus alol_kl_beta·(ℓ_θ − ℓ_ref)).
Reference: ../shared/docs/algorithms-round2.md A14 ([primary]).

Deviations from the paper
# NOTE(deviation): V_ref(x) is the mean reward of the reference's own G samples of the prompt (a Monte-Carlo value
#   of π_ref, exact in expectation) instead of the paper's attention value head trained on validation prompts.
# NOTE(deviation): every positive-advantage sample of the step trains once (no A-proportional priority sampling).
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.pref.module import ALolVariant, Preference, PreferenceConfig, PrefLoss


@dataclass
class ALoLConfig(PreferenceConfig):
    name: str = "a_lol"
    loss: PrefLoss = "a_lol"
    alol_variant: ALolVariant = "a_lol"
    alol_clip: float = 0.9


class ALoL(Preference):
    Config = ALoLConfig
    description = "A-LoL (Baheti et al. 2024): offline sequence-level advantage-weighted policy gradient"
