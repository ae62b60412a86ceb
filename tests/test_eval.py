"""Held-out evaluation keeps what analysis needs: per-problem outcomes as a run artifact (read back from a real MLflow
store), sampled evaluation with mean@k and unbiased pass@k computed from those outcomes, the binomial standard
error, reproducible samples whatever the batch layout, and metric values logged as computed (no float32 artefacts)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

from bench.config import ConfigError, compose
from bench.rl.module import _value, outcome_metrics
from bench.run.train import train
from bench.stats import pass_at_k


def _outcomes(client: MlflowClient, run_id: str, step: int) -> list[dict]:
    path = client.download_artifacts(run_id, f"eval/outcomes/step_{step:06d}.jsonl")
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def sampled_run(tmp_path_factory):
    """A run on the coin test task (tests/conftest.py), where a random model is right on about half the problems: the
    metrics checked below are then not all 0 (on countdown it never is, and 0 == 0 would pass any formula)."""
    from bench.registry import TASKS
    from tests.conftest import COIN, SMALL

    d = tmp_path_factory.mktemp("eval")
    (d / "tasks").mkdir()
    (d / "tasks" / "coin.py").write_text(COIN)
    TASKS.include(d / "tasks")
    uri = f"sqlite:///{d / 'mlflow.db'}"
    args = SMALL + [
        f"tracking.tracking_uri={uri}",
        f"output_dir={d / 'runs'}",
        f"cache_dir={d / 'cache'}",
        "task.num_eval=12",
        "eval.samples_per_problem=4",
        "eval.pass_k=[1,2,4,8]",
        "eval.batch_size=8",
    ]
    cfg = compose(["algorithm=grpo", "task=coin", *args])
    yield train(cfg), MlflowClient(tracking_uri=uri), args
    TASKS.dirs.remove((d / "tasks").resolve())
    TASKS._classes = None


def test_every_evaluation_logs_its_per_problem_outcomes(sampled_run):
    result, client, _ = sampled_run
    steps = [s for s, _ in result.eval_history]
    assert steps == [0, 1, 2]
    logged = {a.path for a in client.list_artifacts(result.run_id, "eval/outcomes")}
    assert logged == {f"eval/outcomes/step_{s:06d}.jsonl" for s in steps}
    rows = _outcomes(client, result.run_id, 2)
    assert len(rows) == 12 and len({r["uid"] for r in rows}) == 12
    for r in rows:
        assert set(r) == {"uid", "correct", "score", "length", "n", "n_correct", "score_mean", "length_mean"}, r
        assert r["correct"] in (0, 1) and r["n"] == 4 and 0 <= r["n_correct"] <= 4 and 0 < r["length"] <= 16


def test_logged_metrics_are_computed_from_the_outcomes(sampled_run):
    result, client, _ = sampled_run
    for step, metrics in result.eval_history:
        rows = _outcomes(client, result.run_id, step)
        correct = np.array([r["correct"] for r in rows], float)
        c = np.array([r["n_correct"] for r in rows])
        assert correct.any() and len(set(c)) > 1, (correct, c)  # not all 0: values a wrong formula would miss
        expect = {
            "eval/accuracy": correct.mean(),
            "eval/accuracy_se": math.sqrt(correct.mean() * (1 - correct.mean()) / len(rows)),
            "eval/mean_at_4": (c / 4).mean(),
            "eval/pass_at_1": (c / 4).mean(),
            "eval/pass_at_2": pass_at_k(4, c, 2).mean(),
            "eval/pass_at_4": float((c > 0).mean()),  # with k = n, pass@n is "any sample correct"
            "eval/completion_len_mean": np.mean([r["length"] for r in rows]),
        }
        run = client.get_run(result.run_id)
        assert "eval/pass_at_8" not in run.data.metrics, "pass@8 with 4 samples per problem is not defined"
        for key, want in expect.items():
            (got,) = [m.value for m in client.get_metric_history(result.run_id, key) if m.step == step]
            assert got == pytest.approx(want, abs=1e-12), (key, step, got, want)
        assert metrics["eval/accuracy"] == expect["eval/accuracy"]


def test_sampled_evaluation_is_reproducible_and_independent_of_the_batch_layout(sampled_run, tmp_path):
    """Each problem's sampler is seeded by (run seed, uid): the same samples with another eval.batch_size."""
    result, client, args = sampled_run
    other = [a for a in args if not a.startswith(("eval.batch_size", "trainer.max_steps"))]
    # the same small model and seed: step 0 evaluates the same initial policy
    cfg = compose(["algorithm=grpo", "task=coin", *other, "eval.batch_size=12", "trainer.max_steps=1"])
    again = train(cfg)
    first, second = _outcomes(client, result.run_id, 0), _outcomes(client, again.run_id, 0)
    assert len({r["n_correct"] for r in first}) > 1  # outcomes that differ between problems, so the order matters
    assert [r["n_correct"] for r in first] == [r["n_correct"] for r in second]
    assert [r["length_mean"] for r in first] == [r["length_mean"] for r in second]


