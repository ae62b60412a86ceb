"""VinePPO (algorithms/vineppo.py): its step advantages from given values (hand-computed), and its Monte-Carlo values
from real branching rollouts of a real (tiny) policy on dropped-in tasks of known reward."""

from __future__ import annotations

import statistics

import pytest
import torch
from omegaconf import OmegaConf

from algorithms.vineppo import step_starts, vine_advantages
from bench.config import compose
from bench.engine.policy import load_policy
from bench.registry import ALGORITHMS, TASKS
from tests.conftest import SMALL

HEAD = """
from bench.task import RewardResult
from tasks.countdown import Countdown
"""
CONST = (
    HEAD
    + '''

class Const(Countdown):
    """Countdown's prompts; every completion scores 0.7."""

    def reward(self, example, completion):
        return RewardResult(score=0.7, components={"correct": 0.0})
'''
)
PARITY = (
    HEAD
    + '''

class Parity(Countdown):
    """Countdown's prompts; a completion scores 1 when its first character has an even code point."""

    def reward(self, example, completion):
        score = float(bool(completion) and ord(completion[0]) % 2 == 0)
        return RewardResult(score=score, components={"correct": score})
'''
)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    d = tmp_path_factory.mktemp("vinetasks")
    (d / "const.py").write_text(CONST)
    (d / "parity.py").write_text(PARITY)
    TASKS.include(d)
    yield
    TASKS.dirs.remove(d.resolve())
    TASKS._classes = None


def test_step_advantages_from_given_values_are_the_hand_computed_ones():
    """Steps at tokens 0-2, 3-4, 5-6 with V̂(s_0) = 0.5, V̂(s_1) = 0.25, V̂(s_2) = 1.0 and R = 1:
    A_0 = 0.25 − 0.5, A_1 = 1.0 − 0.25, A_2 = R − 1.0; they telescope to R − V̂(s_0)."""
    adv = vine_advantages([[0, 3, 5]], [[0.5, 0.25, 1.0]], [1.0], 7)
    assert adv.tolist() == [[-0.25, -0.25, -0.25, 0.75, 0.75, 0.0, 0.0]]
    one = vine_advantages([[0]], [[0.375]], [1.0], 4)  # one step: REINFORCE with an MC baseline, R − V̂(x)
    assert one.tolist() == [[0.625] * 4]
    assert step_starts([[5, 0, 3, 3, 9]], [7]) == [[0, 3, 5]]  # sorted, unique, 0 first, inside the completion


def _module(task: str, *extra: str):
    cfg = OmegaConf.to_object(compose(["algorithm=vineppo", f"task={task}", *SMALL, "rollout.max_new_tokens=4",
                                       "algorithm.steps=every", "algorithm.step_tokens=2", *extra]))  # fmt: skip
    policy, tok = load_policy(cfg.model, 0)
    task_ = TASKS.get(task)(cfg.task, tok, seed=0, prompts_per_step=cfg.rollout.prompts_per_step)
    m = ALGORITHMS.get("vineppo")(cfg, policy, tok, task_)
    m.extra_samples, m.extra_tokens, m.step_stats, m.step_count = 0, 0, {}, 0
    batch = task_.collate_prompts(task_.examples("train")[:2])
    return m, m.make_rollout(batch)


def test_a_state_whose_continuations_all_score_c_is_worth_c_and_every_step_advantage_is_0(tasks):
    m, ro = _module("const", "algorithm.mc_rollouts=3")
    starts = m._starts(ro)
    m.branch_stats = {"rollout/branch_samples": 0, "rollout/branch_tokens": 0}
    values = m.mc_values(ro, starts)
    assert all(v == pytest.approx(0.7) for row in values for v in row), values
    raw = vine_advantages(starts, values, ro.scores.tolist(), ro.completion_ids.shape[1])
    assert torch.allclose(raw, torch.zeros_like(raw), atol=1e-7)
    G = ro.group_size
    distinct = {(b // G, tuple(ro.completion_ids[b, :t].tolist())) for b, st in enumerate(starts) for t in st}
    assert m.extra_samples == 3 * len(distinct)  # every continuation counted as a sample


def test_the_mc_value_is_unbiased_with_variance_p_one_minus_p_over_k(tasks):
    """V̂(x) from K = 4 continuations, redrawn with 150 seeds (one per step): its variance is p(1 − p)/K, p the mean
    (within 3 SDs of the sample variance at 149 degrees of freedom)."""
    K = 4
    m, ro = _module("parity", f"algorithm.mc_rollouts={K}")
    m.branch_stats = {"rollout/branch_samples": 0, "rollout/branch_tokens": 0}
    draws = []
    for step in range(150):
        m.step_count = step
        draws.append(m.mc_values(ro, [[0]] * ro.size)[0][0])
    p = statistics.fmean(draws)
    assert 0.05 < p < 0.95, p  # the untrained policy answers both ways
    var = statistics.variance(draws)
    assert var == pytest.approx(p * (1 - p) / K, rel=3 * (2 / 149) ** 0.5), (var, p * (1 - p) / K)
