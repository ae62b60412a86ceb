"""SPO-chain, Segment Policy Optimization (Guo et al. 2025, arXiv 2505.23564), chain variant: VinePPO's Monte-Carlo
credit with segments cut where the policy was unsure. Read from the authors' code (AIFrameResearch/SPO,
``math_episode_generator_with_mc_advantages.py``: the cutpoints in ``_generate_episodes``,
``_compute_token_advantages``; ``trainers/ppo_trainer.py``: ``use_prob_mask``; ../shared/docs/algorithms-round3.md
§2); the paper's text was not read.

    p_t = π_old(y_t | x, y_<t);   cutpoints C = { t : p_t < 0.9 }[::5]  (every 5th low-probability token)
    states s_c = x + y_<c for c in C (c = 0 is the prompt),   V̂(s_c) = 1/K Σ_k R(x, s_c + η_k)   (K = 9)
    Â_t = V̂(s_{c_k}) − V̂(s_{c_{k−1}})  for c_{k−1} ≤ t < c_k;   R − V̂(s_{c_last}) after the last cut;
    Â_t = 0 before the first cut when it is not the prompt (no base), and everywhere when there is no cut
    the loss, its whitening and its token mean only over tokens with p_t < 0.9 (the probability mask)
    ℒ = PPO clip 0.2 + β k3, β = 1e-4, no critic (VinePPO's trainer, which the authors' code forks)

A segment's advantage lands on its first token (the low-probability "decision" that opened it) and on the other
low-probability tokens inside it; the tokens the policy was sure of are masked.

Deviations
# NOTE(deviation): the cutpoints come from log π_old as the learner recomputes it at the sampling temperature
#   (rollout.temperature); the authors' ``get_episodes_w_actor_logps`` scores the sampled tokens at temperature 1.
# NOTE(deviation): VinePPO's: a continuation that reaches the budget is scored like any completion; one PPO epoch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms.vineppo import VinePPO, VinePPOConfig, vine_advantages
from bench.engine.rollout import Rollout


@dataclass
class SPOChainConfig(VinePPOConfig):
    name: str = "spo_chain"
    prob_threshold: float = 0.9
    """A token with π_old probability below this opens a segment (hard-coded 0.9 in the authors' code)."""
    cutpoint_interval: int = 5
    """Keep every n-th low-probability token as a cutpoint (episode_generators/interval5.jsonnet)."""
    prob_mask: bool = True
    """Only tokens below prob_threshold enter the loss (use_prob_mask, the authors' default)."""
    max_value_steps: int = 1_000_000
    """The authors' chain estimates every cutpoint."""


def cutpoints(low: list[list[int]], interval: int) -> list[list[int]]:
    """Per row, every ``interval``-th low-probability position (a prefix length: the state before that token)."""
    return [row[::interval] for row in low]


def spo_chain_advantages(cuts: list[list[int]], values: list[list[float]], rewards: list[float], T: int):
    """[B, T] segment advantages from the cut states' values; VinePPO's step advantages once the tokens before a first
    cut that is not the prompt are given the first cut's own value (so they get 0), and a row without cuts is one step
    worth its reward (0 everywhere)."""
    starts, vals = [], []
    for c, v, R in zip(cuts, values, rewards, strict=True):
        if not c:
            starts.append([0]), vals.append([R])
        elif c[0] > 0:
            starts.append([0, *c]), vals.append([v[0], *v])
        else:
            starts.append(list(c)), vals.append(list(v))
    return vine_advantages(starts, vals, rewards, T)


class SPOChain(VinePPO):
    Config = SPOChainConfig
    description = "SPO-chain (Guo et al. 2025): MC segment values at low-probability cutpoints, probability-masked PPO"

    @property
    def reads_old_logp_before_update(self) -> bool:
        return True  # the cutpoints are read from log π_old

    def low_prob(self, ro: Rollout) -> torch.Tensor:
        """[B, T] bool: completion tokens whose π_old probability is below the threshold."""
        return (ro.old_logp.exp() < self.acfg.prob_threshold) & ro.mask.bool()

    def mc_advantages(self, ro: Rollout) -> torch.Tensor:
        low = self.low_prob(ro)
        cuts = cutpoints([row.nonzero().flatten().tolist() for row in low.cpu()], self.acfg.cutpoint_interval)
        values = self.mc_values(ro, cuts)
        if self.acfg.prob_mask:  # the loss (and its token-mean denominator) only at the low-probability tokens
            ro.loss_mask = ro.train_mask * low.to(ro.train_mask.dtype)
        self.step_stats["rollout/spo_cutpoints"] = sum(map(len, cuts)) / max(len(cuts), 1)
        self.step_stats["rollout/spo_loss_token_frac"] = float(ro.train_mask.sum()) / max(float(ro.mask.sum()), 1.0)
        return spo_chain_advantages(cuts, values, ro.scores.tolist(), ro.completion_ids.shape[1]).to(ro.scores.device)

    def whiten(self, adv: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        """The authors' masked_whiten: over the loss tokens, unbiased variance, (A − mean) / √(var + 1e-8)."""
        return torch.where(m, (adv - adv[m].mean()) * torch.rsqrt(adv[m].var(unbiased=True) + 1e-8), 0.0)
