"""Tree-grown rollouts (bench/engine/tree.py) on a real (tiny) policy, and the advantages TreePO and SPO-tree read from
them: hand-computed cases, and their reductions to group baselines on a one-level tree."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from algorithms.spo_tree import spo_tree_edges, spo_tree_token_advantages
from algorithms.treepo import treepo_advantages
from bench.config import compose
from bench.engine.policy import load_policy
from bench.engine.rollout import generate, sample_seed
from bench.engine.tree import sample_tree
from bench.registry import ALGORITHMS, TASKS
from tests.conftest import SMALL


@pytest.fixture(scope="module")
def setup():
    cfg = OmegaConf.to_object(compose([*SMALL]))
    policy, tok = load_policy(cfg.model, 0)
    task = TASKS.get(cfg.task.name)(cfg.task, tok, seed=0, prompts_per_step=2)
    batch = task.collate_prompts(task.examples("train")[:2])
    kw = dict(temperature=1.0, top_p=1.0, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return policy.eval(), tok, batch, kw


def test_a_tree_has_g_leaves_per_prompt_that_share_their_common_segments(setup):
    """Fan-out 2, 2, 2 with segments of 3 tokens: 8 leaves per prompt; leaves with a common node share its tokens
    (and log-probs); every leaf is within the budget; the tree's token count is each node's segment once."""
    policy, tok, batch, kw = setup
    tree = sample_tree(policy, batch["prompt_ids"], batch["prompt_mask"], leaves=8, fanout=[2, 2, 2], segment_tokens=3,
                       max_new_tokens=12, seeds=[11, 12], **kw)  # fmt: skip
    g = tree.gen
    assert g.completion_ids.shape[0] == 16 and bool((g.lengths <= 12).all())
    spans = {}  # node -> its tokens, from every leaf below it
    for b, (path, st) in enumerate(zip(tree.paths, tree.starts, strict=True)):
        assert st[0] == 0 and st == sorted(st) and len(st) == len(path)
        for d, node in enumerate(path):
            hi = st[d + 1] if d + 1 < len(st) else int(g.lengths[b])
            span = (g.completion_ids[b, :hi].tolist(), g.sampler_logp[b, :hi].tolist())
            assert spans.setdefault(node, span) == span, "leaves below a node share its prefix"
            assert d == len(path) - 1 or hi - st[d] == 3, "inner segments are 3 tokens"
    for p in range(2):  # nodes are per prompt
        assert not {n for path in tree.paths[p * 8 : p * 8 + 8] for n in path} & {
            n for path in tree.paths[(1 - p) * 8 : (1 - p) * 8 + 8] for n in path}  # fmt: skip
    own = {}  # each node's own segment length
    for b, (path, st) in enumerate(zip(tree.paths, tree.starts, strict=True)):
        for d, node in enumerate(path):
            own[node] = (st[d + 1] if d + 1 < len(st) else int(g.lengths[b])) - st[d]
    assert tree.tokens == sum(own.values()) < int(g.lengths.sum())


def test_a_prompts_tree_does_not_depend_on_the_prompts_beside_it(setup):
    """Each prompt's tree grown alone equals its part of the two prompts' trees grown together (tokens, log-probs,
    shape): a segment's seed is its prompt's seed and its place in that prompt's tree, not a batch-wide node number
    (which made the trees of several ranks differ from one process's)."""
    policy, tok, batch, kw = setup
    args = dict(leaves=4, fanout=[2, 2], segment_tokens=3, max_new_tokens=10, **kw)
    both = sample_tree(policy, batch["prompt_ids"], batch["prompt_mask"], seeds=[7, 8], **args)
    for p, seed in enumerate([7, 8]):
        alone = sample_tree(policy, batch["prompt_ids"][p : p + 1], batch["prompt_mask"][p : p + 1], seeds=[seed],
                            **args)  # fmt: skip
        rows = slice(4 * p, 4 * p + 4)
        T = alone.gen.completion_ids.shape[1]
        assert torch.equal(both.gen.completion_ids[rows, :T], alone.gen.completion_ids)
        # the log-probs to float rounding: a batch of one prompt pads (and so sums) differently from a batch of two
        assert torch.allclose(both.gen.sampler_logp[rows, :T], alone.gen.sampler_logp, atol=1e-5)
        assert both.starts[rows] == alone.starts
        shape = lambda paths: [[sorted({q[d] for q in paths}).index(x[d]) for d in range(len(x))] for x in paths]  # noqa: E731
        assert shape(both.paths[rows]) == shape(alone.paths)


def test_a_one_level_tree_is_group_sampling(setup):
    """Fan-out [G]: the root's G children run to the end from the prompt, which is branch from the empty prefix with
    M = G, i.e. generate's group sampling from the node's seed, bit for bit."""
    policy, tok, batch, kw = setup
    tree = sample_tree(policy, batch["prompt_ids"], batch["prompt_mask"], leaves=4, fanout=[4], segment_tokens=3,
                       max_new_tokens=10, seeds=[5, 6], **kw)  # fmt: skip
    seeds = [sample_seed(s, "tree") for s in (5, 6)]
    ref = generate(policy, batch["prompt_ids"], batch["prompt_mask"], group_size=4, max_new_tokens=10, seeds=seeds,
                   share_prompt_cache=True, **kw)  # fmt: skip
    order = sorted(range(8), key=lambda i: tree.paths[i])  # leaves sorted by node id: creation order
    assert order == list(range(8))
    T = tree.gen.completion_ids.shape[1]
    assert int(ref.lengths.max()) == T and bool((ref.mask[:, T:] == 0).all())
    assert torch.equal(tree.gen.completion_ids, ref.completion_ids[:, :T])
    assert torch.equal(tree.gen.sampler_logp, ref.sampler_logp[:, :T])
    assert torch.equal(tree.gen.lengths, ref.lengths) and tree.tokens == int(ref.lengths.sum())


def test_early_leaves_give_their_budget_to_live_nodes_or_fresh_samples(setup):
    """Greedy decoding with EOS set to the token the policy emits first: every root child ends at once, so its budget
    goes to fresh completions from the prompt; each prompt still has G leaves."""
    policy, tok, batch, kw = setup
    first = generate(policy, batch["prompt_ids"], batch["prompt_mask"], group_size=1, max_new_tokens=1, seeds=[0, 0],
                     **{**kw, "temperature": 0.0}).completion_ids[:, 0]  # fmt: skip
    if first[0] != first[1]:
        pytest.skip("the two prompts' greedy first tokens differ")
    kw = {**kw, "temperature": 0.0, "eos_token_id": int(first[0])}
    tree = sample_tree(policy, batch["prompt_ids"], batch["prompt_mask"], leaves=8, fanout=[2, 2, 2], segment_tokens=3,
                       max_new_tokens=12, seeds=[1, 2], **kw)  # fmt: skip
    assert tree.gen.completion_ids.shape[0] == 16
    assert [len(p) for p in tree.paths] == [1] * 16  # two root children and six fresh samples per prompt, all depth 1
    assert bool((tree.gen.lengths == 1).all()) and not bool(tree.gen.truncated.any())


def test_treepo_advantages_hand_case_and_one_level_reduction():
    """A 2 x 2 tree with R = (1, 0, 1, 1), "average": the root mean is 0.75; leaf 1 gets mean(0.25, 0.5) = 0.375,
    leaf 2 mean(−0.75, −0.5) = −0.625, leaves 3 and 4 mean(0.25, 0) = 0.125. "group_size" weights the terms by their
    groups' sizes. One level (every leaf a child of the root): R − mean R, Dr. GRPO's advantage."""
    paths = [[1, 3], [1, 4], [2, 5], [2, 6]]
    R = [1.0, 0.0, 1.0, 1.0]
    assert treepo_advantages(paths, R, 4).tolist() == pytest.approx([0.375, -0.625, 0.125, 0.125])
    want = [(0.25 * 4 + 0.5 * 2) / 6, (-0.75 * 4 - 0.5 * 2) / 6, (0.25 * 4 + 0 * 2) / 6, (0.25 * 4 + 0 * 2) / 6]
    assert treepo_advantages(paths, R, 4, "group_size").tolist() == pytest.approx(want)
    flat = treepo_advantages([[1], [2], [3], [4], [5], [6]], [1, 0, 0, 1, 1, 1], 3)
    assert flat.tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.0])


