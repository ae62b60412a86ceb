"""ReMax (Li et al. 2023, "ReMax: A Simple, Effective, and Efficient RL Method for Aligning LLMs", arXiv 2310.10505,
Algorithm 1).

    A_i = r(x, y_i) − r(x, ŷ_greedy(x))        (one extra greedy rollout per prompt is the baseline)
    ℒ_{i,t} = −A_i · log π_θ(y_{i,t}),   summed over tokens, mean over sequences

Choices: advantage=greedy_baseline (its greedy generation is counted in rollout/tokens_generated), ratio=none,
trust_region=none, loss_agg=seq-mean-token-sum, no KL. Reference: ../shared/docs/algorithms.md (ReMax, [framework]).

Deviations from the paper
# NOTE(deviation): the paper samples one completion per prompt; here G samples share the prompt's greedy baseline so
#   ReMax uses the same rollout budget as the group methods (set rollout.group_size=1 for the paper's setting).
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.rl.losses import AggMode
from bench.rl.objective import Advantage, KLPlacement, PolicyGradient, PolicyGradientConfig, Ratio, TrustRegion


@dataclass
class ReMaxConfig(PolicyGradientConfig):
    name: str = "remax"
    advantage: Advantage = "greedy_baseline"
    """b = r(x, greedy completion)"""
    ratio: Ratio = "none"
    trust_region: TrustRegion = "none"
    loss_agg: AggMode = "seq-mean-token-sum"
    kl_placement: KLPlacement = "none"
    beta: float = 0.0


class ReMax(PolicyGradient):
    Config = ReMaxConfig
    multi_turn = False  # its greedy baseline is scored as one turn's text
    description = "ReMax (Li et al. 2023): greedy-rollout baseline, plain REINFORCE surrogate"
