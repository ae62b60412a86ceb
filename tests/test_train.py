"""End-to-end runs of the real harness: tiny transformers model, generated Countdown, real MLflow SQLite store."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from bench import ROOT
from bench.config import compose
from bench.run.train import resume, train
from bench.tracking import WARM_START_EXPERIMENT

STEP_METRICS = [
    "reward/mean",
    "reward/std",
    "reward/format",
    "rollout/accuracy",
    "rollout/completion_len_mean",
    "rollout/completion_len_max",
    "rollout/truncated_frac",
    "rollout/zero_var_group_frac",
    "loss/total",
    "loss/policy",
    "stats/kl",
    "stats/clip_frac",
    "stats/entropy",
    "stats/grad_norm",
    "stats/lr",
    "rollout/samples_seen",
    "rollout/tokens_generated",
    "time/generation",
    "time/scoring",
    "time/update",
    "stats/nonfinite_skipped",
]
EVAL_METRICS = ["eval/accuracy", "eval/reward_mean", "eval/completion_len_mean"]


COS36 = math.cos(0.2 * math.pi)


@pytest.mark.parametrize(
    ("decay", "warmup", "expected"),
    [
        # max_steps 10, lr 1e-3. constant: the warm-up alone (1/2, then 1).
        ("constant", 2, [0.5, 1.0, 1.0, 1.0, 1.0]),
        # linear over steps 0..10 down to 0.1 x lr: 0.1 + 0.9 (1 - k/10) at training steps k = 0, 2, 5, 8, 10.
        ("linear", 0, [1.0, 0.82, 0.55, 0.28, 0.1]),
        # cosine: 0.1 + 0.9 * (1 + cos(pi k/10)) / 2 at the same k (cos(0.8 pi) = -cos(0.2 pi)).
        ("cosine", 0, [1.0, 0.1 + 0.45 * (1 + COS36), 0.55, 0.1 + 0.45 * (1 - COS36), 0.1]),
        # with a warm-up of 2 the decay starts after it: (k - 2) / 8, the warm-up's own factor 1/2 at optimizer step 0.
        ("linear", 2, [0.5, 1.0, 0.1 + 0.9 * (1 - 3 / 8), 0.1 + 0.9 * (1 - 6 / 8), 0.1]),
    ],
)
def test_lr_schedule_warm_up_then_decay(decay, warmup, expected):
    """optim.decay: the learning rate a real module's AdamW holds at training steps 0, 2, 5, 8 and 10 of
    trainer.max_steps 10 (optimizer step k at training step k), hand-computed; constant is the warm-up alone."""
    from omegaconf import OmegaConf

    from bench.engine.policy import load_policy
    from bench.registry import ALGORITHMS, TASKS

    schedule = [f"optim.decay={decay}", "optim.min_lr_ratio=0.1", f"optim.warmup_steps={warmup}"]
    cfg = OmegaConf.to_object(compose(["trainer.max_steps=10", "optim.lr=1e-3", *schedule]))
    policy, tok = load_policy(cfg.model, cfg.seed)
    task = TASKS.get("countdown")(cfg.task, tok, seed=0, prompts_per_step=2)
    module = ALGORITHMS.get("grpo")(cfg, policy, tok, task)
    opt = module.configure_optimizers()["optimizer"]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, module.lr_factor)
    seen = []
    for k in range(11):
        module.step_count = k
        sched.last_epoch = k - 1
        sched.step()  # the lr for optimizer step k, taken at training step k
        if k in (0, 2, 5, 8, 10):
            seen.append(opt.param_groups[0]["lr"] / 1e-3)
    assert seen == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize(("key", "value"), [("optim.decay", "exponential"), ("optim.min_lr_ratio", "1.5")])
def test_lr_schedule_rejects_a_bad_value(key, value):
    from bench.config import ConfigError

    with pytest.raises((ConfigError, ValueError), match=key.replace(".", r"\.")):
        compose([f"{key}={value}"])


def test_grpo_run_is_tracked_in_mlflow(small, store):
    """A GRPO run writes one MLflow run with the documented name, tags, params, per-step metrics and eval tables."""
    result = train(compose(["algorithm=grpo", "task=countdown", "seed=3", *small]))
    client = MlflowClient(tracking_uri=store["uri"])
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED", run.info.status
    assert run.info.run_name == "countdown-grpo-s3", run.info.run_name
    tags = run.data.tags
    for k, v in {"task": "countdown", "algorithm": "grpo", "model": "tiny", "seed": "3"}.items():
        assert tags.get(k) == v, (k, tags.get(k))
    assert len(tags["git_commit"]) >= 7, tags["git_commit"]
    params = run.data.params
    assert params["algorithm.clip_eps_low"] == "0.2" and params["rollout.group_size"] == "4", params
    assert params["algorithm.loss_agg"] == "seq-mean-token-mean" and params["algorithm.kl_estimator"] == "k3"
    for name in STEP_METRICS:
        hist = client.get_metric_history(result.run_id, name)
        assert [m.step for m in hist] == [0, 1], (name, [m.step for m in hist])
    samples = client.get_metric_history(result.run_id, "rollout/samples_seen")
    assert [m.value for m in samples] == [16, 32], [m.value for m in samples]  # P*G = 16 per step
    gen = client.get_metric_history(result.run_id, "rollout/tokens_generated")
    lens = client.get_metric_history(result.run_id, "rollout/completion_len_mean")
    assert gen[0].value == pytest.approx(16 * lens[0].value), (gen[0].value, lens[0].value)
    for name in EVAL_METRICS:
        hist = client.get_metric_history(result.run_id, name)
        assert [m.step for m in hist] == [0, 1, 2], (name, [m.step for m in hist])
    acc = client.get_metric_history(result.run_id, "eval/accuracy")
    assert [m.value for m in acc] == [h[1]["eval/accuracy"] for h in result.eval_history]
    artifacts = {a.path for a in client.list_artifacts(result.run_id)}
    assert {"config.yaml", "eval"} <= artifacts, artifacts
    tables = {a.path for a in client.list_artifacts(result.run_id, "eval")}
    assert "eval/samples_step_000000.json" in tables, tables
    table = json.loads(Path(client.download_artifacts(result.run_id, "eval/samples_step_000000.json")).read_text())
    assert set(table["columns"]) >= {"prompt", "completion", "score"}, table["columns"]
    assert (result.run_dir / "final" / "config.json").exists() and (
        result.run_dir / "checkpoints" / "last.ckpt"
    ).exists()


def _metrics(uri: str, run_id: str) -> dict:
    client = MlflowClient(tracking_uri=uri)
    keys = client.get_run(run_id).data.metrics.keys()
    return {
        k: [(m.step, m.value) for m in client.get_metric_history(run_id, k)] for k in keys if not k.startswith("time/")
    }


def test_same_seed_gives_identical_metrics(small, store):
    """Two runs with the same seed on CPU log identical metric histories (timings excluded)."""
    args = ["algorithm=grpo", "task=countdown", "seed=7", "optim.lr=1e-3", *small]
    a, b = train(compose(args)), train(compose(args))
    ma, mb = _metrics(store["uri"], a.run_id), _metrics(store["uri"], b.run_id)
    assert ma == mb, {k: (ma[k], mb.get(k)) for k in ma if ma[k] != mb.get(k)}
    c = train(compose([*args[:2], "seed=8", *args[3:]]))
    assert _metrics(store["uri"], c.run_id) != ma, "a different seed should change the run"


def test_sft_warm_start_is_trained_once_and_reused(small, store, capsys):
    """init=sft trains the SFT checkpoint for (task, model, seed) once; a second RL run reuses the cached one."""
    args = ["algorithm=grpo", "task=countdown", "seed=11", "init=sft", *small]
    train(compose(args))
    first = capsys.readouterr().out
    train(compose([*args, "task.data_root=/another/machine/data"]))  # where the data lies is not part of the key
    second = capsys.readouterr().out
    assert "training SFT warm start" in first and "reusing SFT warm start" in second, (first[-300:], second[-300:])
    cached = [p for p in (store["cache"] / "sft").glob("countdown-tiny-s11-*") if p.is_dir()]
    assert len(cached) == 1 and (cached[0] / "DONE").exists(), cached
    client = MlflowClient(tracking_uri=store["uri"])
    sft_runs = client.search_runs(
        [client.get_experiment_by_name(WARM_START_EXPERIMENT).experiment_id],
        "attributes.run_name = 'countdown-sft-s11'",
    )
    assert len(sft_runs) == 1, [r.info.run_id for r in sft_runs]
    rl_runs = client.search_runs(
        [client.get_experiment_by_name("creditbench").experiment_id], "tags.init = 'sft' and tags.seed = '11'"
    )
    assert len(rl_runs) == 2 and {r.data.tags["warm_start.run_id"] for r in rl_runs} == {sft_runs[0].info.run_id}


def test_warm_start_seed_shares_one_warm_start_across_run_seeds(small, store, capsys):
    """warm_start.seed=31: runs of seeds 12 and 13 start from one SFT checkpoint, trained once with seed 31 (the
    SFT run's own seed), so the two seeds differ only in their RL; without it each seed trains its own."""
    from bench.run.train import ensure_sft

    args = ["algorithm=grpo", "task=countdown", "init=sft", "warm_start.seed=31", *small]
    a, b = ensure_sft(compose([*args, "seed=12"])), ensure_sft(compose([*args, "seed=13"]))
    out = capsys.readouterr().out
    assert a == b and a.name.startswith("countdown-tiny-s31-") and out.count("training SFT warm start") == 1, out
    assert ensure_sft(compose([*args[:3], *small, "seed=12"])) != a  # the run's seed when warm_start.seed is unset
    client = MlflowClient(tracking_uri=store["uri"])
    exp = client.get_experiment_by_name(WARM_START_EXPERIMENT).experiment_id
    names = [r.info.run_name for r in client.search_runs([exp]) if r.info.run_name.startswith("countdown-sft-s")]
    assert names.count("countdown-sft-s31") == 1 and names.count("countdown-sft-s12") == 1, names
    assert "countdown-sft-s13" not in names, names


@pytest.mark.parametrize("sig,tag", [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "KeyboardInterrupt")])
def test_interrupt_checkpoints_marks_killed_and_resumes(store, tmp_path, sig, tag):
    """SIGTERM or Ctrl-C mid-run: checkpoint saved, MLflow run KILLED, non-zero exit; resume= continues the same
    MLflow run to FINISHED with every step logged exactly once."""
    from tests.conftest import SMALL

    out = tmp_path / "runs"
    args = [
        *SMALL,
        "trainer.max_steps=400",
        "trainer.eval_every=1000",
        "trainer.checkpoint_every=1000",
        f"tracking.tracking_uri={store['uri']}",
        f"output_dir={out}",
        f"cache_dir={tmp_path / 'cache'}",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench", "train", "algorithm=grpo", "task=countdown", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 120
    run_dir = None
    while time.time() < deadline and run_dir is None:
        dirs = list(out.glob("*/run.json")) if out.exists() else []
        run_dir = dirs[0].parent if dirs else None
        time.sleep(0.5)
    assert run_dir is not None, "the run never started"
    run_id = json.loads((run_dir / "run.json").read_text())["mlflow_run_id"]
    client = MlflowClient(tracking_uri=store["uri"])
    while time.time() < deadline and not client.get_metric_history(run_id, "reward/mean"):
        time.sleep(0.5)  # wait until at least one training step has been logged
    proc.send_signal(sig)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode != 0, output[-2000:]
    run = client.get_run(run_id)
    assert run.info.status == "KILLED", (run.info.status, output[-2000:])
    assert tag in run.data.tags.get("interrupted", ""), run.data.tags
    assert (run_dir / "checkpoints" / "last.ckpt").exists(), output[-2000:]
    steps_before = [m.step for m in client.get_metric_history(run_id, "reward/mean")]
    stop = max(steps_before) + 2
    result = resume(run_dir, [f"trainer.max_steps={stop}"])
    assert result.run_id == run_id
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED", run.info.status
    steps = [m.step for m in client.get_metric_history(run_id, "reward/mean")]
    assert steps == list(range(stop)), steps  # no step lost, none repeated


TERM_AT_START = '''
import os
import signal

from algorithms.grpo import GRPO


class TermAtStart(GRPO):
    """GRPO that receives SIGTERM as its training starts, before its step-0 evaluation (when TERM_AT_START is set)."""

    def on_train_start(self):
        if os.environ.get("TERM_AT_START"):
            os.kill(os.getpid(), signal.SIGTERM)
        super().on_train_start()
'''


def test_sigterm_during_the_start_evaluation_stops_it_and_resumes(store, tmp_path, include_dir):
    """A SIGTERM that arrives during the evaluation before the first step stops the run there (KILLED at step 0, the
    evaluation cut short and not logged), not when the evaluation ends; the resumed run evaluates its start and
    trains on."""
    from bench.registry import ALGORITHMS
    from tests.conftest import SMALL

    (include_dir / "term_at_start.py").write_text(TERM_AT_START)
    out = tmp_path / "runs"
    args = [*SMALL, "task.num_eval=16", "eval.batch_size=4", f"tracking.tracking_uri={store['uri']}",
            f"output_dir={out}", f"cache_dir={tmp_path / 'cache'}"]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--include", str(include_dir), "train", "algorithm=term_at_start",
         "task=countdown", *args],
        cwd=ROOT, env={**os.environ, "TERM_AT_START": "1"}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 128 + signal.SIGTERM, proc.stdout[-2000:] + proc.stderr[-2000:]
    run_dir = next(out.glob("*/run.json")).parent
    run_id = json.loads((run_dir / "run.json").read_text())["mlflow_run_id"]
    client = MlflowClient(tracking_uri=store["uri"])
    run = client.get_run(run_id)
    assert run.info.status == "KILLED", run.info.status
    assert run.data.tags.get("interrupted") == "SIGTERMException at step 0", run.data.tags
    assert client.get_metric_history(run_id, "eval/accuracy") == []  # cut between chunks, not finished and logged
    ALGORITHMS.include(include_dir)
    result = resume(run_dir, ["trainer.max_steps=1"])
    assert result.run_id == run_id and client.get_run(run_id).info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run_id, "eval/accuracy")] == [0, 1]
    assert [m.step for m in client.get_metric_history(run_id, "reward/mean")] == [0]


