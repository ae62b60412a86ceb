"""Run one training job: config -> policy, task, algorithm -> Lightning Trainer -> MLflow run (+ run directory).

A run directory ``<output_dir>/<run_name>-<time>/`` holds config.yaml, run.json (MLflow run id), checkpoints/last.ckpt
and final/ (the trained policy as an HF folder). ``resume=<run dir>`` continues it in the same MLflow run.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, TQDMProgressBar
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from bench import ROOT, dist
from bench.config import ConfigError, compose, config_hash, flatten, to_yaml
from bench.engine.policy import Reference, load_policy
from bench.registry import ALGORITHMS, TASKS
from bench.task import Task, environment_names, sft_task
from bench.tracking import WARM_START_EXPERIMENT, BenchLogger, artifact_root, git_commit, tracking_uri


class _NotTheirs(logging.Filter):
    """Lightning's advertisements for its cloud products ("💡 Tip: ... litlogger / litmodels"): nothing a user of
    this harness acts on, printed for every run between the progress bars."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip:")


logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_NotTheirs())
# torch deprecates a check Lightning's own _pytree makes (fixed upstream, not ours to act on)
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")

# Keys that do not change what a run computes: excluded from the SFT cache key.
_NOT_IN_KEY = (
    "tracking",
    "eval",
    "output_dir",
    "cache_dir",
    "task.data_root",  # where the data lies on this machine (BENCH_DATA), not what is trained
    "resume",
    "trainer.eval_every",
    "trainer.checkpoint_every",
    "trainer.keep_checkpoint",
    "trainer.progress_bar",
    "trainer.num_threads",
    # speed switches: same samples and updates (tests/test_perf_equivalence.py)
    "rollout.share_prompt_cache",
    "rollout.compact_finished",
    "rollout.static_cache",
    "rollout.logp_from_sampler",
    "rollout.logp_tolerance",
    "train.skip_zero_adv",
    "train.trim_padding",
    "train.share_prompt_forward",
    # where it runs: one process or several compute the same update (bench/dist.py), so they share one warm start
    "trainer.accelerator",
    "trainer.devices",
    "trainer.num_nodes",
    "trainer.strategy",
)


@dataclass
class RunResult:
    run_id: str
    run_dir: Path
    eval_history: list = field(default_factory=list)

    @property
    def first_eval(self) -> dict:
        return self.eval_history[0][1]

    @property
    def last_eval(self) -> dict:
        return self.eval_history[-1][1]


def _path(p: str) -> Path:
    path = Path(p)
    return path if path.is_absolute() else ROOT / path


class _StepProgressBar(TQDMProgressBar):
    """Lightning's progress bar, counting training steps out of trainer.max_steps (the stream is endless)."""

    def on_train_epoch_start(self, trainer, pl_module):
        super().on_train_epoch_start(trainer, pl_module)
        self.train_progress_bar.reset(total=pl_module.cfg.trainer.max_steps)
        self.train_progress_bar.initial = pl_module.step_count
        self.train_progress_bar.set_description("train")

    def get_metrics(self, trainer, pl_module):
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return metrics


DROPPED = "DELETED_ON_FINISH"  # beside checkpoints/last.ckpt once trainer.keep_checkpoint=false deleted it
PROGRESS_RE = r"\[progress\] step (\d+)/(\d+) s/step ([\d.]+)"


