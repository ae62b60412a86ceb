"""TEMPO: tree-structured credit from the group's shared prefixes (arXiv 2509.18314, as summarised from the authors'
code in ../shared/docs/algorithms.md).

The group's G completions form a prefix trie; a node's value V(s) is the mean raw reward of the completions that start
with prefix s. Token t of completion i moves from node s_t (its first t tokens) to s_{t+1}:

    A_{i,t} = [(r_i − μ_g) + (V(s_{t+1}) − V(s_t))] / (σ_g + ε)
    ℒ = 1/Σ_i|o_i| Σ_i Σ_t −min(ρ_{i,t} A_{i,t}, clip(ρ_{i,t}, 1−ε_low, 1+ε_high) A_{i,t})   (token-mean)

The TD term is exactly 0 wherever no sibling diverges (the two nodes hold the same completions), so branch gating is
implicit and a group without branching (identical completions, or G = 1) is GRPO/DAPO with the same clip and
aggregation. Choices: advantage=group (its base; the trie term is this file's), ratio=token, trust_region=clip
0.2 / 0.28, loss_agg=token-mean, no KL. Reference: ../shared/docs/algorithms.md (TEMPO, [primary: authors' code]).

Deviations from the paper
# NOTE(deviation): r_i is the (shaped) reward the advantage sees, and V is computed from the group-centred rewards
#   (V − μ_g: the same differences, and exactly 0 for a constant-reward group instead of a rounding error).
# NOTE(deviation): σ_g is the sample std (adv_std_unbiased, as GRPO here) and ε = adv_eps = 1e-6; the budget is the
#   shared one (G = 8; the authors' script uses G = 7).
# NOTE(deviation): ``td_coef`` (1, the paper's implicit coefficient) scales the TD term; 0 gives the plain z-score.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bench.rl.credit import prefix_values
from bench.rl.losses import AggMode, group_advantages, masked_mean
from bench.rl.objective import (
    Advantage,
    AdvScale,
    KLPlacement,
    PolicyGradient,
    PolicyGradientConfig,
    Ratio,
    TrustRegion,
)


@dataclass
class TEMPOConfig(PolicyGradientConfig):
    name: str = "tempo"
    advantage: Advantage = "group"
    adv_scale: AdvScale = "group_std"
    ratio: Ratio = "token"
    trust_region: TrustRegion = "clip"
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.28
    loss_agg: AggMode = "token-mean"
    kl_placement: KLPlacement = "none"
    beta: float = 0.0
    td_coef: float = 1.0
    """Weight of V(s_{t+1}) − V(s_t) (1 in the paper: no extra coefficient)."""

    def __post_init__(self):
        super().__post_init__()
        if self.adv_scale != "group_std":
            raise ValueError(f"tempo divides by the group std σ_g: adv_scale must be group_std, got {self.adv_scale!r}")

    def choices(self) -> dict[str, str]:
        return {**super().choices(), "td_coef": str(self.td_coef)}


def tempo_advantages(rewards, completion_ids, mask, group_size: int, cfg: TEMPOConfig):
    """-> (A [B, T], branch flags [B, T]); rewards: [B]; completion_ids, mask: [B, T]."""
    G = group_size
    centred = group_advantages(rewards, G, "none")  # [B]: r_i − μ_g, exactly 0 in a constant group
    r = rewards.view(-1, G)
    std = r.std(-1, unbiased=cfg.adv_std_unbiased) if G > 1 else torch.zeros_like(r[:, 0])  # [P]
    trie = prefix_values(completion_ids, mask, centred, G)
    td = trie.after - trie.before  # [B, T]: V(s_{t+1}) − V(s_t)
    adv = (centred.unsqueeze(-1) + cfg.td_coef * td) / (std.repeat_interleave(G).unsqueeze(-1) + cfg.adv_eps)
    return torch.where(mask.bool(), adv, torch.zeros_like(adv)), trie.branch


class TEMPO(PolicyGradient):
    Config = TEMPOConfig
    multi_turn = False  # its branch points are read from completion tokens as one turn
    description = "TEMPO (2025): group z-score plus the prefix trie's TD term per token, clip 0.2/0.28, token-mean"

    def advantages(self, ro):
        adv, branch = tempo_advantages(ro.rewards, ro.completion_ids, ro.mask, ro.group_size, self.acfg)
        self.step_stats["stats/branch_token_frac"] = float(masked_mean(branch.to(ro.mask), ro.train_mask))
        return adv