def test_resuming_a_run_stopped_after_its_last_step_trains_no_extra_step(small, store):
    """A stop that lands after the last step (the checkpoint already at max_steps) resumes to FINISHED without a
    step past trainer.max_steps (the sweep's SIGTERM can arrive then)."""
    result = train(compose(["algorithm=grpo", "task=countdown", *small, "trainer.max_steps=2"]))
    client = MlflowClient(tracking_uri=store["uri"])
    client.update_run(result.run_id, status="KILLED")  # what the stop leaves: the checkpoint is at step 2 of 2
    again = resume(result.run_dir)
    assert again.run_id == result.run_id
    assert client.get_run(result.run_id).info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(result.run_id, "time/step")] == [0, 1]


def test_keep_checkpoint_false_deletes_a_finished_runs_checkpoint_and_resume_says_so(small, store):
    """trainer.keep_checkpoint=false: the finished run keeps final/ but not its checkpoint, and resume= names why and
    what to start from instead; the setting leaves the run's identity (sweep cell id, warm-start key) unchanged."""
    from bench.config import ConfigError, config_hash
    from bench.run.sweep import NOT_IN_IDENTITY
    from bench.run.train import DROPPED

    args = ["algorithm=grpo", "task=countdown", *small, "trainer.max_steps=1", "trainer.checkpoint_every=1"]
    result = train(compose([*args, "trainer.keep_checkpoint=false"]))
    assert (result.run_dir / "final" / "config.json").exists()
    assert not (result.run_dir / "checkpoints" / "last.ckpt").exists()
    assert (result.run_dir / "checkpoints" / DROPPED).exists()
    with pytest.raises(ConfigError, match="keep_checkpoint=false.*init="):
        resume(result.run_dir)
    kept = compose(args)
    assert config_hash(kept, drop=NOT_IN_IDENTITY) == config_hash(compose([*args, "trainer.keep_checkpoint=false"]),
                                                                   drop=NOT_IN_IDENTITY)  # fmt: skip
    assert config_hash(kept) == config_hash({k: v for k, v in kept.items() if k != "trainer"} | {
        "trainer": {k: v for k, v in kept.trainer.items() if k != "keep_checkpoint"}})  # fmt: skip