class _Interrupted(Callback):
    """Ctrl-C or SIGTERM: save the checkpoint and mark the MLflow run KILLED (Lightning alone would say FAILED).

    Both stop at a step boundary, so the checkpoint and the MLflow history agree (no step logged twice on resume):
    Lightning defers SIGTERM itself; the first Ctrl-C is deferred here to the start of the next step, a second one
    stops at once.

    On several processes a signal may reach one rank only (SIGTERM to rank 0, a scheduler's to one node). Every rank
    then records it here, and at the next step's start the ranks agree (one all-reduce) and all stop together, so the
    checkpoint is written collectively. Lightning's own SIGTERM handler is replaced there: it SIGKILLs the launcher's
    other ranks and broadcasts from inside the handler, which deadlocks against the step's own collectives.
    """

    def __init__(self, ckpt: Path, logger: BenchLogger):
        self.ckpt, self.logger = ckpt, logger
        self.requested, self.previous = False, None

    def _on_sigint(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print("\n[creditbench] Ctrl-C: stopping after this step (Ctrl-C again to stop now)", flush=True)

    def _on_sigterm(self, signum, frame):
        self.terminated = True

    def on_train_start(self, trainer, pl_module):
        self.terminated, self.previous_term = False, None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._on_sigint)
            if trainer.world_size > 1:
                self.previous_term = signal.signal(signal.SIGTERM, self._on_sigterm)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.world_size > 1:
            interrupted, terminated = dist.sum_floats(float(self.requested), float(self.terminated))
            if terminated:
                raise SIGTERMException()
            self.requested = self.requested or interrupted > 0
        if self.requested:
            raise KeyboardInterrupt

    def teardown(self, trainer, pl_module, stage):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            self.previous = None
        if getattr(self, "previous_term", None) is not None:
            signal.signal(signal.SIGTERM, self.previous_term)
            self.previous_term = None

    def on_exception(self, trainer, pl_module, exception):
        if isinstance(exception, (KeyboardInterrupt, SIGTERMException)):
            trainer.save_checkpoint(self.ckpt, weights_only=False)
            self.logger.status_override = "KILLED"
            self.logger.experiment.set_tag(
                self.logger.run_id, "interrupted", f"{type(exception).__name__} at step {pl_module.step_count}"
            )
            if trainer.is_global_zero:
                print(
                    f"\ninterrupted at step {pl_module.step_count}; checkpoint {self.ckpt}\n"
                    f"continue with: python -m bench train resume={self.ckpt.parent.parent}"
                    + (" (under the same launcher: every rank resumes)" if trainer.world_size > 1 else "")
                )


def warm_start_seed(cfg: DictConfig) -> int:
    """The seed the run's SFT warm start is trained with: ``warm_start.seed`` when set (one shared by every seed),
    else the run's own."""
    return cfg.seed if cfg.warm_start.seed is None else cfg.warm_start.seed


def ensure_sft(cfg: DictConfig) -> Path:
    """The SFT checkpoint for this task, model and seed: reused when a finished one with the same resolved SFT
    config is cached, trained otherwise."""
    sft = compose([f"model={cfg.model.name}", f"task={cfg.task.name}", "algorithm=sft"])
    OmegaConf.set_readonly(sft, False)
    keep = {k: cfg[k] for k in ("model", "tracking", "eval", "output_dir", "cache_dir")}
    keep["seed"] = warm_start_seed(cfg)
    keep["task"] = sft_task(cfg.task)  # keys that change only the RL reward at their defaults: one shared warm start
    sft = OmegaConf.merge(
        sft,
        keep,
        {
            "trainer": {
                "max_steps": cfg.warm_start.max_steps,
                "num_threads": cfg.trainer.num_threads,
                "progress_bar": cfg.trainer.progress_bar,
                # the run's precision too (bf16-mixed: a bfloat16 warm start, keyed apart from the float32 one)
                **{
                    k: cfg.trainer[k]
                    for k in ("accelerator", "devices", "num_nodes", "strategy", "precision", "keep_checkpoint")
                },
            },
            # the run's token budget, and an environment's turn limits (the warm start's evaluation plays episodes)
            "rollout": {k: cfg.rollout[k] for k in ("max_new_tokens", "max_turns", "turn_tokens")},
        },
        OmegaConf.from_dotlist(list(cfg.warm_start.overrides)),
    )
    sft.model.lora.enabled = False  # NOTE: the warm start is a full fine-tune; LoRA, if any, applies to RL only
    sft.init = "scratch"
    return cached_run(cfg, sft, "sft", "SFT warm start")