def test_spo_tree_edge_advantages_hand_case_and_one_level_reduction():
    """Tree 2-2 with leaves (1, 0 | 1, 1): V = (0.5, 1.0), root 0.75; edges into the level-1 nodes −0.25 and +0.25,
    into the leaves +0.5, −0.5, 0, 0. Each edge enters the loss once (in the first leaf below it) and zero edges not
    at all. One level: A = R − mean R."""
    paths = [[1, 3], [1, 4], [2, 5], [2, 6]]
    R = [1.0, 0.0, 1.0, 1.0]
    assert spo_tree_edges(paths, R, 4) == pytest.approx({1: -0.25, 2: 0.25, 3: 0.5, 4: -0.5, 5: 0.0, 6: 0.0})
    adv, keep = spo_tree_token_advantages(paths, [[0, 2]] * 4, [4, 3, 4, 4], R, 4, 5)
    assert adv.tolist() == [[-0.25, -0.25, 0.5, 0.5, 0.0], [-0.25, -0.25, -0.5, 0.0, 0.0],
                            [0.25, 0.25, 0.0, 0.0, 0.0], [0.25, 0.25, 0.0, 0.0, 0.0]]  # fmt: skip
    assert keep.int().tolist() == [[1, 1, 1, 1, 0], [0, 0, 1, 0, 0], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0]]
    assert spo_tree_edges([[1], [2], [3]], [1.0, 0.0, 0.0], 3) == pytest.approx({1: 2 / 3, 2: -1 / 3, 3: -1 / 3})


