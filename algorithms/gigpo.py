"""GiGPO: Group-in-Group Policy Optimization (Feng, Xue, Liu, An; NeurIPS 2025, arXiv 2505.10978, Eqs. 3, 5-8), as in
the authors' code (verl-agent ``gigpo/core_gigpo.py``: compute_step_discounted_returns, episode_norm_reward,
build_step_group, step_norm_reward). For multi-turn episodes (environment tasks, bench/engine/episode.py).

    Eq. 3  A^E(τ_i)     = (R(τ_i) − mean_j R(τ_j)) / F_norm({R(τ_j)})            over the prompt's G episodes
    Eq. 5  R_t^(i)      = Σ_{k≥t} γ^(k−t) r_k^(i)                                 discounted return from turn t
    Eq. 6  G^S(s~)      = {(a_t^(i), R_t^(i)) : s_t^(i) = s~}                     anchor state: the observation the
                                                                                 turn answered, within one group
    Eq. 7  A^S(a_t^(i)) = (R_t^(i) − mean_{G^S(s~)} R) / F_norm(G^S(s~))          0 for a one-member anchor group
    Eq. 8  A(a_t^(i))   = A^E(τ_i) + ω · A^S(a_t^(i))                            on every token of turn t's action

and verl's clipped PPO loss (token-mean) with a k3 KL loss. F_norm = std (unbiased, + ε 1e-6) or 1 (``norm``).
The first observation is every episode's anchor at turn 1, so on one-turn episodes A^S = A^E and A = (1 + ω)·A^E:
with ω = 0, GRPO with token-mean aggregation exactly (tests/test_episodes.py); with no anchor shared by two turns,
A = A^E. Reference: ../shared/docs/algorithms-round4.md §1 ([primary: code]; the paper's text beyond its equation
numbers was not read).

Choices where the code and the paper's equation differ (logged with the run's algorithm params):
``episode_stats=episodes`` (default, Eq. 3: mean and std over the G episodes) | ``turn_rows`` (the code's
compute_mean_std_cross_steps: every episode counted once per turn it took, as verl-agent's one-row-per-turn batch
does).

Deviations from the paper
# NOTE(deviation): anchors are grouped by exact observation text (the code's to_hashable), not its later
#   similarity mode (difflib ratio >= 0.95).
# NOTE(deviation): the invalid-action penalty (0.1, subtracted from the turn's score and return) is the task's
#   business here: FrozenLake counts invalid moves as a component and rewards them 0.
# NOTE(deviation): lr, G and the KL coefficient are the harness's (conf/algorithm/gigpo.yaml); the authors' ALFWorld
#   runs use lr 1e-6, N 8, KL loss 0.01 (low_var_kl = k3), entropy bonus 0.001 (not applied here).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Literal

import torch

from bench.rl.losses import AggMode, KLKind
from bench.rl.objective import KLPlacement, PolicyGradient, PolicyGradientConfig, Ratio, TrustRegion


@dataclass
class GiGPOConfig(PolicyGradientConfig):
    name: str = "gigpo"
    gamma: float = 0.95
    """γ of the turn-level discounted return (Eq. 5; verl-agent's default)."""
    step_weight: float = 1.0
    """ω in Eq. 8 (``step_advantage_w``)."""
    norm: Literal["std", "none"] = "std"
    """F_norm of Eqs. 3 and 7: std (mean_std_norm) | none (mean_norm, F = 1). The paper names both; verl-agent's
    config default is mean_norm and its scripts use either."""
    episode_stats: Literal["episodes", "turn_rows"] = "episodes"
    """Eq. 3's mean and std over the G episodes (the paper) or over their turns (the code, each episode weighted by
    its number of turns)."""
    ratio: Ratio = "token"
    trust_region: TrustRegion = "clip"
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    loss_agg: AggMode = "token-mean"
    """verl's default aggregation."""
    kl_placement: KLPlacement = "loss"
    kl_estimator: KLKind = "k3"
    """verl's low_var_kl."""
    beta: float = 0.01
    """the authors' KL loss coefficient."""

    def __post_init__(self):
        super().__post_init__()
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"algorithm.gamma is a discount in [0, 1], got {self.gamma}")


def _normalise(values: torch.Tensor, weights: torch.Tensor, norm: str, eps: float) -> torch.Tensor:
    """(v − mean) / F over one group, each value counted ``weights`` times (integers); a one-member group gives 0."""
    pool = values.repeat_interleave(weights)
    if pool.numel() < 2 or bool((values == values[0]).all()):  # all equal: exactly 0 (not rounding error / std)
        return torch.zeros_like(values)
    centred = values - pool.mean()
    return centred / (pool.std() + eps) if norm == "std" else centred


