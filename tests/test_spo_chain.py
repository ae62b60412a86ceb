"""SPO-chain (algorithms/spo_chain.py): its segment advantages from given values (hand-computed), its cutpoints, and
its reduction to VinePPO with one step per completion on real branching rollouts of a real (tiny) policy."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from algorithms.spo_chain import cutpoints, spo_chain_advantages
from bench.config import compose
from bench.engine.policy import load_policy
from bench.registry import ALGORITHMS, TASKS
from tests.conftest import SMALL
from tests.test_vineppo import tasks  # noqa: F401  (the dropped-in tasks of known reward)


def test_segment_advantages_from_given_values_are_the_hand_computed_ones():
    """Cuts at the prompt (0), 3 and 5 with V̂ 0.5, 0.25, 1.0 and R = 1: the segments [0, 3), [3, 5), [5, 7) get
    0.25 − 0.5, 1.0 − 0.25 and R − 1.0; without a cut at the prompt the tokens before the first cut get 0 (no base);
    without any cut every token gets 0."""
    T = 7
    assert spo_chain_advantages([[0, 3, 5]], [[0.5, 0.25, 1.0]], [1.0], T).tolist() == [
        [-0.25, -0.25, -0.25, 0.75, 0.75, 0.0, 0.0]
    ]
    assert spo_chain_advantages([[3, 5]], [[0.25, 1.0]], [0.0], T).tolist() == [[0.0, 0.0, 0.0, 0.75, 0.75, -1.0, -1.0]]
    assert spo_chain_advantages([[]], [[]], [1.0], T).tolist() == [[0.0] * T]
    # every 5th low-probability position is a cut (the authors' C[::5])
    assert cutpoints([[1, 2, 4, 7, 8, 9, 12, 13, 20, 21, 22]], 5) == [[1, 9, 22]]


def _module(algorithm: str, task: str, *extra: str):
    args = [f"algorithm={algorithm}", f"task={task}", *SMALL, "rollout.max_new_tokens=6", "algorithm.beta=0", *extra]
    cfg = OmegaConf.to_object(compose(args))
    policy, tok = load_policy(cfg.model, 0)
    task_ = TASKS.get(task)(cfg.task, tok, seed=0, prompts_per_step=cfg.rollout.prompts_per_step)
    m = ALGORITHMS.get(algorithm)(cfg, policy, tok, task_)
    m.extra_samples, m.extra_tokens, m.step_stats, m.step_count = 0, 0, {}, 0
    m.branch_stats = {"rollout/branch_samples": 0, "rollout/branch_tokens": 0}
    batch = task_.collate_prompts(task_.examples("train")[:2])
    ro = m.make_rollout(batch)
    ro.scores = ro.scores.new_tensor([float(i % 3 == 0) for i in range(ro.size)])
    m.behaviour_logprobs(ro)
    return m, ro


def test_one_segment_per_completion_is_vineppo_with_one_step(tasks):  # noqa: F811
    """Every token below a threshold of 2 (so the prompt is the first cut) and a cutpoint interval longer than the
    completion: one segment from the prompt, A = R − V̂(x) on every token, as VinePPO with one step per completion,
    on the same continuations (to 1e-6)."""
    K = "algorithm.mc_rollouts=3"
    spo, ro = _module("spo_chain", "parity", K, "algorithm.prob_threshold=2.0", "algorithm.cutpoint_interval=100",
                      "algorithm.prob_mask=false")  # fmt: skip
    vine, _ = _module("vineppo", "parity", K, "algorithm.steps=every", "algorithm.step_tokens=100")
    vine.policy.load_state_dict(spo.policy.state_dict())
    a_spo, a_vine = spo.mc_advantages(ro), vine.mc_advantages(ro)
    m = ro.mask.bool()
    assert torch.allclose(a_spo[m], a_vine[m], atol=1e-6)
    per_row = a_spo.masked_fill(~m, float("nan"))  # one value per row: R − V̂(x)
    assert all(len(set(row[row == row].tolist())) == 1 for row in per_row)
    assert ro.loss_mask is None or torch.equal(ro.train_mask, ro.mask)  # no probability mask


def test_the_probability_mask_keeps_only_low_probability_tokens_in_the_loss(tasks):  # noqa: F811
    """With the mask on, the loss tokens are exactly the completion tokens with π_old below the threshold; the whitened
    advantages are zero elsewhere and have mean 0 and unbiased variance ≈ 1 over the loss tokens."""
    spo, ro = _module("spo_chain", "parity", "algorithm.mc_rollouts=2", "algorithm.cutpoint_interval=1")
    p = ro.old_logp.exp()
    spo.acfg.prob_threshold = float(p[ro.mask.bool()].median())  # the tiny model is sure of no token: half are "sure"
    adv = spo.advantages(ro)
    low = (p < spo.acfg.prob_threshold) & ro.mask.bool()
    assert 0 < int(low.sum()) < int(ro.mask.sum())  # the tiny model is unsure of some tokens, not all
    assert torch.equal(ro.train_mask.bool(), low)
    assert torch.all(adv[~low] == 0)
    if adv[low].abs().sum() > 0:
        assert float(adv[low].mean()) == pytest.approx(0.0, abs=1e-6)
        assert float(adv[low].var(unbiased=True)) == pytest.approx(1.0, rel=1e-3)
    assert spo.step_stats["rollout/spo_loss_token_frac"] == pytest.approx(float(low.sum() / ro.mask.sum()))
