"""SPO-tree, Segment Policy Optimization (Guo et al. 2025, arXiv 2505.23564), tree variant: the rollout grown as a tree
of fixed-length segments; each edge (a node's segment) is one training sample whose advantage is its node's value
minus its parent's. Read from the authors' code (AIFrameResearch/SPO: ``hybrid_inference_strategy.py``,
``hybrid_episode_generator.py``, ``tree_episode_generator.py::extract_edges_from_tree``; ../shared/docs/
algorithms-round3.md §2); the paper's text was not read.

    tree: segments of M tokens, fan-out per level (the last level runs to the end); leaf value V = R
    V(node) = mean over its children of V(child)        (so V(root) is the prompt's value)
    A(edge parent → child) = V(child) − V(parent)      (adv_method "rloo", the default); edges with A = 0 dropped
    loss: each edge's tokens once, with its A, only tokens with π_old < 0.9 (the probability mask, SPO's trainer);
    Â whitened over those tokens; clip 0.2, k3 KL 1e-4 (the chain config this one extends)

Here an edge is trained where it lies in the first leaf below it (the row of the lowest index); in every other leaf
below it its tokens are out of the loss, so each edge enters the loss once, as one sample of the authors' would.

Deviations
# NOTE(deviation): G leaves per prompt (default fan-out 2, 2, 2, segments of 8 tokens for this harness's short
#   completions; the authors' GSM8K tree is 6, 6, 6 with M = 30); a branch that ends early gives its leaf budget to a
#   live node of the prompt (bench.engine.tree), where the authors' tree just has fewer leaves.
# NOTE(deviation): an edge is a row's span (prompt + the path above it in context); the authors make each edge its own
#   episode with the parent's text as the query: the same log-probs, one forward per leaf instead of per edge.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from algorithms.spo_chain import SPOChain, SPOChainConfig
from bench.rl.tree import TreeRollouts


@dataclass
class SPOTreeConfig(SPOChainConfig):
    name: str = "spo_tree"
    advantage: str = "tree"
    fanout: list[int] = field(default_factory=lambda: [2, 2, 2])
    """Children per node at each level (the authors' branch factors)."""
    segment_tokens: int = 8
    """M: tokens per segment."""


def spo_tree_edges(paths: list[list[int]], rewards: list[float], G: int) -> dict[int, float]:
    """A(edge into node n) = V(n) − V(parent) for every node of every prompt's tree (V(leaf) = R, V(node) = mean of its
    children's V)."""
    out: dict[int, float] = {}
    for lo in range(0, len(paths), G):
        P, R = paths[lo : lo + G], rewards[lo : lo + G]
        children: dict[int | None, list[int]] = {}
        value: dict[int, float] = {}
        for path, r in zip(P, R, strict=True):
            for parent, node in zip([None, *path[:-1]], path, strict=True):
                kids = children.setdefault(parent, [])
                if node not in kids:
                    kids.append(node)
            value[path[-1]] = r

        for parent in reversed(list(children)):  # children first: a node is listed after its parent
            if parent is not None:
                value[parent] = sum(value[c] for c in children[parent]) / len(children[parent])
        root = sum(value[c] for c in children[None]) / len(children[None])
        for parent, kids in children.items():
            for c in kids:
                out[c] = value[c] - (root if parent is None else value[parent])
    return out


def spo_tree_token_advantages(paths, starts, lengths, rewards, G: int, T: int):
    """-> ([B, T] advantages, [B, T] bool: the tokens through which each nonzero edge enters the loss once)."""
    A = spo_tree_edges(paths, rewards, G)
    # host: filled per token, moved by the caller
    adv, keep, owner = torch.zeros(len(paths), T), torch.zeros(len(paths), T, dtype=torch.bool), {}
    for b, (path, st, n) in enumerate(zip(paths, starts, lengths, strict=True)):
        for d, node in enumerate(path):
            lo, hi = st[d], st[d + 1] if d + 1 < len(st) else n
            adv[b, lo:hi] = A[node]
            if owner.setdefault(node, b) == b and A[node] != 0:
                keep[b, lo:hi] = True
    return adv, keep


class SPOTree(TreeRollouts, SPOChain):
    Config = SPOTreeConfig
    description = "SPO-tree (Guo et al. 2025): segment trees, each edge one sample with A = V(child) − V(parent)"

    hf_only = "grows its rollouts as trees"

    def mc_advantages(self, ro) -> torch.Tensor:
        """The tree's edge advantages; the loss keeps each nonzero edge once, at its low-probability tokens."""
        t = self.step_tree()
        assert len(t.paths) == ro.size, "the step's rows are the last tree's leaves"
        adv, keep = spo_tree_token_advantages(
            t.paths, t.starts, ro.lengths.tolist(), ro.rewards.tolist(), ro.group_size, ro.completion_ids.shape[1]
        )
        keep = keep.to(ro.train_mask.device)
        if self.acfg.prob_mask:
            keep &= self.low_prob(ro)
        ro.loss_mask = ro.train_mask * keep.to(ro.train_mask.dtype)
        self.step_stats["rollout/spo_loss_token_frac"] = float(ro.train_mask.sum()) / max(float(ro.mask.sum()), 1.0)
        return adv.to(ro.rewards)
