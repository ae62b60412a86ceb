"""TreePO (Li, Gu, Wen et al. 2025, arXiv 2508.17445): rollouts grown as trees of fixed-length segments, with early
stop and fallback, and advantages from the tree's global and local (subtree) groups. Read from the authors' code
(multimodal-art-projection/TreePO: ``recipe/treepo/vllm_rollout_tree.py``, ``verl/trainer/ppo/core_algos.py::
compute_tree_reinforce_plus_plus_baseline_outcome_advantage``, ``recipe/treepo/run_treepo_train.sh``;
../shared/docs/algorithms-round3.md §3); the paper's text only in its abstract.

    leaves i = 1..G of a prompt's tree (bench.engine.tree.sample_tree: segments of segment_tokens, fanout per level)
    g_0 = every leaf of the prompt,  g_d = the leaves sharing leaf i's first d segments
    a_{i,d} = R_i − mean_{j ∈ g_d} R_j       (d = 0 always; d > 0 only when |g_d| > 1)
    A_i = mean_d a_{i,d}                      ("average", the script's; "group_size": Σ_d a_{i,d} |g_d| / Σ_d |g_d|)
    Â = masked_whiten(A on every response token) over the batch;  ℒ = clip 0.2 / 0.28, dual clip 10, token-mean

Deviations
# NOTE(deviation): a fixed fan-out per level (default 2, 2, 2 for G = 8 leaves, segments of 8 tokens for this harness's
#   short completions); the authors draw the root's fan-out from [2, 8], split later nodes in 2 under a leaf budget of
#   16, with segments of 512 tokens over up to 14 levels. Their logprob-weighted division is not here.
# NOTE(deviation): early stop at EOS or the completion budget only (their boxed-answer and repetition stops are
#   task-specific); the fallback gives a finished branch's budget to a random live node of the prompt, or fresh
#   completions from the prompt when none is left (bench.engine.tree).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from algorithms.grpo import GRPO, GRPOConfig
from bench.rl.tree import TreeRollouts


@dataclass
class TreePOConfig(GRPOConfig):
    name: str = "treepo"
    advantage: str = "tree"
    fanout: list[int] = field(default_factory=lambda: [2, 2, 2])
    """Children per node at each level (TreePO's tree_fixed_step_div = 2); the last level continues to the end."""
    segment_tokens: int = 8
    """Tokens per segment (tree_max_token_per_step)."""
    adv_weight: Literal["average", "group_size"] = "average"
    """How a leaf's group terms combine (adv_weight_strategy: the script's average; the code default group_size)."""
    beta: float = 0.0


def treepo_advantages(paths: list[list[int]], rewards: list[float], G: int, weight: str = "average") -> torch.Tensor:
    """[B] A_i from the leaves' paths (node ids below the root) and rewards; rows p G .. p G + G − 1 are prompt p's."""
    out = []
    for lo in range(0, len(paths), G):
        P, R = paths[lo : lo + G], rewards[lo : lo + G]
        for i in range(G):
            terms, sizes = [], []
            for d in range(len(P[i]) + 1):  # d = 0: the root's group; d: leaves sharing the first d nodes
                group = [j for j in range(G) if P[j][:d] == P[i][:d]] if d else list(range(G))
                if d == 0 or len(group) > 1:
                    terms.append(R[i] - sum(R[j] for j in group) / len(group))
                    sizes.append(len(group))
            if weight == "average":
                out.append(sum(terms) / len(terms))
            else:
                out.append(sum(t * s for t, s in zip(terms, sizes, strict=True)) / sum(sizes))
    return torch.tensor(out)  # host: moved by the caller


def masked_whiten(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """verl's masked_whiten: (x − mean) / √(var + 1e-8) over the masked entries, unbiased variance; 0 elsewhere."""
    if m.sum() < 2:
        return torch.zeros_like(x)
    return torch.where(m, (x - x[m].mean()) * torch.rsqrt(x[m].var(unbiased=True) + 1e-8), 0.0)


class TreePO(TreeRollouts, GRPO):
    Config = TreePOConfig
    multi_turn = False  # it grows and scores its rollouts as trees of one turn
    description = "TreePO (Li et al. 2025): segment trees with early stop and fallback, global + subtree advantages"

    hf_only = "grows its rollouts as trees"

    def advantages(self, ro) -> torch.Tensor:
        tree = self.step_tree()
        assert len(tree.paths) == ro.size, "the step's rows are the last tree's leaves"
        A = treepo_advantages(tree.paths, ro.rewards.tolist(), ro.group_size, self.acfg.adv_weight)
        tok = A.to(ro.rewards)[:, None].expand_as(ro.train_mask)
        return masked_whiten(tok, ro.train_mask.bool())