def ensure_dpo(cfg: DictConfig) -> Path:
    """A DPO-trained model for this run's setting (TGDPO's token-reward model): ``algorithm=dpo`` with its defaults
    from the same start, rollout, optimizer and number of steps as ``cfg``; cached like the SFT warm start."""
    dpo = compose([f"model={cfg.model.name}", f"task={cfg.task.name}", "algorithm=dpo"])
    OmegaConf.set_readonly(dpo, False)
    keep = ("seed", "init", "model", "task", "rollout", "optim", "train", "trainer", "warm_start", "tracking", "eval")
    dpo = OmegaConf.merge(dpo, {k: cfg[k] for k in (*keep, "output_dir", "cache_dir")})
    return cached_run(cfg, dpo, "dpo", "DPO token-reward model")


def cached_run(cfg: DictConfig, run: DictConfig, kind: str, label: str) -> Path:
    """Train ``run`` once and keep its final weights under cache_dir/<kind>/, keyed by its resolved config; later
    calls with the same key reuse it. It is tracked in the warm-start experiment and tagged with its key."""
    # Its own run name; of a sweep's tags only the sweep's name (not the cell's identity or axis values).
    run.tracking.run_name = None
    key = config_hash(run, drop=_NOT_IN_KEY)
    # In its own experiment, not nested under a sweep's run: a warm start is shared by every cell (and every later
    # experiment) with the same key, and its 600-step curves would stretch the RL charts. The cells link to it.
    run.tracking.experiment = WARM_START_EXPERIMENT
    run.tracking.parent_run_id = None
    sweep = {k: v for k, v in cfg.tracking.tags.items() if k == "sweep"}  # the sweep that trained it, for provenance
    run.tracking.tags = sweep | {"role": "warm_start", "warm_start.key": key, "warm_start.kind": kind}
    target = _path(cfg.cache_dir) / kind / f"{cfg.task.name}-{cfg.model.name}-s{run.seed}-{key}"
    if dist.env_rank(cfg.trainer.devices) > 0:
        return _join_cached_run(run, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    # One process trains a given warm start; concurrent runs (a sweep's workers) wait for it and reuse it.
    with open(target.with_name(target.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "DONE").exists():
            print(f"[creditbench] reusing {label} {target}")
            return target
        print(f"[creditbench] training {label} ({run.trainer.max_steps} steps) -> {target}")
        result = train(run)
        tmp = target.with_name(target.name + f".tmp{time.time_ns()}")
        shutil.copytree(result.run_dir / "final", tmp)
        (tmp / "DONE").write_text(json.dumps({"mlflow_run_id": result.run_id, "eval": result.last_eval}, indent=2))
        if target.exists():  # a leftover without DONE from a killed run
            shutil.rmtree(target)
        tmp.rename(target)
    return target


def _join_cached_run(run: DictConfig, target: Path, wait_s: float = 3600) -> Path:
    """Rank > 0 of a run on several processes: every rank runs the whole command, so this rank reaches the warm start
    too. If rank 0 found it cached it never trains it (nor does this rank); otherwise this rank takes part in its
    training, and waits for rank 0 to store it (rank 0 alone holds the cache's lock and writes it)."""
    if not (target / "DONE").exists():
        train(run)
        deadline = time.monotonic() + wait_s
        while not (target / "DONE").exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank 0 did not store the warm start {target} within {wait_s:.0f} s")
            time.sleep(0.5)
    return target


def train(cfg: DictConfig, *, resume_dir: Path | None = None) -> RunResult:
    if cfg.trainer.num_threads:
        torch.set_num_threads(cfg.trainer.num_threads)
    L.seed_everything(cfg.seed, verbose=False)
    algo_cls, task_cls = ALGORITHMS.get(cfg.algorithm.name), TASKS.get(cfg.task.name)
    # The data first: a missing data root (or an unreachable hub) fails here, before a warm start, an MLflow run or a
    # run directory exists. The tokenizer joins once the policy is loaded (loading data does not need it).
    dm = task_cls(
        OmegaConf.to_object(cfg.task),
        None,
        seed=cfg.seed,
        prompts_per_step=cfg.rollout.prompts_per_step,
        train_stream=algo_cls.train_stream,
        batch_size=cfg.train.batch_size,
    )
    dm.examples("train")
    dm.eval_examples()
    init_path = {"scratch": None, "sft": None}.get(cfg.init, cfg.init)
    warm_tags = {}
    if cfg.init == "sft":
        init_path = ensure_sft(cfg)
        done = json.loads((init_path / "DONE").read_text())
        warm_tags = {"warm_start.run_id": str(done.get("mlflow_run_id")), "warm_start.path": str(init_path),
                     "warm_start.experiment": WARM_START_EXPERIMENT}  # fmt: skip
    elif init_path is not None and not _path(init_path).exists():
        raise ConfigError(f"init={cfg.init!r}: no such folder; use scratch, sft, or a path to an HF model folder")
    cfg = algo_cls.prepare(cfg)  # e.g. TGDPO's tgdpo_model=dpo -> the cached DPO run it needs
    obj = OmegaConf.to_object(cfg)  # typed dataclasses: fast attribute access in the hot loop
    policy, tokenizer = load_policy(obj.model, obj.seed, init_path and _path(str(init_path)), _path(obj.cache_dir))
    dm.tokenizer = tokenizer
    module = algo_cls(obj, policy, tokenizer, dm)
    module.init_source = str(init_path or cfg.init)
    if module.needs_process_rewards and task_cls.process_rewards is Task.process_rewards and not dm.is_environment:
        have = [n for n in TASKS.names() if TASKS.get(n).process_rewards is not Task.process_rewards]
        raise ConfigError(
            f"algorithm.reward_shaping=process needs the task's step rewards, but task {cfg.task.name!r} has no "
            f"process_rewards; tasks that have them: {', '.join(have)}, and the environments, whose turns are the "
            f"steps: {', '.join(environment_names())}. Use algorithm.reward_shaping=outcome."
        )
    if module.needs_reference:
        module.reference = Reference(policy)

    run_name = cfg.tracking.run_name or f"{cfg.task.name}-{cfg.algorithm.name}-s{cfg.seed}"
    run_id = None
    rank = dist.env_rank(cfg.trainer.devices)
    rank_zero_only.rank = rank  # before the process group exists: only rank 0 talks to MLflow and writes files
    scratch = resume_dir is None and rank > 0 and not os.environ.get("BENCH_RUN_DIR")
    if resume_dir is None and rank > 0:  # rank 0's directory (its launcher passes it on), else a private scratch one
        run_dir = Path(os.environ.get("BENCH_RUN_DIR") or tempfile.mkdtemp(prefix=f"{run_name}-rank{rank}-"))
    elif resume_dir is None:
        run_dir = _path(cfg.output_dir) / f"{run_name}-{time.strftime('%Y%m%d-%H%M%S')}-{time.time_ns() % 10**6:06d}"
        run_dir.mkdir(parents=True)
    else:
        run_dir = resume_dir
        run_id = json.loads((run_dir / "run.json").read_text())["mlflow_run_id"]
    uri = tracking_uri(cfg.tracking.tracking_uri)
    commit = git_commit()  # two git subprocesses: run once
    tags = {
        "task": cfg.task.name,
        "algorithm": cfg.algorithm.name,
        "model": cfg.model.name,
        "seed": str(cfg.seed),
        "init": str(cfg.init),
        "git_commit": commit,
        "mlflow.source.git.commit": commit,
        "run_dir": str(run_dir),
    }
    tags.update(cfg.tracking.tags)
    tags.update(warm_tags)
    if cfg.tracking.parent_run_id:
        tags["mlflow.parentRunId"] = cfg.tracking.parent_run_id  # nested under the sweep's run in the UI
    if hasattr(obj.algorithm, "choices"):  # the critic-free family's explicit choices, as tags for grouping in the UI
        tags.update({f"choice.{k}": v for k, v in obj.algorithm.choices().items()})
    logger = BenchLogger(
        experiment_name=cfg.tracking.experiment,
        run_name=run_name,
        tracking_uri=uri,
        tags=tags,
        artifact_location=artifact_root(uri),
        run_id=run_id,
    )
    try:
        return _fit(cfg, module, dm, policy, tokenizer, logger, run_dir, uri, resume_dir)
    except BaseException as e:
        _end_failed_start(logger, e)
        raise
    finally:
        if scratch:  # torchrun's ranks > 0 kept nothing there: rank 0 writes the run's files
            shutil.rmtree(run_dir, ignore_errors=True)


def _end_failed_start(logger: BenchLogger, error: BaseException) -> None:
    """A run that stopped with an exception is never left RUNNING: if the exception came before Lightning could end
    it (or Lightning did not), mark it FAILED (KILLED for Ctrl-C / SIGTERM) with the error as a tag."""
    rid = getattr(logger, "_run_id", None)
    if rid is None:  # no MLflow run was created
        return
    client = logger.experiment
    killed = isinstance(error, (KeyboardInterrupt, SIGTERMException))
    run = client.get_run(rid)
    if run.info.status != "RUNNING":  # Lightning ended it FAILED: say why (e.g. another rank died: gloo's "closed")
        if not killed and "error" not in run.data.tags:
            client.set_tag(rid, "error", f"{type(error).__name__}: {error}"[:4000])
        return
    client.set_tag(rid, "error", f"{type(error).__name__}: {error}"[:4000])
    client.set_terminated(rid, "KILLED" if killed else "FAILED")


def _fit(cfg, module, dm, policy, tokenizer, logger, run_dir, uri, resume_dir) -> RunResult:
    lead = rank_zero_only.rank == 0
    if resume_dir is None and lead:
        logger.log_hyperparams(flatten(cfg))
        logger.log_text(to_yaml(cfg), "config.yaml")
        (run_dir / "config.yaml").write_text(to_yaml(cfg))
        (run_dir / "run.json").write_text(json.dumps({"mlflow_run_id": logger.run_id, "tracking_uri": uri}))
    else:
        logger.experiment.update_run(logger.run_id, status="RUNNING")
        logger.experiment.set_tag(logger.run_id, "resumed", time.strftime("%Y-%m-%dT%H:%M:%S"))
    if resume_dir is None:  # constants of the run: params, not metrics (they would fill the first chart section)
        # the task's version (its data, prompts and reward; reasoning-gym's names its release and parameters): runs
        # compare only when it matches
        stats = {f"data/{k}": v for k, v in dm.data_stats().items()}
        logger.log_hyperparams({**stats, "data/task_version": dm.version})
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    module.checkpoint_path = ckpt
    callbacks = [_Interrupted(ckpt, logger)]
    if cfg.trainer.progress_bar:
        callbacks.append(_StepProgressBar())
    else:  # a sweep's cells and warm starts write to log files: one [progress] line per 5% (PolicyModule.step_line)
        module.progress_every = max(1, cfg.trainer.max_steps // 20)
    world = cfg.trainer.devices * cfg.trainer.num_nodes
    if world > 1:
        module.check_devices(world)  # a choice whose statistic is not reduced across ranks fails here, with why
        os.environ["BENCH_RUN_DIR"] = str(run_dir)  # Lightning's launcher starts ranks 1.. with rank 0's environment
        logger.log_hyperparams({"dist/world_size": world, "dist/backend": "nccl" if torch.cuda.is_available() and (
            cfg.trainer.accelerator in ("gpu", "cuda", "auto")) else "gloo"})  # fmt: skip
    trainer = L.Trainer(
        accelerator=cfg.trainer.accelerator,
        devices=cfg.trainer.devices,
        num_nodes=cfg.trainer.num_nodes,
        strategy=_strategy(cfg.trainer.strategy, world),
        precision=cfg.trainer.precision,
        max_steps=-1,
        max_epochs=-1,
        logger=logger,
        callbacks=callbacks,
        enable_checkpointing=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        enable_model_summary=False,
        enable_progress_bar=cfg.trainer.progress_bar,
        default_root_dir=run_dir,
        log_every_n_steps=1,
    )
    if module.reference is not None:
        module.reference.to(trainer.strategy.root_device)
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt if resume_dir is not None else None)
    final = run_dir / "final"
    whole = dist.full_state_dict(policy)  # FSDP: every rank gathers the sharded weights (None when not sharded)
    if lead:
        policy.save_pretrained(final, **({} if whole is None else {"state_dict": whole}))
        tokenizer.save_pretrained(final)
        logger.log_json({"eval_history": module.eval_history}, "eval_history.json")
        if not cfg.trainer.keep_checkpoint and ckpt.exists():
            ckpt.unlink()
            (ckpt.parent / DROPPED).write_text("trainer.keep_checkpoint=false: deleted when the run finished\n")
    return RunResult(run_id=logger.run_id, run_dir=run_dir, eval_history=module.eval_history)


def _strategy(name: str, world: int):
    """Lightning's strategy: one device (auto), or DDP / FSDP over ``world`` processes. DDP's own gradient hooks are
    not used by the RL modules (they sum gradients themselves after a step's micro-batches: bench/dist.py), which
    also lets ranks run different numbers of micro-batches. FSDP is Lightning's ModelParallelStrategy (FSDP2: the
    module's ``configure_model`` shards the policy, bench/dist.py), with a data-parallel mesh over every rank; it
    writes whole checkpoints (one file, as DDP does), which ``resume=`` shards again."""
    if world == 1 and name == "auto":
        return "auto"
    if name == "fsdp":
        from lightning.pytorch.strategies import ModelParallelStrategy

        return ModelParallelStrategy(
            data_parallel_size=world, tensor_parallel_size=1, save_distributed_checkpoint=False
        )
    from lightning.pytorch.strategies import DDPStrategy

    return DDPStrategy(find_unused_parameters=False)


def load_config(path: str | Path, overrides: list[str] = ()) -> DictConfig:
    """A saved, resolved config.yaml (a run's, or a sweep cell's), validated again against the typed schema."""
    path = _path(str(path))
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file (expected a config.yaml written by a run or a sweep)")
    saved = OmegaConf.load(path)
    selectors = [f"{s}={saved[s].name}" for s in ("model", "task", "algorithm")]
    cfg = compose(selectors)  # the typed schema, so the saved config is validated again
    OmegaConf.set_readonly(cfg, False)
    try:
        return OmegaConf.merge(cfg, saved, OmegaConf.from_dotlist(list(overrides)))
    except OmegaConfBaseException as e:
        raise ConfigError(f"{path}: {str(e).splitlines()[0]}") from None


def resume(run_dir: str | Path, overrides: list[str] = ()) -> RunResult:
    d = _path(str(run_dir))
    if not d.is_dir():
        runs = sorted(d.parent.glob("*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
        latest = f" The latest resumable one there: {runs[-1].parent.parent}." if runs else ""
        raise ConfigError(
            f"resume={run_dir}: no such directory ({d}). resume= takes the run directory that train printed "
            f"(output_dir/<run name>, e.g. runs/countdown-grpo-s0-<time>).{latest}"
        )
    if (d / "checkpoints" / DROPPED).exists():
        raise ConfigError(
            f"resume={run_dir}: the run finished with trainer.keep_checkpoint=false, so its checkpoint was deleted. "
            f"Its final weights are in {d / 'final'}: start a new run from them (init={d / 'final'})."
        )
    if not (d / "run.json").exists() or not (d / "checkpoints" / "last.ckpt").exists():
        raise ConfigError(
            f"resume={run_dir}: {d} has no run.json and checkpoints/last.ckpt, so it is not a run that can be resumed "
            "(it stopped before its first checkpoint, or is not a run directory); "
            + (
                f"start it afresh with train config_file={d / 'config.yaml'}."
                if (d / "config.yaml").exists()
                else "start a new run with train."
            )
        )
    return train(load_config(d / "config.yaml", overrides), resume_dir=d)