NAN_ALGORITHM = '''
import torch
from algorithms.grpo import GRPO


class NanOnFirstStep(GRPO):
    """GRPO whose loss is NaN on rollout step 0 only."""

    def loss(self, rows, logp, norm):
        loss, stats = super().loss(rows, logp, norm)
        return (loss * float("nan") if self.step_count == 0 else loss), stats
'''


@pytest.fixture
def include_dir(tmp_path):
    from bench.registry import ALGORITHMS

    d = tmp_path / "extra"
    d.mkdir()
    yield d
    if d.resolve() in ALGORITHMS.dirs:
        ALGORITHMS.dirs.remove(d.resolve())
        ALGORITHMS._classes = None


def test_nonfinite_loss_skips_the_update_and_continues(small, store, include_dir):
    """A NaN loss skips that optimizer step (weights untouched), is counted in stats/nonfinite_skipped, and the run
    goes on to finish."""
    from bench.registry import ALGORITHMS

    (include_dir / "nan_on_first.py").write_text(NAN_ALGORITHM)
    ALGORITHMS.include(include_dir)
    # train.skip_zero_adv=false: the random model scores 0 everywhere, and skipped rows never evaluate the loss
    args = ["algorithm=nan_on_first", "task=countdown", "algorithm.beta=0", "train.skip_zero_adv=false", *small]
    result = train(compose(args))
    client = MlflowClient(tracking_uri=store["uri"])
    assert client.get_run(result.run_id).info.status == "FINISHED"
    skipped = [m.value for m in client.get_metric_history(result.run_id, "stats/nonfinite_skipped")]
    steps = [m.value for m in client.get_metric_history(result.run_id, "stats/optimizer_steps")]
    assert skipped == [1, 1] and steps == [0, 1], (skipped, steps)


