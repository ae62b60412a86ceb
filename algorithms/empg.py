"""EMPG: Entropy-Modulated Policy Gradients (Wang, Liu, Fu, Li, Wang, Lin, Yue, Zhang, Wang, Wang; ByteDance Seed,
2025, arXiv 2509.09265), as in the authors' pseudocode on the project page (empgseed-seed.github.io,
``compute_empg_advantage``), on GRPO's episode advantage. For multi-turn episodes: a step is a turn.

    H_{i,t}  = mean token entropy of π_old over step t's tokens                  (detached, rollout-time)
    Eq. 12   Ĥ = (H − min H) / (max H − min H + 1e-8)                            over every step of the batch
    Eq. 10   g(Ĥ) = exp(−k Ĥ) / (mean exp(−k Ĥ) + 1e-8)                          (mean over the batch's steps)
    Eq. 11   f(Ĥ) = exp(−k_f Ĥ)
    Eq. 8    A_mod(i, t) = g(Ĥ_{i,t}) · A(τ_i) + ζ · f(Ĥ_{i,t+1})                 (no bonus on an episode's last step)
    Eq. 7    A(i, t) = A_mod(i, t) − mean over the batch's steps of A_mod           (zero mean; no std)

A(τ_i) is GRPO's group z-score of the episode's return; A(i, t) is given to every token of step t, and the loss is
GRPO's (token clip 0.2, k3 KL β 0.04, seq-mean-token-mean). Defaults from the pseudocode: k = 1, k_f = 1, ζ = 0.1.
A confident step (low Ĥ) gets its outcome credit amplified, an uncertain one attenuated; the bonus rewards a step
whose next step is confident, whatever the sign of A (it can flip a small negative advantage). On a single-turn task
each completion is one step: no bonus, g = 1 after the batch mean when all entropies are equal.
Reference: ../shared/docs/algorithms-round4.md §5 ([primary: project-page pseudocode]; Eqs. 10-12 read there again
this round, the pseudocode's last part, Eqs. 8 and 7, through the round-4 notes).

Deviations from the paper
# NOTE(deviation): Eq. 7's centring after the bonus follows a third-party copy of the pseudocode's last part
#   [secondary]; the steps are the harness's turns (Rollout.turn_index), not Qwen chat-marker segments.
# NOTE(deviation): the base advantage is GRPO's; the paper also runs EMPG on DAPO.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms.grpo import GRPO, GRPOConfig
from bench.rl import segment as S
from bench.rl.objective import advantages as group_advantages


@dataclass
class EMPGConfig(GRPOConfig):
    name: str = "empg"
    k: float = 1.0
    """k of the self-calibrating scale g (Eq. 10)."""
    k_f: float = 1.0
    """k_f of the future-clarity bonus f (Eq. 11)."""
    zeta: float = 0.1
    """ζ: the bonus's weight (Eq. 8)."""


def empg_advantages(episode_adv, entropy, index, cfg: EMPGConfig):
    """Episode advantages [B], π_old's token entropies [B, T], step index [B, T] (−1 off the policy's tokens)
    -> the per-token advantage [B, T] (Eqs. 7-12), 0 off the policy's tokens."""
    H = S.macro_reduce(entropy.detach(), index, "equal")  # [B, K]: each step's mean token entropy
    present = S.macro_mask(index).bool()  # [B, K]
    h = H[present]
    H_norm = (H - h.min()) / (h.max() - h.min() + 1e-8)
    scale = torch.exp(-cfg.k * H_norm)
    g = scale / (scale[present].mean() + 1e-8)
    f = torch.exp(-cfg.k_f * H_norm)
    has_next = torch.zeros_like(present)
    has_next[:, :-1] = present[:, 1:]
    bonus = torch.zeros_like(f)
    bonus[:, :-1] = f[:, 1:]
    mod = g * episode_adv.unsqueeze(-1) + cfg.zeta * torch.where(has_next, bonus, torch.zeros_like(bonus))
    final = torch.where(present, mod - mod[present].mean(), torch.zeros_like(mod))
    return S.macro_expand(final, index)


class EMPG(GRPO):
    Config = EMPGConfig
    multi_turn = True
    needs_entropy = True
    description = "EMPG (Wang et al. 2025): GRPO's episode advantage scaled by each step's confidence, + clarity bonus"

    def advantages(self, ro):
        m = ro.train_mask.bool()
        turns = ro.turn_index if ro.turn_index is not None else torch.zeros_like(m, dtype=torch.long)
        index = torch.where(m, turns, torch.full_like(turns, -1))
        episode = group_advantages(self.acfg, ro.rewards, ro.token_rewards, ro.train_mask, ro.group_size)
        return empg_advantages(episode, ro.entropy, index, self.acfg)
