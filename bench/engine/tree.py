"""Tree-structured sampling (TreePO, SPO-tree): a completion grown segment by segment, each segment branching.

A prompt's tree has G leaves. Its root carries a budget of G leaves; at level d a node with budget b is continued by
min(fanout[d], b) children of ``segment_tokens`` tokens each (``bench.engine.rollout.branch``, the node's prefix
encoded once), the budget split evenly (the remainder to the first); at the last level each node is continued to the
end by b children. A child that ends early (EOS, or the completion budget) is a leaf; the rest of its budget goes to
an unfinished node of the same prompt at the same level, chosen by the step's seeded RNG (TreePO's random fallback),
or, when none is left, to fresh completions sampled from the prompt. So every prompt has exactly G leaves, each a
whole completion, and a step's rows keep their group structure.

A node's segment is seeded by its prompt's seed and its place in that prompt's tree (the child index at each level),
so a prompt's tree does not depend on the other prompts sampled beside it (one process or several ranks: the same
trees). Node ids (``Tree.paths``) are unique over the whole batch.

Every token is generated once: a shared segment is not resampled for each leaf below it. ``Tree.tokens`` counts what
was generated (the leaves' lengths count shared segments once per leaf).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

from bench.engine.rollout import Generation, branch, generate, sample_seed


@dataclass
class Tree:
    gen: Generation  # [P G] leaves: prompt p's at rows p G .. p G + G − 1
    paths: list[list[int]]  # per leaf: the node ids from level 1 down to the leaf itself (the root, the prompt: none)
    starts: list[list[int]]  # per leaf: the token offset where each of those nodes' segment starts (0 first)
    tokens: int  # tokens generated for the whole tree (each segment once)


@dataclass
class _Node:
    p: int
    ids: list[int]
    logp: list[float]
    budget: int
    path: list[int]
    starts: list[int]
    eos: bool = False
    local: tuple[int, ...] = ()  # the child index at each level: the node's place in its own prompt's tree


@torch.no_grad()
def leaf_rows(seqs: list[list[int]], logps: list[list[float]] | None, pad: int, dtype, device) -> tuple:
    """Token lists -> right-padded (ids, mask, logp) [N, T] on ``device``, T the longest (at least 1: a root has no
    tokens yet); logp None: ids alone (mask and logp None)."""

    def rows(xs, value, dt):  # host: built from Python lists, then moved
        out = pad_sequence([torch.tensor(x, dtype=dt) for x in xs], batch_first=True, padding_value=value)
        return F.pad(out, (0, max(0, 1 - out.shape[1])), value=value).to(device)

    ids = rows(seqs, pad, dtype)
    if logps is None:
        return ids, None, None
    return ids, rows([[1.0] * len(s) for s in seqs], 0.0, torch.float32), rows(logps, 0.0, torch.float32)


def sample_tree(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    *,
    leaves: int,
    fanout: list[int],
    segment_tokens: int,
    max_new_tokens: int,
    seeds: list[int],
    **sampling,
) -> Tree:
    """G = ``leaves`` leaves per prompt grown over ``len(fanout)`` levels (see the module's docstring).
    ``sampling``: temperature, top_p, eos_token_id, pad_token_id."""
    P, eos, pad = prompt_ids.shape[0], sampling["eos_token_id"], sampling["pad_token_id"]
    rngs = [random.Random(s) for s in seeds]
    counter = iter(range(1, 1 << 62))
    frontier = [_Node(p, [], [], leaves, [], []) for p in range(P)]
    done: list[_Node] = []
    fresh = [0] * P  # leaves each prompt still needs from fresh completions
    tokens = 0
    for level, k_max in enumerate(fanout):
        last = level == len(fanout) - 1
        children: list[_Node] = []
        by_k: dict[int, list[_Node]] = {}
        for node in frontier:
            by_k.setdefault(node.budget if last else min(k_max, node.budget), []).append(node)
        for k, nodes in sorted(by_k.items()):
            comp = leaf_rows([n.ids for n in nodes], None, pad, prompt_ids.dtype, prompt_ids.device)[0]
            rows = torch.tensor([n.p for n in nodes], device=prompt_ids.device)
            gen = branch(model, prompt_ids[rows], prompt_mask[rows], comp, [len(n.ids) for n in nodes],
                         continuations=k, max_new_tokens=max_new_tokens,
                         seeds=[sample_seed(seeds[n.p], "tree", *n.local) for n in nodes],
                         segment_tokens=None if last else segment_tokens, **sampling)  # fmt: skip
            tokens += int(gen.lengths.sum())
            for i, n in enumerate(nodes):
                shares = [n.budget // k + (j < n.budget % k) for j in range(k)]
                for j in range(k):
                    r, L = i * k + j, int(gen.lengths[i * k + j])
                    ids = gen.completion_ids[r, :L].tolist()
                    child = _Node(n.p, n.ids + ids, n.logp + gen.sampler_logp[r, :L].tolist(), shares[j],
                                  [*n.path, next(counter)], [*n.starts, len(n.ids)], eos=eos in ids,
                                  local=(*n.local, j))  # fmt: skip
                    children.append(child)
        frontier = []
        for child in children:
            ended = child.eos or len(child.ids) >= max_new_tokens or last
            (done if ended else frontier).append(child)
        for child in children:  # an early leaf's surplus budget: to a live node of its prompt, else fresh samples
            if (child.eos or len(child.ids) >= max_new_tokens) and child.budget > 1 and not last:
                live = [n for n in frontier if n.p == child.p]
                if live:
                    rngs[child.p].choice(live).budget += child.budget - 1
                else:
                    fresh[child.p] += child.budget - 1
                child.budget = 1
    for p in range(P):
        if fresh[p]:
            gen = generate(model, prompt_ids[p : p + 1], prompt_mask[p : p + 1], group_size=fresh[p],
                           max_new_tokens=max_new_tokens, seeds=[sample_seed(seeds[p], "tree", "fresh")],
                           **sampling)  # fmt: skip
            tokens += int(gen.lengths.sum())
            for r in range(fresh[p]):
                L = int(gen.lengths[r])
                ids = gen.completion_ids[r, :L].tolist()
                done.append(_Node(p, ids, gen.sampler_logp[r, :L].tolist(), 1, [next(counter)], [0], eos=eos in ids))
    done.sort(key=lambda n: (n.p, n.path))
    assert [sum(n.p == p for n in done) for p in range(P)] == [leaves] * P, "every prompt has G leaves"
    ids, mask, logp = leaf_rows([n.ids for n in done], [n.logp for n in done], pad, prompt_ids.dtype,
                                prompt_ids.device)  # fmt: skip
    lengths = mask.sum(1).long()
    truncated = torch.tensor([not n.eos for n in done], device=prompt_ids.device)
    return Tree(Generation(ids, mask, logp, lengths, truncated), [n.path for n in done], [n.starts for n in done],
                tokens)  # fmt: skip