@pytest.mark.parametrize("name", ["treepo", "spo_tree"])
def test_tree_methods_train_a_step_and_count_each_token_once(name):
    """A real step of each: the rows are the tree's leaves, the step's generated-token count is the tree's own (shared
    segments once), and the advantages are finite and nonzero only in the loss."""
    cfg = OmegaConf.to_object(compose([f"algorithm={name}", *SMALL, "rollout.max_new_tokens=12",
                                       "algorithm.segment_tokens=3", "algorithm.beta=0"]))  # fmt: skip
    policy, tok = load_policy(cfg.model, 0)
    task = TASKS.get(cfg.task.name)(cfg.task, tok, seed=0, prompts_per_step=cfg.rollout.prompts_per_step)
    m = ALGORITHMS.get(name)(cfg, policy, tok, task)
    m.extra_tokens, m.extra_samples, m.step_stats, m.step_count = 0, 0, {}, 0
    ro = m.make_rollout(task.collate_prompts(task.examples("train")[:2]))
    ro.scores = ro.scores.new_tensor([float(i % 3 == 0) for i in range(ro.size)])
    m.behaviour_logprobs(ro)
    m.shape_rewards(ro)
    adv = m.advantages(ro)
    assert torch.isfinite(adv).all() and bool((adv[~ro.train_mask.bool()] == 0).all())
    assert int(ro.lengths.sum()) + m.extra_tokens == m.tree.tokens
    assert ro.size == 2 * cfg.rollout.group_size


@pytest.mark.parametrize("name", ["treepo", "spo_tree"])
def test_tree_methods_refuse_the_vllm_engine_at_start_up(name):
    """They grow their rollouts as trees, which only the hf engine does: rollout.engine=vllm fails at start-up with a
    sentence naming the algorithm and the fix (VinePPO and SPO-chain branch on the engine: tests/test_vllm.py)."""
    from bench.config import ConfigError

    cfg = OmegaConf.to_object(compose([f"algorithm={name}", *SMALL, "rollout.engine=vllm"]))
    policy, tok = load_policy(cfg.model, 0)
    task = TASKS.get(cfg.task.name)(cfg.task, tok, seed=0, prompts_per_step=cfg.rollout.prompts_per_step)
    with pytest.raises(ConfigError, match=f"algorithm={name} .* use rollout.engine=hf"):
        ALGORITHMS.get(name)(cfg, policy, tok, task)