def turn_returns(step_rewards: torch.Tensor, step_ends: torch.Tensor, gamma: float) -> list[torch.Tensor]:
    """[B, T] rewards on each turn's last token -> per row the [turns] discounted returns R_t (Eq. 5)."""
    out = []
    for r, e in zip(step_rewards, step_ends, strict=True):
        rewards, run = r[e], torch.zeros((), dtype=r.dtype, device=r.device)
        ret = torch.empty_like(rewards)
        for t in range(len(rewards) - 1, -1, -1):
            run = rewards[t] + gamma * run
            ret[t] = run
        out.append(ret)
    return out


def gigpo_advantages(rewards, step_rewards, step_ends, turn_index, mask, anchors, group_size: int, cfg: GiGPOConfig):
    """Episode returns [B], turn rewards and ends [B, T], turn index [B, T], loss mask [B, T], anchors [B][turns]
    -> A [B, T] (Eq. 8) on the action tokens, 0 elsewhere."""
    B, G = rewards.shape[0], group_size
    returns = turn_returns(step_rewards, step_ends, cfg.gamma)
    turns = torch.tensor([len(r) for r in returns], device=rewards.device)
    a_e = torch.zeros_like(rewards)
    a_s = [torch.zeros_like(r) for r in returns]
    for p in range(B // G):
        rows = slice(p * G, (p + 1) * G)
        w = turns[rows] if cfg.episode_stats == "turn_rows" else torch.ones_like(turns[rows])
        a_e[rows] = _normalise(rewards[rows], w, cfg.norm, cfg.adv_eps)
        groups = defaultdict(list)  # anchor -> [(row, turn)]
        for i in range(p * G, (p + 1) * G):
            for t in range(len(returns[i])):
                groups[anchors[i][t]].append((i, t))
        for members in groups.values():
            vals = torch.stack([returns[i][t] for i, t in members])
            normed = _normalise(vals, torch.ones(len(members), dtype=torch.long, device=vals.device), cfg.norm,
                                cfg.adv_eps)  # fmt: skip
            for (i, t), v in zip(members, normed, strict=True):
                a_s[i][t] = v
    width = max(int(turns.max()), 1)
    a_s_table = torch.zeros(B, width, dtype=rewards.dtype, device=rewards.device)
    for i, v in enumerate(a_s):
        a_s_table[i, : len(v)] = v
    step = a_s_table.gather(1, turn_index.clamp(min=0, max=width - 1))  # [B, T]: each token's turn's A^S
    adv = a_e.unsqueeze(-1) + cfg.step_weight * step
    return torch.where(mask.bool(), adv, torch.zeros_like(adv))


def shared_turn_frac(anchors: list[list[str]], group_size: int) -> float:
    """Share of the turns whose anchor state another turn of the same group also acted in (a step group of 2 or
    more: the turns A^S can credit)."""
    shared = total = 0
    for p in range(0, len(anchors), group_size):
        counts = Counter(a for row in anchors[p : p + group_size] for a in row)
        shared += sum(c for c in counts.values() if c > 1)
        total += sum(counts.values())
    return shared / max(total, 1)


class GiGPO(PolicyGradient):
    Config = GiGPOConfig
    description = "GiGPO (Feng et al. 2025): episode group advantage + anchor-state step group advantage, per turn"

    def advantages(self, ro):
        if ro.turn_index is None:  # a single-turn task: each completion an episode of one turn from the prompt
            m = ro.train_mask
            last = (m * torch.arange(m.shape[1], device=m.device)).argmax(1, keepdim=True)  # [B, 1]
            ends = torch.zeros_like(m, dtype=torch.bool).scatter(1, last, True) & m.bool()
            turns = (torch.where(m.bool(), 0, -1), [[""] for _ in range(ro.size)])
            step_rewards = torch.where(ends, ro.rewards.unsqueeze(-1), torch.zeros_like(m))
        else:
            ends, turns, step_rewards = ro.step_ends, (ro.turn_index, ro.anchors), ro.step_rewards
        adv = gigpo_advantages(ro.rewards, step_rewards, ends, turns[0], ro.train_mask, turns[1], ro.group_size,
                               self.acfg)  # fmt: skip
        self.step_stats["stats/gigpo_shared_turn_frac"] = shared_turn_frac(turns[1], ro.group_size)
        return adv
