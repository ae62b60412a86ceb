"""Single-stream PO (algorithms/spo_stream.py): its forgetting factor and sampling weights (hand values), the tracker
as a running success rate, and the KL-adaptive update on real rollouts of a real (tiny) policy."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from algorithms.spo_stream import forgetting, sampling_weights
from bench.config import compose
from bench.engine.policy import load_policy
from bench.registry import ALGORITHMS, TASKS
from tests.conftest import SMALL


def test_forgetting_and_sampling_weight_hand_values():
    """ρ = 2^(−D/0.06): D = 0.06 gives 1/2, D = 0 gives 1, clipped to the authors' [0.875, 0.96] gives 0.96 and 0.875;
    the weight √(p̂(1 − p̂)) + 0.05 peaks at 0.55 for p̂ = 1/2 and is 0.05 at 0 and 1."""
    D = torch.tensor([0.06, 0.0, 0.12])
    assert forgetting(D, 0.06, 0.0, 1.0).tolist() == pytest.approx([0.5, 1.0, 0.25])
    assert forgetting(D, 0.06, 0.875, 0.96).tolist() == pytest.approx([0.875, 0.96, 0.875])
    w = sampling_weights(torch.tensor([0.5, 0.0, 1.0, 0.1]), 0.05)
    assert w.tolist() == pytest.approx([0.55, 0.05, 0.05, 0.35])


def _module(*extra: str):
    cfg = OmegaConf.to_object(compose(["algorithm=spo_stream", *SMALL, "rollout.max_new_tokens=6",
                                       "rollout.prompts_per_step=4", "rollout.group_size=1", *extra]))  # fmt: skip
    policy, tok = load_policy(cfg.model, 0)
    task = TASKS.get(cfg.task.name)(cfg.task, tok, seed=0, prompts_per_step=cfg.rollout.prompts_per_step)
    m = ALGORITHMS.get("spo_stream")(cfg, policy, tok, task)
    m.step_stats, m.step_count = {}, 0
    return m, task


def test_with_rho_one_the_tracker_is_the_running_success_rate_and_advantages_whiten_r_minus_p():
    """ρ = 1 (constant): after s successes in n draws of a prompt p̂ = (s + 0.5)/(n + 1); the advantage is r − p̂
    whitened over the batch (with p̂ equal across the batch: whitened r)."""
    m, task = _module("algorithm.rho=constant", "algorithm.rho_value=1.0")
    ro = m.make_rollout(task.collate_prompts(task.examples("train")[:4]))
    uids = [ex.uid for ex in ro.examples]
    for r in ([1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]):
        ro.scores = ro.rewards = torch.tensor(r)
        m.update_tracker(ro)
    assert m.p_hat(uids).tolist() == pytest.approx([3.5 / 4, 1.5 / 4, 1.5 / 4, 0.5 / 4])
    fresh, _ = _module()
    ro.rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    adv = fresh.advantages(ro)  # every p̂ = 1/2
    assert adv.tolist() == pytest.approx(((ro.rewards - 0.5) / (ro.rewards - 0.5).std()).tolist(), abs=1e-6)
    adv = m.advantages(ro)
    want = ro.rewards - m.p_hat(uids).float()
    assert adv.tolist() == pytest.approx(((want - want.mean()) / (want.std() + 1e-8)).tolist(), abs=1e-6)


def test_rho_adapts_to_the_policys_drift_on_the_stored_sample():
    """First visit: D = 0, ρ = 0.96. Same policy on the second visit: D ≈ 0. After a change of weights, D is the mean
    |Δ log π| of the stored sample's tokens and ρ = clip(2^(−D/0.06), 0.875, 0.96); α, β follow ρ α + r, ρ β + 1 − r."""
    m, task = _module()
    ro = m.make_rollout(task.collate_prompts(task.examples("train")[:4]))
    ro.scores = torch.tensor([1.0, 0.0, 1.0, 0.0])
    s = m.update_tracker(ro)
    assert s["stats/spo_D_mean"] == 0.0 and s["stats/spo_rho_mean"] == pytest.approx(0.96)
    assert m.alpha[ro.examples[0].uid] == pytest.approx(0.96 * 0.5 + 1)
    s = m.update_tracker(ro)
    assert s["stats/spo_D_mean"] < 1e-5
    stored = m.stored[ro.examples[0].uid]
    with torch.no_grad():
        for p in m.policy.parameters():
            p.add_(0.02 * torch.randn_like(p))
    cur = m._logp([stored[:4]])[0].cpu()
    D0 = float(((stored[4] - cur).abs() * stored[3]).sum() / stored[3].sum())
    a0 = m.alpha[ro.examples[0].uid]
    m.update_tracker(ro)
    rho0 = min(max(2 ** (-D0 / 0.06), 0.875), 0.96)
    assert D0 > 0 and m.alpha[ro.examples[0].uid] == pytest.approx(rho0 * a0 + 1, rel=1e-5)
