"""CoPG: Contrastive Policy Gradient (Flet-Berliac et al. 2024, arXiv 2406.19185).

    ℒ(y, y') = (1/(2β))·(R^β(y) − R^β(y'))²,  R^β(y) = R(x, y) − β·ρ_θ(y)

An off-policy policy gradient in which each sample of a pair is the other's baseline (no importance weights); with a
constant reward gap it is IPO on summed log-ratios (tests/test_pref_losses.py checks the relation).
Reference: ../shared/docs/algorithms-round2.md A15 ([secondary; partly derived]).

Deviations from the paper
# NOTE(deviation): reconstructed from the abstract and a summary (the paper's equation could not be read here):
#   the constant and prefactor, and the default β (0.1 here), are unverified.
# NOTE(deviation): pairs are the selected strictly ordered pairs of the SFT start's samples (ties, which CoPG could
#   also use, are dropped as for every preference loss here).
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.pref.module import Preference, PreferenceConfig, PrefLoss


@dataclass
class CoPGConfig(PreferenceConfig):
    name: str = "copg"
    loss: PrefLoss = "copg"


class CoPG(Preference):
    Config = CoPGConfig
    description = "CoPG (Flet-Berliac et al. 2024): contrastive off-policy policy gradient on sample pairs"
