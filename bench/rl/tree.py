"""Rollouts grown as trees (bench.engine.tree.sample_tree) for the methods whose credit comes from the tree's shape
(TreePO, SPO-tree): a mixin that replaces the step's group sampling and keeps the tree for the advantages."""

from __future__ import annotations

from bench import dist
from bench.engine.rollout import Generation
from bench.engine.tree import Tree, sample_tree
from bench.rl.objective import ADVANTAGES


@ADVANTAGES.register("tree")
def tree_advantages(rewards, token_rewards, mask, group_size, cfg, baseline, steps):
    """Placeholder for the choice's name: the advantages read the tree a step's rollouts were grown as."""
    raise ValueError("advantage=tree reads the rollout's tree: use algorithm=treepo or algorithm=spo_tree")


class TreeRollouts:
    """Mixed into an RL module whose config has ``fanout`` (children per node at each level) and ``segment_tokens``:
    the training rollouts of a step are trees with G leaves per prompt, sampled from the behaviour policy; ``self.tree``
    holds the last one. A shared segment is generated once: the step's token count says so (``self.extra_tokens``
    takes back what the leaves' lengths count twice)."""

    tree: Tree | None = None
    advantages_beyond_the_batch = True  # from the shape of the tree the rollout was grown as

    def sample(self, batch: dict, group_size: int, temperature: float, seeds: list[int], model=None) -> Generation:
        if model is not None or temperature == 0:  # the reference's or a greedy pass: plain sampling
            return super().sample(batch, group_size, temperature, seeds, model)
        r, a = self.cfg.rollout, self.acfg
        was = self.policy.training
        self.policy.eval()
        try:
            self.tree = sample_tree(self.behaviour.model(self.policy, self.step_count), batch["prompt_ids"],
                                    batch["prompt_mask"], leaves=group_size, fanout=list(a.fanout),
                                    segment_tokens=a.segment_tokens, max_new_tokens=r.max_new_tokens, seeds=seeds,
                                    temperature=temperature, top_p=r.top_p, eos_token_id=self.tokenizer.eos_token_id,
                                    pad_token_id=self.tokenizer.pad_token_id)  # fmt: skip
        finally:
            self.policy.train(was)
        self.extra_tokens += self.tree.tokens - int(self.tree.gen.lengths.sum())
        self.step_stats["rollout/tree_tokens"] = self.tree.tokens
        self.step_stats["rollout/tree_nodes"] = len({n for path in self.tree.paths for n in path})
        return self.tree.gen

    def step_tree(self) -> Tree:
        """The step's trees, for the advantages (which read the gathered rollout): on several ranks each grew the trees
        of its own prompts, so they are gathered too (in rank order, node ids kept apart) and their counts summed.
        Called once per step, by every rank."""
        assert self.tree is not None, "no tree was grown this step"
        if dist.active():
            self.tree = gather_tree(self.tree)
            keys = ("rollout/tree_tokens", "rollout/tree_nodes")
            self.step_stats.update(dist.sum_dict({k: self.step_stats[k] for k in keys if k in self.step_stats}))
        return self.tree


def gather_tree(tree: Tree) -> Tree:
    """Every rank's tree as one, leaves in rank order (the gathered rollout's rows), each rank's node ids shifted past
    the previous ranks'. ``gen`` stays this rank's leaves: the gathered rollout holds every rank's."""
    parts = dist.gather_objects((tree.paths, tree.starts, tree.tokens))
    paths, starts, offset = [], [], 0
    for p, s, _ in parts:
        paths += [[n + offset for n in path] for path in p]
        starts += s
        offset += 1 + max((n for path in p for n in path), default=-1)
    return Tree(tree.gen, paths, starts, sum(t for *_, t in parts))