def test_sanitize_metric_names():
    """Metric keys MLflow would reject are rewritten to valid ones."""
    from bench.tracking import sanitize

    assert sanitize("eval/pass@1") == "eval/pass_at_1"
    assert sanitize("reward/f(x)") == "reward/f_x_"
    assert sanitize("time/update s-1.5") == "time/update s-1.5"


def test_grpo_with_lora_and_qwen2_tiny(small, store, coin):
    """GRPO trains with a LoRA adapter on a Qwen2-style tiny model; the reference is the adapter-disabled network and
    only adapter weights change."""
    # The coin task: a random model's rewards vary (on countdown they are all 0, no gradient, and the adapter could
    # not move whatever the code did)
    args = ["algorithm=grpo", *coin, "model.arch=qwen2", "model.lora.enabled=true", "optim.lr=1e-2", *small]
    result = train(compose(args))
    run = MlflowClient(tracking_uri=store["uri"]).get_run(result.run_id)
    assert run.info.status == "FINISHED" and run.data.params["model.lora.enabled"] == "True"
    assert (result.run_dir / "final" / "adapter_config.json").exists(), list((result.run_dir / "final").iterdir())
    # Only the adapter changed: the trained adapter over a fresh copy of the same seeded base holds every base
    # weight as it was at the start, and some adapter weight moved (LoRA's B starts at 0).
    from peft import PeftModel

    from bench.engine.policy import Reference, load_policy

    cfg = compose(args)
    base, _ = load_policy(_no_lora(cfg.model), cfg.seed, None, store["cache"])
    start = {k: v.clone() for k, v in base.state_dict().items()}
    trained = PeftModel.from_pretrained(base, result.run_dir / "final")
    names = dict(trained.named_parameters())
    frozen = {k: v for k, v in names.items() if "lora_" not in k}
    assert frozen and all(torch.equal(v, start[k.removeprefix("base_model.model.").replace(".base_layer", "")])
                      for k, v in frozen.items())  # fmt: skip
    assert any(v.abs().max() > 0 for k, v in names.items() if "lora_B" in k), "the adapter never moved"
    # The reference is the same network with the adapter disabled: no second copy, the base model's log-probs.
    ref = Reference(trained)
    ids = torch.arange(1, 9).view(1, -1)
    with ref.model() as m:
        assert ref.snapshot is None and m is trained
        ref_logits = m(input_ids=ids).logits
    fresh, _ = load_policy(_no_lora(cfg.model), cfg.seed, None, store["cache"])
    assert torch.allclose(ref_logits, fresh(input_ids=ids).logits, atol=1e-6)
    assert not torch.allclose(ref_logits, trained(input_ids=ids).logits, atol=1e-4), "the adapter changes nothing"
    assert "stats/kl" in run.data.metrics and run.data.metrics["stats/kl"] > 0  # the policy left the reference


