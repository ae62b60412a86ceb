"""RLOO: REINFORCE Leave-One-Out (Ahmadian et al. 2024, "Back to Basics", arXiv 2402.14740, Sec. 3.3; Kool 2019).

    R_i = r_i − β Σ_t sg[log π_old − log π_ref]_{i,t}        (sequence KL in the reward, before the baseline)
    A_i = R_i − 1/(G−1) Σ_{j≠i} R_j = G/(G−1)·(R_i − mean_g R)
    ℒ_{i,t} = −A_i · log π_θ(y_{i,t}),  summed over tokens (the sequence log-probability), mean over sequences

Choices: advantage=rloo, ratio=none, trust_region=none, loss_agg=seq-mean-token-sum, KL k1 in the reward, β = 0.03.
Reference: ../shared/docs/algorithms.md (RLOO, [framework]).

Deviations from the paper
# NOTE(deviation): the paper's k ∈ {2, 4}; conf/algorithm/rloo.yaml keeps the harness's G so RLOO shares the
#   rollout budget of the other algorithms in a comparison (set rollout.group_size=4 for the paper's setting).
# NOTE(deviation): OpenRLHF's "rloo" applies per-token KL after the baseline; this is the paper's sequence-KL form.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.rl.losses import AggMode, KLKind
from bench.rl.objective import Advantage, KLPlacement, PolicyGradient, PolicyGradientConfig, Ratio, TrustRegion


@dataclass
class RLOOConfig(PolicyGradientConfig):
    name: str = "rloo"
    advantage: Advantage = "rloo"
    """A_i = R_i − mean_{j≠i} R_j"""
    ratio: Ratio = "none"
    """REINFORCE on the sequence log-probability"""
    trust_region: TrustRegion = "none"
    loss_agg: AggMode = "seq-mean-token-sum"
    kl_placement: KLPlacement = "reward"
    """β Σ_t sg[log π_old − log π_ref] subtracted from r_i"""
    kl_estimator: KLKind = "k1"
    """log π_old − log π_ref per token"""
    beta: float = 0.03
    """β (paper default)"""


class RLOO(PolicyGradient):
    Config = RLOOConfig
    description = "RLOO (Ahmadian et al. 2024): leave-one-out baseline, sequence KL in the reward"
