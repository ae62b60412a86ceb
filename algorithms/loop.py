"""LOOP: leave-one-out PPO (Chen et al. 2025, "Reinforcement Learning for Long-Horizon Interactive LLM Agents", Apple,
arXiv 2502.01600), as in the authors' code (apple/ml-loop ``phi_agents/rl/train.py``: _compute_adv_estimates,
_filter_rollouts, _surrogate_loss, _ppo_loss). The whole episode is one sequence, the environment's tokens masked
(bench/engine/episode.py lays episodes out that way); the same form trains single-turn tasks.

    A_k = R_k − 1/(K−1) Σ_{j≠k} R_j                                            (leave-one-out; no std)
    L_k = −1/|y_k| Σ_{t ∈ policy tokens} min(ρ_t A_k, clip(ρ_t, 1 − ε_low, 1 + ε) A_k)
    loss = Σ_k L_k / (rollouts in the minibatch)                                (per-episode token mean)

Defaults (code): K = 6 rollouts a task (the harness's G is used, see below), ε = 0.1, no KL (rloo_kl_lambda 0), no
std normalisation, groups whose advantages are all below 0.01 in size dropped before the update.
Choice where the code and the paper's text may differ: ``clip_interval=symmetric`` (default: PPO's
[1 − ε, 1 + ε], the form the paper's PPO objective is written in) | ``log_symmetric`` (the code's
[1/(1 + ε), 1 + ε], symmetric in log-ratio: ε_low = ε/(1 + ε)). The paper's own ε and clip form were not read
(../shared/docs/algorithms-round4.md §3: [primary: code; paper: abstract]); the choice is logged with the run.
On one-turn episodes LOOP is this same loss on single-turn completions; with ε → ∞ it is RLOO's advantage under a
token-ratio surrogate.

Deviations from the paper
# NOTE(deviation): the |A| < 0.01 filter drops whole groups whose rewards are all equal (dynamic sampling without
#   resampling, max_sampling_rounds 1): the same rows as the code's per-rollout filter when rewards are 0/1.
# NOTE(deviation): K is rollout.group_size (shared by every algorithm in a comparison), not the code's 6; the code's
#   2 epochs per iteration, minibatch 32 and max_grad_norm 0.1 are the harness's train.* and optim.* settings.
# NOTE(deviation): the KL-spike abort (high_kl_threshold 20) is not reproduced.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from bench.rl.losses import AggMode
from bench.rl.objective import Advantage, PolicyGradient, PolicyGradientConfig, Ratio, TrustRegion


@dataclass
class LOOPConfig(PolicyGradientConfig):
    name: str = "loop"
    advantage: Advantage = "rloo"
    """A_k = R_k − mean_{j≠k} R_j"""
    ratio: Ratio = "token"
    trust_region: TrustRegion = "clip"
    clip_eps_high: float = 0.1
    """ε (the code's default)."""
    clip_eps_low: float = 0.1
    """1 − ε_low for clip_interval=symmetric (log_symmetric uses ε_high / (1 + ε_high) in its place)."""
    clip_interval: Literal["symmetric", "log_symmetric"] = "symmetric"
    """[1 − ε, 1 + ε] | the code's [1/(1 + ε), 1 + ε]."""
    loss_agg: AggMode = "seq-mean-token-mean"
    """per-episode token mean, then the mean over episodes"""
    beta: float = 0.0
    """no KL (rloo_kl_lambda 0)"""
    dynamic_sampling: bool = True
    """drop all-equal groups (|A| < 0.01) ..."""
    max_sampling_rounds: int = 1
    """... without sampling more"""


class LOOP(PolicyGradient):
    Config = LOOPConfig
    description = "LOOP (Chen et al. 2025): leave-one-out PPO, no critic, no std, per-episode token mean"

    def __init__(self, cfg, policy, tokenizer, task):
        super().__init__(cfg, policy, tokenizer, task)
        if self.acfg.clip_interval == "log_symmetric":  # the code's [1/(1+ε), 1+ε]: 1 − ε_low = 1/(1 + ε)
            self.acfg = replace(self.acfg, clip_eps_low=self.acfg.clip_eps_high / (1 + self.acfg.clip_eps_high))
