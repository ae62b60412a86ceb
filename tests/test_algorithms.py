"""Contract over the algorithm registry: every algorithm trains on the tiny model and logs its choices."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient
from transformers import AutoModelForCausalLM

from bench.config import compose
from bench.registry import ALGORITHMS, TASKS
from bench.rl.objective import CHOICES, PolicyGradientConfig
from bench.run.train import train
from bench.task import Task, environment_names
from tests.conftest import data_root

RL = [n for n in ALGORITHMS.names() if issubclass(ALGORITHMS.get(n).Config, PolicyGradientConfig)]


def test_every_critic_free_algorithm_is_registered():
    expected = {
        "reinforce",
        "rloo",
        "reinforce_pp",
        "reinforce_pp_baseline",
        "remax",
        "grpo",
        "dr_grpo",
        "dapo",
        "gspo",
        "gspo_token",
        "sapo",
        "gpg",
        "gtpo",
        "grpo_s",
        "tempo",
        "ts_grpo",
    }
    assert expected <= set(RL), sorted(expected - set(RL))


# Diagnostics an algorithm logs beyond the family's (read back from MLflow after the 2-step run).
DIAGNOSTICS = {
    "gtpo": ("stats/entropy_weight_mean", "stats/entropy_weight_std", "stats/entropy_weight_max"),
    "grpo_s": ("stats/entropy_weight_mean", "stats/entropy_weight_std", "stats/token_entropy_mean"),
    "tempo": ("stats/branch_token_frac",),
    "ts_grpo": ("stats/answer_token_frac", "loss/answer", "loss/planning"),
    "ppo": ("stats/value_loss", "stats/value_mean", "stats/value_clip_frac", "stats/value_grad_norm"),
    "ma_ppo": ("stats/value_loss", "stats/value_mean", "stats/value_clip_frac", "stats/macro_len_mean"),
    "m2po": ("rollout/is_weight_mean", "rollout/is_zeroed_frac", "rollout/mismatch_kl", "rollout/mismatch_logp_max"),
}

# Methods that sample extra continuations to estimate credit run here with fewer of them (the same code path).
CHEAPER = {
    "vineppo": ["algorithm.mc_rollouts=2", "algorithm.steps=every", "algorithm.step_tokens=16"],
    "spo_chain": ["algorithm.mc_rollouts=2", "algorithm.cutpoint_interval=16"],
}

# Surrogates that differ from GRPO in the loss alone (same rollout, rewards and advantage code): the fast contract
# test trains each; the every-task test leaves them out, as the task changes nothing their losses read.
LOSS_ONLY = {"cispo", "gmpo", "clip_cov", "kl_cov", "lite_ppo", "minirl", "m2po"}


# The default tiny model after 300 SFT steps solves a few percent of Countdown when sampling, so 8 groups of 8 have
# reward variance and every algorithm gets a non-zero gradient. The warm start is trained once and cached.
CONTRACT = [
    "init=sft",
    "warm_start.max_steps=300",
    "rollout.prompts_per_step=8",
    "rollout.group_size=8",
    "rollout.max_new_tokens=32",
    "task.num_eval=8",
    "trainer.max_steps=2",
    "trainer.eval_every=100",
    "trainer.progress_bar=false",
    "train.minibatch_size=null",
]


# Countdown's default warm start learns from half-wrong demonstrations (task.demo_error_rate 0.5, the headroom
# setting; make run and the default sweep train it); the contract tests keep the all-right ones they were sized on.
ALL_RIGHT = ["task.demo_error_rate=0.0"]

GENERATED = {"countdown", "chain", "delay", "frozen_lake", "sokoban"}  # tasks that need no data root
ENVIRONMENTS = set(environment_names())  # multi-turn tasks
# The methods that run on episodes, one of each way of reading them: episode z-score, resampled groups (dynamic
# sampling), sequence ratio, return-to-go over the policy's tokens, step rewards, and the turn-level methods.
ON_EPISODES = {"grpo", "dapo", "gspo", "reinforce_pp", "grpo_ps", "gigpo", "loop", "turn_ppo", "empg"}


def has_step_rewards(task: str) -> bool:
    """The task's oracle step rewards, or an environment's turn rewards."""
    return TASKS.get(task).process_rewards is not Task.process_rewards or task in ENVIRONMENTS


def needs_step_rewards(name: str) -> bool:
    return ALGORITHMS.get(name).Config().reward_shaping == "process"


@pytest.mark.parametrize("name", RL)
def test_algorithm_trains_two_steps_and_logs_its_choices(name, store):
    """Each algorithm trains 2 steps on the tiny model and Countdown (chain for those that need the task's step
    rewards): finite loss, parameters changed, and its MLflow run carries every choice as a param and a choice.* tag."""
    task = "chain" if needs_step_rewards(name) else "countdown"
    right = ALL_RIGHT if task == "countdown" else []
    result = train(compose([f"algorithm={name}", f"task={task}", *CONTRACT, *right, *CHEAPER.get(name, []),
                            *store["args"]]))  # fmt: skip
    client = MlflowClient(tracking_uri=store["uri"])
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED", run.info.status
    losses = [m.value for m in client.get_metric_history(result.run_id, "loss/total")]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses))), losses
    for choice in CHOICES:
        assert f"algorithm.{choice}" in run.data.params, (choice, sorted(run.data.params))
        assert run.data.tags[f"choice.{choice}"] == run.data.params[f"algorithm.{choice}"], choice
    for choice in ALGORITHMS.get(name).Config().choices():  # the family's and the algorithm's own
        assert f"choice.{choice}" in run.data.tags, (choice, sorted(run.data.tags))
    for key in DIAGNOSTICS.get(name, ()):
        history = client.get_metric_history(result.run_id, key)
        assert len(history) == 2 and all(map(math.isfinite, (m.value for m in history))), (name, key, history)
    assert moved_from_warm_start(store, task, result) > 0, f"{name}: no parameter changed after 2 steps"


def moved_from_warm_start(store, task: str, result) -> float:
    """The largest parameter change of a finished run from the SFT warm start it started from (its warm_start.path tag;
    the session store may hold more than one warm start for a task, e.g. one with a different SFT length)."""
    run = MlflowClient(tracking_uri=store["uri"]).get_run(result.run_id)
    init_dir = Path(run.data.tags["warm_start.path"])
    assert init_dir.is_dir() and init_dir.name.startswith(f"{task}-"), init_dir
    init = AutoModelForCausalLM.from_pretrained(init_dir)
    trained = AutoModelForCausalLM.from_pretrained(result.run_dir / "final")
    return max((a - b).abs().max().item() for a, b in zip(init.parameters(), trained.parameters(), strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS.names())
@pytest.mark.parametrize("name", RL)
def test_every_algorithm_trains_on_every_task(name, task, store):
    """Each critic-free algorithm trains 2 steps on each task with the tiny model (finite loss, FINISHED run).
    From random init most rewards are 0: dynamic sampling (DAPO) then finds no informative group and skips the
    update, which it records as rollout/trained_samples = 0 instead of a loss."""
    if name in LOSS_ONLY:
        pytest.skip(f"{name} differs from GRPO in its loss only (tests/test_off_policy.py, the fast contract test)")
    if task not in GENERATED and data_root() is None:
        pytest.skip("needs the data root (BENCH_DATA)")
    if task in ENVIRONMENTS and not ALGORITHMS.get(name).multi_turn:
        pytest.skip(f"{name} reads completions as one turn; {task} is an environment (refused at start-up, tested)")
    if task in ENVIRONMENTS and name not in ON_EPISODES:
        pytest.skip(f"{name} shares its episode path with {sorted(ON_EPISODES)} (CI time: one of each kind)")
    if needs_step_rewards(name) and not has_step_rewards(task):
        pytest.skip(f"{name} needs the task's step rewards (Task.process_rewards); {task} has none")
    args = [
        f"algorithm={name}",
        f"task={task}",
        "model.hidden_size=32",
        "model.num_layers=2",
        "model.num_heads=2",
        "model.intermediate_size=64",
        "rollout.prompts_per_step=2",
        "rollout.group_size=4",
        "rollout.max_new_tokens=16",
        "task.num_eval=4",
        "trainer.max_steps=2",
        "trainer.eval_every=100",
        "trainer.progress_bar=false",
        "train.minibatch_size=null",
        *CHEAPER.get(name, []),
        *store["args"],
    ]
    cfg = compose(args)
    result = train(cfg)
    client = MlflowClient(tracking_uri=store["uri"])
    assert client.get_run(result.run_id).info.status == "FINISHED"
    assert len(client.get_metric_history(result.run_id, "reward/mean")) == 2, (name, task)
    losses = [m.value for m in client.get_metric_history(result.run_id, "loss/total")]
    trained = [m.value for m in client.get_metric_history(result.run_id, "rollout/trained_samples")]
    assert all(torch.isfinite(torch.tensor(losses))), (name, task, losses)
    assert len(losses) == sum(t > 0 for t in trained), (name, task, losses, trained)
    if not cfg.algorithm.dynamic_sampling:
        assert len(losses) == 2, (name, task, losses)