def _no_lora(model_cfg):
    from omegaconf import OmegaConf

    obj = OmegaConf.to_object(model_cfg)
    obj.lora.enabled = False
    return obj


def test_local_model_folder_as_policy(small, store):
    """model.name_or_path accepts a local HF folder (here the final policy of a previous run)."""
    from safetensors.torch import load_file

    first = train(compose(["algorithm=sft", "task=countdown", "optim.lr=1e-2", *small]))
    folder = first.run_dir / "final"
    # At lr 0 the run's final weights are its starting ones: they must be the folder's, not a fresh initialisation
    # (which the 2 SFT steps at lr 1e-2 moved away from; compared by weights, since both evaluate at accuracy 0).
    result = train(compose(["algorithm=grpo", "task=countdown", f"model.name_or_path={folder}", "optim.lr=0",
                            "algorithm.beta=0", *small]))  # fmt: skip
    scratch = train(compose(["algorithm=grpo", "task=countdown", "optim.lr=0", "algorithm.beta=0", *small]))
    sft_w, start_w = load_file(folder / "model.safetensors"), load_file(result.run_dir / "final" / "model.safetensors")
    scratch_w = load_file(scratch.run_dir / "final" / "model.safetensors")
    assert sft_w.keys() == start_w.keys() and all(torch.equal(sft_w[k], start_w[k]) for k in sft_w)
    assert any(not torch.equal(sft_w[k], scratch_w[k]) for k in sft_w), "the SFT steps changed nothing"


def test_console_carries_no_advertisement_or_foreign_deprecation(tmp_path):
    """A run's console has the harness's own lines, not Lightning's cloud tips, torch's deprecation of Lightning's
    _pytree check, or the weights_only default notice (issue 16: printed twice per run, between the bars)."""
    from tests.conftest import SMALL

    args = [*SMALL, "trainer.progress_bar=false", f"output_dir={tmp_path / 'runs'}", f"cache_dir={tmp_path / 'c'}",
            f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}", "trainer.checkpoint_every=1"]  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "bench", "train", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-2000:]
    for noise in ("💡 Tip", "litlogger", "litmodels", "LeafSpec", "weights_only"):
        assert noise not in out, (noise, out[-2000:])
    assert "held-out accuracy (greedy pass@1)" in out