def test_outcome_metrics_hand_values():
    rows = [
        {"correct": 1, "score": 1.0, "length": 10, "n": 4, "n_correct": 2, "score_mean": 0.5, "length_mean": 9.0},
        {"correct": 0, "score": 0.0, "length": 20, "n": 4, "n_correct": 0, "score_mean": 0.0, "length_mean": 19.0},
        {"correct": 0, "score": 0.5, "length": 30, "n": 4, "n_correct": 4, "score_mean": 1.0, "length_mean": 29.0},
    ]
    m = outcome_metrics(rows, 4, [1, 2, 8])
    assert m["eval/accuracy"] == 1 / 3 and m["eval/reward_mean"] == 0.5 and m["eval/completion_len_mean"] == 20
    assert m["eval/accuracy_se"] == pytest.approx(math.sqrt((1 / 3) * (2 / 3) / 3))
    assert m["eval/mean@4"] == 0.5  # (2 + 0 + 4) / 12
    assert m["eval/mean@4_se"] == pytest.approx(np.std([0.5, 0.0, 1.0], ddof=1) / math.sqrt(3))
    # pass@2: 1 − C(2,2)/C(4,2) = 5/6; 0; 1 -> mean 11/18
    assert m["eval/pass@2"] == pytest.approx(11 / 18) and m["eval/pass@1"] == 0.5 and "eval/pass@8" not in m


def test_metric_values_are_the_values_computed():
    """A float32 mean logs as its shortest decimal (0.405), not the float32's binary expansion."""
    x = torch.tensor([0.4, 0.41], dtype=torch.float32).mean()
    assert float(x) != 0.405 and _value(x) == 0.405
    assert _value(torch.tensor(81 / 200, dtype=torch.float64)) == 0.405 and _value(3) == 3.0
    assert _value(torch.tensor(0.1, dtype=torch.bfloat16)) == 0.100097656  # bf16 0.10009765625, as a float32 decimal


def test_training_metrics_reach_mlflow_without_float32_artefacts(sampled_run):
    """Metrics computed as float32 tensors (reward and rollout statistics) arrive as their shortest decimals."""
    result, client, _ = sampled_run
    for key in ("reward/mean", "reward/std", "rollout/accuracy", "rollout/truncated_frac", "stats/lr"):
        history = client.get_metric_history(result.run_id, key)
        assert history, key
        for m in history:
            assert m.value == float(str(np.float32(m.value))), (key, m.value)
            assert len(repr(m.value)) <= 12, (key, m.value)


def test_eval_config_errors_name_the_fix():
    with pytest.raises(ConfigError, match="eval.temperature, which must be > 0"):
        compose(["algorithm=grpo", "task=countdown", "eval.samples_per_problem=4", "eval.temperature=0"])
    with pytest.raises(ConfigError, match="samples_per_problem must be >= 0"):
        compose(["algorithm=grpo", "task=countdown", "eval.samples_per_problem=-1"])


def test_default_countdown_evaluates_a_thousand_problems():
    from bench.registry import TASKS

    cfg = compose(["algorithm=grpo", "task=countdown"])
    task = TASKS.get("countdown")(cfg.task)
    assert cfg.task.num_eval == 1000 and len(task.eval_examples()) == 1000


def test_share_start_reuses_the_step_0_evaluation_only_for_the_same_weights_seed_and_settings(sampled_run, tmp_path):
    """eval.share_start: two algorithms from the same initial weights, seed and evaluation settings log one step-0
    evaluation (the second tagged with the run that computed it, its outcomes and metrics identical); another seed
    or other weights compute their own. Later evaluations are never shared."""
    result, client, args = sampled_run
    share = [*(a for a in args if not a.startswith(("cache_dir", "trainer.max_steps"))), f"cache_dir={tmp_path}",
             "eval.share_start=true", "trainer.max_steps=1"]  # fmt: skip

    def run(*extra):
        r = train(compose(["task=coin", *share, *extra]))
        return r.run_id, client.get_run(r.run_id)

    first_id, first = run("algorithm=grpo")
    assert "eval.start_from" not in first.data.tags
    second_id, second = run("algorithm=rloo")
    assert second.data.tags["eval.start_from"] == first_id
    assert float(second.data.tags["eval.start_seconds"]) > 0
    assert _outcomes(client, second_id, 0) == _outcomes(client, first_id, 0)
    m0 = {k: v for k, v in first.data.metrics.items() if k.startswith("eval/")}
    for key in ("eval/accuracy", "eval/mean_at_4"):
        step0 = [(m.step, m.value) for m in client.get_metric_history(first_id, key) if m.step == 0]
        again = [(m.step, m.value) for m in client.get_metric_history(second_id, key) if m.step == 0]
        assert step0 == again and len(step0) == 1, key
    assert m0  # and step 1 was evaluated by each run itself: its outcomes artifact is there
    assert _outcomes(client, second_id, 1)
    # what must not share: another seed (a setting the key holds), other starting weights (the key's digest)
    for extra in (["seed=1"], ["model.hidden_size=48"]):
        _, other = run("algorithm=rloo", *extra)
        assert "eval.start_from" not in other.data.tags, extra
