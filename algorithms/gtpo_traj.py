"""GTPO, trajectory-based (Simoni, Fontana, Rossolini, Saracino, Mori 2025, arXiv 2508.03772, "GTPO: Stabilizing GRPO
via Gradient and Entropy Control"): GRPO whose shared ("conflict") tokens are protected. Read from the authors' code
(winstonsmith1897/GTPO, ``gtpo/gtpo_training.py``: ``build_conflict_mask``, ``gtpo_compute_loss``,
``UnslothEfficientGTPO.forward``; ../shared/docs/algorithms-round3.md §5); the paper's text only in its abstract. Not
the entropy-weighted GTPO of Tan et al. (``algorithms/gtpo.py``).

    A_i = (R_i − mean_G R) / std_G R                                  (GRPO's group z-score)
    conflict at (i, t): the token y_{i,t} also stands at position t in a completion with A > 0 and one with A < 0 of
      the group; only the run from the start counts (and, right-aligned by length, the run from the end)
    δ_{i,t} = 1 off conflicts; W = 2 on a conflict of a positive completion, 0 on one of a negative completion;
      δ = δ_fwd · δ_bwd (4 on a positive token in both runs)
    H_i = mean_t H(π(· | y_<t)):  A_i ← 0 if H_i > 0.7, else A_i − 0.1 H_i                (entropy filter and shaping)
    ℒ_i = −1/|y_i| Σ_t ρ_t A_i δ_{i,t} / max(1, n_conflict_i),   no KL term

Here that is GRPO's loss on token advantages Â_{i,t} = A_i δ_{i,t} / max(1, n_conflict_i), seq-mean-token-mean.

Deviations
# NOTE(deviation): the authors' loss is on-policy REINFORCE (ρ = exp(logp − sg(logp)), no clip); here GRPO's clipped
#   ratio, the same gradient at one optimizer step per rollout (ρ = 1); it clips only with train.ppo_epochs > 1.
# NOTE(deviation): the authors sum the per-completion losses (gradient accumulation); here their mean over the batch
#   (seq-mean-token-mean): a constant factor 1/B, absorbed by the learning rate.
# NOTE(deviation): H is the entropy of π_old at the sampling temperature (the behaviour forward); the authors' is the
#   current policy's in the loss forward, the same at one optimizer step per rollout. Constants W = 2, 0.7, 0.1 and
#   the n_conflict division are the code's; the paper's values were not read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms.grpo import GRPO, GRPOConfig
from bench.rl.credit import masked_stats
from bench.rl.losses import masked_mean


@dataclass
class GTPOTrajConfig(GRPOConfig):
    name: str = "gtpo_traj"
    beta: float = 0.0
    """No KL term in the loss (the authors log one only)."""
    conflict_weight: float = 2.0
    """W: weight of a conflict token in a positive completion (W_RAW); 0 in a negative one."""
    entropy_threshold: float = 0.7
    """A completion whose mean token entropy exceeds this gets advantage 0 (ENT_THRESHOLD)."""
    entropy_scale: float = 0.1
    """A ← A − entropy_scale · H below the threshold (ENT_SCALE)."""


def leading_run(conflict: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[N, T] bool: the contiguous run of conflicts from position 0 (within the mask)."""
    return torch.cumprod((conflict & mask).int(), dim=1).bool()


def position_conflicts(ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """[N, T] bool: token (i, t) also stands at position t in a positive and in a negative row (rows of one group)."""
    same = (ids[:, None, :] == ids[None, :, :]) & mask[:, None, :] & mask[None, :, :]  # [i, j, t]
    return (same & pos[None, :, None]).any(1) & (same & neg[None, :, None]).any(1)


def conflict_weights(ids, mask, adv, group_size: int, weight: float):
    """-> (δ [B, T], n_conflict [B]) for sequence advantages ``adv`` [B]; rows of advantage 0 keep δ = 1."""
    B, T = ids.shape
    m = mask.bool()
    delta, n_conf = m.float(), torch.zeros(B, dtype=torch.long, device=ids.device)
    lengths = m.sum(1)
    # right-aligned copy: position T − 1 holds each row's last token
    shift = (torch.arange(T, device=ids.device)[None] - (T - lengths)[:, None]) % T
    ids_r, m_r = ids.gather(1, shift), m.gather(1, shift)
    for g in range(0, B, group_size):
        rows = slice(g, g + group_size)
        pos, neg = adv[rows] > 0, adv[rows] < 0
        if not (pos.any() and neg.any()):
            continue  # no conflicts without both signs
        fwd = leading_run(position_conflicts(ids[rows], m[rows], pos, neg), m[rows])
        bwd_r = leading_run(position_conflicts(ids_r[rows], m_r[rows], pos, neg).flip(1), m_r[rows].flip(1)).flip(1)
        bwd = bwd_r.gather(1, (torch.arange(T, device=ids.device)[None] + (T - lengths[rows])[:, None]) % T) & m[rows]
        w = torch.where(pos[:, None], weight, 0.0)  # what a conflict token weighs in this row
        active = (pos | neg)[:, None]
        d_f = torch.where(fwd & active, w, 1.0)
        d_b = torch.where(bwd & active, w, 1.0)
        delta[rows] = d_f * d_b * m[rows]
        n_conf[rows] = torch.where((pos | neg), ((fwd | bwd) & m[rows]).sum(1), 0)
    return delta, n_conf


class GTPOTraj(GRPO):
    Config = GTPOTrajConfig
    multi_turn = False  # its conflict weights read the completion's tokens as one turn
    needs_entropy = True
    description = "GTPO (Simoni et al. 2025): GRPO with conflict tokens protected (negatives skipped, positives x2)"

    def advantages(self, ro) -> torch.Tensor:
        a, G = self.acfg, ro.group_size
        adv = super().advantages(ro)
        assert adv.dim() == 1, "trajectory GTPO starts from a sequence advantage"
        delta, n_conf = conflict_weights(ro.completion_ids, ro.mask, adv, G, a.conflict_weight)
        H = masked_mean(ro.entropy, ro.mask, dim=1)  # [B] mean token entropy of each completion
        shaped = torch.where(H <= a.entropy_threshold, adv - a.entropy_scale * H, 0.0)
        self.step_stats.update(masked_stats(delta, ro.mask, "stats/conflict_weight"))
        self.step_stats["stats/conflict_token_frac"] = float((n_conf.sum()) / ro.mask.sum().clamp(min=1))
        self.step_stats["stats/entropy_filtered_frac"] = float((H > a.entropy_threshold).float().mean())
        return shaped[:, None] * delta / n_conf.clamp(min=1)[:, None]
