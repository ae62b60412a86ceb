"""GRPO with process supervision (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300, §4.1.3).

A process reward model scores each step; here the task's oracle does (``Task.process_rewards``: e.g. chain's 1/K
per right sub-answer), so this is GRPO's ceiling on a probe with known step rewards, not a learned-PRM method.

    R   = { r_1^{index(1)}, ..., r_1^{index(K_1)}, ..., r_G^{index(K_G)} }     (every step reward of the group)
    r̃_i^{index(j)} = (r_i^{index(j)} − mean(R)) / std(R)
    Â_{i,t} = Σ_{index(j) ≥ t} r̃_i^{index(j)}                                 (the steps from token t on)

(``algorithm.step_discount`` γ < 1 weighs step k ≥ j by γ^{k−j}: γ = 0 credits each step with its own r̃, the
oracle when the sub-problems are independent, as chain's are), and otherwise GRPO's objective (Eq. 3: token clip
ε = 0.2, k3 KL in the loss β = 0.04, seq-mean-token-mean).
Choices: reward_shaping=process, advantage=process; the rest as GRPO. Reference: ../shared/docs/algorithms.md (GRPO).

Deviations from the paper
# NOTE(deviation): the step rewards come from the task's oracle, not a learned PRM (the paper's PRM is trained on
#   Math-Shepherd); std is the sample std plus ε = 1e-6, and a group whose step rewards are all equal gets Â = 0.
# NOTE(deviation): tokens after a completion's last step get Â = 0 (the sum over no step); the paper's completions
#   end at their last step.
# NOTE(deviation): step_discount (default 1, the paper's sum) is ours; credit_horizon runs γ = 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from algorithms.grpo import GRPO, GRPOConfig
from bench.rl.objective import Advantage, RewardShaping


@dataclass
class GRPOPSConfig(GRPOConfig):
    name: str = "grpo_ps"
    reward_shaping: RewardShaping = "process"
    """The task's step rewards, each on its step's last token."""
    advantage: Advantage = "process"
    """Â_{i,t} = Σ_{index(j) ≥ t} (r_i^{index(j)} − mean R) / std R (§4.1.3)."""


class GRPOPS(GRPO):
    Config = GRPOPSConfig
    description = "GRPO with process supervision (DeepSeekMath §4.1.3) from the task's oracle step rewards"
