"""Trajectory GTPO (algorithms/gtpo_traj.py): conflict weights on hand-built groups, the entropy filter on a real
rollout of a real (tiny) policy, and its reduction to GRPO when no token is in conflict."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from algorithms.gtpo_traj import conflict_weights
from bench.config import compose
from bench.engine.policy import load_policy
from bench.registry import ALGORITHMS, TASKS
from bench.rl.losses import Norm
from bench.rl.objective import policy_loss
from tests.conftest import SMALL
from tests.test_critic_free import config

PAD = 0


def _ids(rows: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Letters as token ids, right-padded."""
    T = max(map(len, rows))
    ids = torch.tensor([[ord(c) for c in r] + [PAD] * (T - len(r)) for r in rows])
    return ids, (ids != PAD).float()


def test_conflict_weights_hand_cases():
    """ "ABC" (+) and "AXC" (−): the run from the start is {0}, the run from the end {2}: δ = (2, 1, 2) and (0, 1, 0),
    two conflict tokens each. Ragged "ABCD" (+) / "XCD" (−): no shared start; right-aligned the last two tokens agree:
    δ = (1, 1, 2, 2) and (1, 0, 0). A token shared by a positive and a zero-advantage row is no conflict; a run stops
    at the first position that differs ("AB?" agrees at 0 and 2 from the start, only 0 counts)."""
    ids, m = _ids(["ABC", "AXC"])
    delta, n = conflict_weights(ids, m, torch.tensor([1.0, -1.0]), 2, 2.0)
    assert delta.tolist() == [[2.0, 1.0, 2.0], [0.0, 1.0, 0.0]] and n.tolist() == [2, 2]
    ids, m = _ids(["ABCD", "XCD"])
    delta, n = conflict_weights(ids, m, torch.tensor([0.5, -0.5]), 2, 2.0)
    assert delta.tolist() == [[1.0, 1.0, 2.0, 2.0], [1.0, 0.0, 0.0, 0.0]] and n.tolist() == [2, 2]
    ids, m = _ids(["ABC", "ABC", "AYZ"])  # + , 0, −: rows 0 and 2 share "A" at 0
    delta, n = conflict_weights(ids, m, torch.tensor([1.0, 0.0, -1.0]), 3, 2.0)
    assert delta.tolist() == [[2.0, 1.0, 1.0], [1.0, 1.0, 1.0], [0.0, 1.0, 1.0]] and n.tolist() == [1, 0, 1]
    ids, m = _ids(["ABA", "AXA", "QQQ", "QQQ"])  # two groups of 2: the second has one sign only, no conflicts
    delta, n = conflict_weights(ids, m, torch.tensor([1.0, -1.0, 1.0, 1.0]), 2, 2.0)
    assert delta[2:].tolist() == [[1.0] * 3] * 2 and n.tolist() == [2, 2, 0, 0]


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), G=st.sampled_from([2, 4]), T=st.integers(1, 6))
def test_without_conflicts_the_loss_and_gradient_are_grpos(seed, G, T):
    """Positive rows draw tokens from 1..49, negative ones from 50..99 (no token can be shared): δ = 1, n_conflict = 0,
    and with the entropy filter off GTPO's token advantages give GRPO's (β = 0) loss and gradient to 1e-6."""
    g = torch.Generator().manual_seed(seed)
    P = 2
    scores = torch.randint(0, 2, (P * G,), generator=g).double()
    adv = torch.randn(P * G, generator=g, dtype=torch.float64)
    adv = torch.where(scores > 0, adv.abs() + 0.1, -adv.abs() - 0.1)
    lengths = torch.randint(1, T + 1, (P * G,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).double()
    low = torch.randint(1, 50, (P * G, T), generator=g)
    ids = torch.where(adv[:, None] > 0, low, low + 50) * mask.long()
    delta, n = conflict_weights(ids, mask, adv, G, 2.0)
    assert torch.equal(delta, mask) and int(n.sum()) == 0
    old = -torch.rand(P * G, T, generator=g, dtype=torch.float64)
    norm = Norm.of(mask, T)

    def loss_grad(name, a):
        logp = old + 0.01 * torch.randn(P * G, T, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        logp.requires_grad_()
        loss, _ = policy_loss(logp, old, a, mask, config(name, beta=0.0), norm, old)
        loss.backward()
        return loss.detach(), logp.grad

    l_g, g_g = loss_grad("grpo", adv)
    l_t, g_t = loss_grad("gtpo_traj", adv[:, None] * delta / n.clamp(min=1)[:, None])
    assert torch.allclose(l_g, l_t, atol=1e-6) and torch.allclose(g_g, g_t, atol=1e-6)


def test_entropy_filter_and_shaping_on_a_real_rollout():
    """The tiny random policy's completions have mean entropy ≈ log |V| > 0.7: every advantage is filtered to 0 at the
    authors' threshold; with the threshold above it, each row's advantage is A − 0.1 H (with δ and n_conflict)."""
    cfg = OmegaConf.to_object(compose(["algorithm=gtpo_traj", *SMALL, "rollout.max_new_tokens=6"]))
    policy, tok = load_policy(cfg.model, 0)
    task = TASKS.get(cfg.task.name)(cfg.task, tok, seed=0, prompts_per_step=cfg.rollout.prompts_per_step)
    m = ALGORITHMS.get("gtpo_traj")(cfg, policy, tok, task)
    m.step_stats, m.step_count = {}, 0
    ro = m.make_rollout(task.collate_prompts(task.examples("train")[:2]))
    ro.scores = ro.scores.new_tensor([float(i % 3 == 0) for i in range(ro.size)])
    m.behaviour_logprobs(ro)
    m.shape_rewards(ro)
    H = (ro.entropy * ro.mask).sum(1) / ro.mask.sum(1)
    assert bool((H > 0.7).all())
    assert torch.all(m.advantages(ro) == 0) and m.step_stats["stats/entropy_filtered_frac"] == 1.0
    m.acfg.entropy_threshold = 1e9
    adv = m.advantages(ro)
    seq = torch.tensor([float(i % 3 == 0) for i in range(ro.size)]).view(-1, ro.group_size)
    z = ((seq - seq.mean(1, keepdim=True)) / (seq.std(1, keepdim=True) + 1e-6)).flatten()  # GRPO's z-score
    delta, n = conflict_weights(ro.completion_ids, ro.mask, z, ro.group_size, 2.0)
    want = (z - 0.1 * H)[:, None] * delta / n.clamp(min=1)[:, None]
    assert torch.allclose(adv, want.to(adv.dtype), atol=1e-5)
