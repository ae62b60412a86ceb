"""Base LightningModules: ``PolicyModule`` (policy, optimizer, held-out evaluation, metric logging) and
``RLModule`` (one training step = one rollout batch -> rewards -> advantages -> ppo_epochs x minibatches).

Algorithms subclass these and declare what they need (``needs_reference``, ``needs_entropy``, ``train_stream``);
shared code never asks an algorithm its name.
"""

from __future__ import annotations

import math
import os
import random
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import ClassVar

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from bench import dist
from bench.engine.behaviour import BehaviourPolicy
from bench.engine.episode import Episodes, episode_metrics, episode_sums, run_episodes
from bench.engine.policy import Reference, completion_logprobs
from bench.engine.rollout import Generation, Rollout, branch, generate, sample_seed
from bench.rl.losses import Norm, terminal_rewards, zero_variance_groups
from bench.rl.segment import step_token_rewards
from bench.stats import binomial_se, mean_se, pass_at_k
from bench.task import RewardResult

ENGINE_MAX_LEN = 4096
"""The longest sequence (prompt + completion) the vLLM engine is built for, below the model's own limit."""


@dataclass
class AlgorithmConfig:
    """Fields every algorithm has; each algorithm extends this with its paper's symbols."""

    name: str = "grpo"


def _value(v) -> float:
    """A metric as the value computed: a float32 (or lower-precision) tensor becomes the shortest decimal that rounds
    to the same float32 (0.405, not 0.4050000011920929); everything else is converted as it is."""
    if isinstance(v, torch.Tensor) and v.dtype in (torch.float32, torch.float16, torch.bfloat16):
        return float(str(np.float32(v.float().item())))
    return float(v)


def outcome_metrics(outcomes: list[dict], k: int = 0, pass_k: list[int] = ()) -> dict[str, float]:
    """Evaluation metrics from per-problem outcomes (``PolicyModule.evaluate``), in float64: greedy accuracy with its
    binomial standard error, mean reward and completion length; with k samples per problem, mean@k with its standard
    error over problems and the unbiased pass@j for each j <= k in ``pass_k``."""
    correct = np.array([o["correct"] for o in outcomes], dtype=np.float64)
    acc = float(correct.mean())
    m = {
        "eval/accuracy": acc,
        "eval/accuracy_se": binomial_se(acc, len(correct)),
        "eval/reward_mean": math.fsum(o["score"] for o in outcomes) / len(outcomes),
        "eval/completion_len_mean": sum(o["length"] for o in outcomes) / len(outcomes),
    }
    if k:
        c = np.array([o["n_correct"] for o in outcomes], dtype=np.int64)
        m[f"eval/mean@{k}"] = float((c / k).mean())
        m[f"eval/mean@{k}_se"] = mean_se(c / k)
        m["eval/sampled_reward_mean"] = math.fsum(o["score_mean"] for o in outcomes) / len(outcomes)
        m["eval/sampled_len_mean"] = math.fsum(o["length_mean"] for o in outcomes) / len(outcomes)
        for j in sorted(set(pass_k)):
            if j <= k:
                m[f"eval/pass@{j}"] = float(pass_at_k(k, c, j).mean())
    return m


class PolicyModule(L.LightningModule):
    Config: ClassVar[type[AlgorithmConfig]] = AlgorithmConfig
    description: ClassVar[str] = ""
    train_stream: ClassVar[str] = "prompts"
    """What the task's train dataloader yields: "prompts" (RL) or "demonstrations" (supervised)."""
    needs_reference: bool = False
    """Whether log π_ref is computed for each rollout (algorithms may make this a property of their config)."""
    needs_process_rewards: bool = False
    """Whether each completion's steps are scored by ``Task.process_rewards`` into ``Rollout.step_rewards``."""
    needs_old_logp: bool = True
    """Whether the loss reads log π_old; when not, the behaviour pass skips that forward (``old_logp`` is then the
    sampler's log-probs, as with ``rollout.logp_from_sampler``)."""
    needs_entropy: bool = False
    """Whether the full-vocabulary entropy of π_old per token is stored on each rollout (``Rollout.entropy``),
    computed in the same forward as log π_old."""
    multi_turn: ClassVar[bool] = False
    """Whether the algorithm trains on an environment task's episodes (bench/engine/episode.py): it reads a rollout's
    loss mask, scores and turn rewards, never a completion as one turn's text (no re-scoring, branching or spans)."""

    @classmethod
    def prepare(cls, cfg):
        """The resolved config before the run is built: an algorithm that needs another trained model first (TGDPO's
        DPO-trained token-reward model) trains or finds it here and returns the config pointing at it."""
        return cfg

    def __init__(self, cfg, policy, tokenizer, task):
        super().__init__()
        self.cfg, self.acfg = cfg, cfg.algorithm
        self.policy, self.tokenizer, self.task = policy, tokenizer, task
        self.step_count = 0  # training steps done: rollout steps for RL, optimizer steps for SFT
        self.reference: Reference | None = None
        self.init_source = str(cfg.init)  # the weights the run starts from (the driver sets the SFT folder's path)
        self.checkpoint_path = None  # set by the driver: where periodic and final checkpoints go
        self.last_eval_step = -1
        self.eval_history: list[tuple[int, dict]] = []
        if getattr(task, "is_environment", False) and not self.multi_turn:
            from bench.config import ConfigError
            from bench.registry import ALGORITHMS

            able = [n for n in ALGORITHMS.names() if ALGORITHMS.get(n).multi_turn]  # algorithms declare it
            raise ConfigError(
                f"algorithm={cfg.algorithm.name} reads each completion as one turn's text, and task={task.cfg.name} "
                f"is an environment (multi-turn episodes). Algorithms that train on episodes: {', '.join(able)}"
            )

    # ---- optimisation -------------------------------------------------------------------------------------------
    def configure_optimizers(self):
        o = self.cfg.optim
        params = [p for p in self.policy.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=o.lr, betas=(o.beta1, o.beta2), weight_decay=o.weight_decay)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, self.lr_factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def lr_factor(self, optimizer_steps: int) -> float:
        """The learning rate's multiplier: a linear warm-up over ``optim.warmup_steps`` optimizer steps, then
        ``optim.decay`` over the training steps from the warm-up's end to ``trainer.max_steps``."""
        o = self.cfg.optim
        warm = max(o.warmup_steps, 0)
        factor = min(1.0, (optimizer_steps + 1) / warm) if warm else 1.0
        if o.decay == "constant":
            return factor
        done = min(max(self.step_count - warm, 0) / max(self.cfg.trainer.max_steps - warm, 1), 1.0)
        shape = 1.0 - done if o.decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * done))
        return factor * (o.min_lr_ratio + (1.0 - o.min_lr_ratio) * shape)

    # ---- bookkeeping --------------------------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["bench"] = {
            "step_count": self.step_count,
            "last_eval_step": self.last_eval_step,
            "eval_history": self.eval_history,
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        state = checkpoint["bench"]
        self.step_count, self.last_eval_step = state["step_count"], state["last_eval_step"]
        self.eval_history = state["eval_history"]
        self.task.start_step = self.step_count

    def log_metrics(self, metrics: dict[str, float]) -> None:
        """All metrics go to the loggers with step = training step (rollout step for RL), never Lightning's count of
        optimizer steps, so every algorithm shares the x-axis."""
        metrics = {k: _value(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
        for logger in self.loggers:
            logger.log_metrics(metrics, step=self.step_count)

    def budget_grid(self, axis: str) -> int:
        """The spacing of the budget-matched curves' grid on ``axis`` (samples_seen | tokens_generated): from the
        config alone (a 1-2-5 number near a quarter of the samples, an eighth of the token budget, one evaluation
        interval allows), so every seed of a setting logs the same steps."""
        r, every = self.cfg.rollout, self.cfg.trainer.eval_every
        raw = (
            r.prompts_per_step * r.group_size * every * (r.max_new_tokens / 8 if axis == "tokens_generated" else 1 / 4)
        )
        exp = 10 ** math.floor(math.log10(max(raw, 1.0)))
        return int(max(1, max(m * exp for m in (1, 2, 5) if m * exp <= max(raw, 1.0))))

    def log_against_budget(self, metrics: dict[str, float]) -> None:
        """The headline eval metrics again, under ``eval_vs_samples/`` and ``eval_vs_tokens/``, with the budget as
        their MLflow step, on a grid every seed shares (``budget_grid``): at each evaluation, every grid point passed
        since the previous one gets the value interpolated linearly between the two evaluations (the evaluation at
        budget 0 is point 0). MLflow's grouped chart averages runs at equal steps only, so budget counts that differ
        by a few tokens between seeds (15,902 and 15,911) made the grouped mean zigzag; on a shared grid it is the
        budget-matched mean. (Pairing eval/accuracy with rollout/samples_seen by step drops the last evaluation and
        shifts the others: rollout metrics are logged at steps 0..N−1, including that step's batch.)"""
        heads = {k.split("/", 1)[1]: v for k, v in metrics.items()
                 if k == "eval/accuracy" or (k.startswith("eval/mean@") and not k.endswith("_se"))}  # fmt: skip
        before = self.eval_history[-1][1] if self.eval_history else None
        for axis, prefix in (("samples_seen", "eval_vs_samples"), ("tokens_generated", "eval_vs_tokens")):
            if not hasattr(self, axis):
                continue
            budget, grid = float(getattr(self, axis)), self.budget_grid(axis)
            b0 = before.get(f"eval/at_{axis}") if before else None
            if b0 is None or budget <= b0:
                points = {0: heads} if budget == 0 else {}
            else:
                points = {}
                for g in range(int(b0 // grid + 1) * grid, int(budget) + 1, grid):
                    w = (g - b0) / (budget - b0)
                    points[g] = {
                        k: before.get(f"eval/{k}", v) + w * (v - before.get(f"eval/{k}", v)) for k, v in heads.items()
                    }
            for g, values in points.items():
                for logger in self.loggers:
                    logger.log_metrics({f"{prefix}/{k}": _value(v) for k, v in values.items()}, step=g)

    def on_train_start(self) -> None:
        if self.step_count == 0 and self.last_eval_step < 0:
            self.evaluate_start()
        self._line_start = (time.monotonic(), self.step_count)  # the [progress] lines' clock

    def on_train_batch_start(self, batch, batch_idx):
        # A run stopped (SIGTERM, Ctrl-C) after its last step but before it finished resumes with nothing left to do:
        # end the fit instead of training (and logging) a step past trainer.max_steps.
        if self.step_count >= self.cfg.trainer.max_steps:
            self.trainer.should_stop = True
            return -1

    progress_every: int = 0
    """Print a [progress] line every this many training steps and at the last (0: never; runs without a progress bar
    get one, so a sweep's logs show each warm start's and cell's step: bench.run.train.PROGRESS_RE reads them)."""

    def step_line(self) -> None:
        step, total = self.step_count, self.cfg.trainer.max_steps
        if self.progress_every and (step % self.progress_every == 0 or step >= total) and dist.rank() == 0:
            t0, first = getattr(self, "_line_start", (time.monotonic(), step))
            per = (time.monotonic() - t0) / max(step - first, 1)
            eta = per * (total - step) / 60
            print(f"[progress] step {step}/{total} s/step {per:.2f} ETA {eta:.1f} min", flush=True)

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        self.step_count += 1
        self.step_line()
        done = self.step_count >= self.cfg.trainer.max_steps
        if done or self.step_count % self.cfg.trainer.eval_every == 0:
            self.evaluate()
        if done:
            self.trainer.should_stop = True
        if self.checkpoint_path and (done or self.step_count % self.cfg.trainer.checkpoint_every == 0):
            self.save_checkpoint()

    def save_checkpoint(self) -> None:
        """The full state (resumable), written beside the checkpoint and renamed over it: a process killed while
        writing leaves the previous checkpoint whole. Every rank calls it (Lightning's save is collective); rank 0
        writes."""
        path = self.checkpoint_path
        tmp = path.with_name(path.name + ".partial")
        self.trainer.save_checkpoint(tmp, weights_only=False)
        if self.trainer.is_global_zero:
            os.replace(tmp, path)
        self.trainer.strategy.barrier("bench.save_checkpoint")

    def check_devices(self, world: int) -> None:
        """Fail at start-up, with the reason, on a choice that does not yet run on ``world`` > 1 processes."""
        why = self.distributed_blockers(world) if world > 1 else []
        if why:
            from bench.config import ConfigError

            raise ConfigError(f"trainer.devices x trainer.num_nodes = {world} processes: " + " ".join(why))

    def distributed_blockers(self, world: int) -> list[str]:
        """Sentences, one per choice that does not run on ``world`` processes; subclasses add theirs."""
        return []

    def require_hf_engine(self, why: str) -> None:
        """Fail at start-up when ``rollout.engine`` is not hf, for an algorithm that samples in a way only the hf
        engine serves (``why``: what it samples)."""
        engine = self.cfg.rollout.engine
        if engine != "hf":
            from bench.config import ConfigError

            raise ConfigError(f"algorithm={self.cfg.algorithm.name} {why} with the hf engine only; rollout.engine="
                              f"{engine} does not do that yet: use rollout.engine=hf.")  # fmt: skip

    sums_gradients: bool = False
    """Whether this module's loss already divides by the global batch's denominators, so the ranks' gradients are
    summed (the RL modules: bench/dist.py), not averaged (SFT: each rank's mean over its own batch)."""

    def configure_model(self) -> None:
        """trainer.strategy=fsdp (Lightning's ModelParallelStrategy sets ``device_mesh``): shard the policy with FSDP2
        over the data-parallel ranks. A critic, a reference copy or a behaviour copy stays whole on every rank."""
        if self.device_mesh is not None and not dist.sharded(self.policy):
            dist.shard(self.policy, self.device_mesh["data_parallel"], sum_gradients=self.sums_gradients)
            held = sum(p.to_local().numel() for p in self.policy.parameters())
            share = dist.sum_floats(held)[0] / dist.world() / sum(p.numel() for p in self.policy.parameters())
            for logger in self.loggers:  # the policy's weights one rank holds between forwards (1 / ranks, ± padding)
                logger.log_hyperparams({"dist/fsdp_weights_per_rank": round(share, 4)})

    def setup(self, stage: str) -> None:
        """After the process group exists: a per-rank seed for torch's global generator, derived from the run seed and
        the rank (sampling is seeded per prompt and does not use it), recorded with the run."""
        if dist.active():
            seed = sample_seed(self.cfg.seed, "rank", dist.rank()) % 2**31
            torch.manual_seed(seed)
            seeds = dist.gather_objects(seed)
            for logger in self.loggers:
                logger.log_hyperparams({"dist/rank_seeds": ",".join(map(str, seeds))})

    # ---- evaluation ---------------------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Greedy pass@1 on the task's fixed held-out set and, with ``eval.samples_per_problem`` = k, k completions
        per problem at ``eval.temperature``. Per-problem outcomes go to the run as ``eval/outcomes/step_<step>.jsonl``
        (uid, correct, score, length; with sampling also n, n_correct, score_mean, length_mean), the metrics are
        computed from them in float64 (``outcome_metrics``)."""
        e = self.cfg.eval
        was_training = self.policy.training
        self.policy.eval()
        examples = self.task.eval_examples()[dist.share(len(self.task.eval_examples()))]  # this rank's problems
        outcomes: list[dict] = [{"uid": ex.uid} for ex in examples]
        rows, components = [], defaultdict(list)
        with dist.full_weights(self.policy):  # FSDP: each rank decodes its own problems on the whole weights
            for start, chunk, texts, lengths, results in self._generations(examples, 1, 0.0):
                for i, (ex, text, n) in enumerate(zip(chunk, texts, lengths, strict=True)):
                    res = results[i] if results else self.task.reward(ex, text)
                    outcomes[start + i].update(correct=int(self.task.is_correct(res)), score=float(res.score), length=n)
                    for k, v in res.components.items():
                        components[k].append(float(v))
                    if len(rows) < e.samples_logged:
                        rows.append(
                            {
                                "step": self.step_count,
                                "uid": ex.uid,
                                "prompt": self.task.render_prompt(ex),
                                "completion": text,
                                "score": res.score,
                            }
                        )
            k = e.samples_per_problem
            if k:
                for start, chunk, texts, lengths, scored in self._generations(examples, k, e.temperature):
                    for i, ex in enumerate(chunk):
                        results = scored[i * k : (i + 1) * k] if scored else [
                            self.task.reward(ex, t) for t in texts[i * k : (i + 1) * k]]  # fmt: skip
                        outcomes[start + i].update(
                            n=k,
                            n_correct=sum(self.task.is_correct(r) for r in results),
                            score_mean=math.fsum(r.score for r in results) / k,
                            length_mean=sum(lengths[i * k : (i + 1) * k]) / k,
                        )
        if dist.active():  # every rank's problems, in the set's order, so every outcome is kept and logged
            outcomes = [o for part in dist.gather_objects(outcomes) for o in part]
            rows = [r for part in dist.gather_objects(rows) for r in part][: e.samples_logged]
            merged = defaultdict(list)
            for part in dist.gather_objects(dict(components)):
                for name, v in part.items():
                    merged[name] += v
            components = merged
        metrics = outcome_metrics(outcomes, k, e.pass_k)
        scores = [o["score"] for o in outcomes]
        # A component equal to the score on every problem (countdown's correct, GSM8K's strict) is eval/accuracy's
        # twin: not logged again.
        metrics.update({f"eval/{name}": math.fsum(v) / len(v) for name, v in components.items() if v != scores})
        self.policy.train(was_training)
        return self.log_evaluation(metrics, rows, outcomes)

    def log_evaluation(self, metrics: dict[str, float], rows: list[dict], outcomes: list[dict]) -> dict[str, float]:
        """Log one evaluation (its metrics, sample table and per-problem outcomes) at the current step."""
        # The other x-axes at this evaluation, so curves can be drawn against samples or tokens as well as steps.
        for axis in ("samples_seen", "tokens_generated"):
            if hasattr(self, axis):
                metrics[f"eval/at_{axis}"] = getattr(self, axis)
        self.last_evaluation = (metrics, rows, outcomes)
        self.log_metrics(metrics)
        self.log_against_budget(metrics)
        for logger in self.loggers:
            if hasattr(logger, "log_table"):
                logger.log_table(rows, f"eval/samples_step_{self.step_count:06d}.json")
                logger.log_jsonl(outcomes, f"eval/outcomes/step_{self.step_count:06d}.jsonl")
        self.eval_history.append((self.step_count, metrics))
        self.last_eval_step = self.step_count
        return metrics

    def evaluate_start(self) -> dict[str, float]:
        """The step-0 evaluation, shared by the runs that start from the same weights with the same evaluation: the
        held-out samples are seeded by (run seed, problem), so a sweep's algorithms with one seed and one warm start
        would each compute the same evaluation (on SmolLM2, 2 of a 40-step cell's 12 minutes). The first run computes
        it and stores it under cache_dir/eval_start/, keyed by a digest of the weights and every setting but the
        training ones (``START_EVAL_IGNORES``); the others log it and say so (tag ``eval.start_from``: the run that
        computed it). With ``eval.share_start`` (off by default); a run on several processes computes its own."""
        share = self.cfg.eval.share_start and bool(self.cfg.cache_dir) and not dist.active()
        key = self.start_eval_key() if share else None
        if key is None:
            return self.evaluate()
        import fcntl
        import json

        path = Path(self.cfg.cache_dir).expanduser() / "eval_start" / f"{key}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(".lock"), "w") as lock:  # a run starting beside it waits, then reuses
            fcntl.flock(lock, fcntl.LOCK_EX)
            if path.exists():
                stored = json.loads(path.read_text())
                metrics = self.log_evaluation(stored["metrics"], stored["rows"], stored["outcomes"])
                self.tag_run({"eval.start_from": stored["run_id"], "eval.start_seconds": f"{stored['seconds']:.1f}"})
                print(f"[eval] step 0: reusing the evaluation of run {stored['run_id']} (same weights and settings)")
                return metrics
            t0 = time.monotonic()
            self.evaluate()
            metrics, rows, outcomes = self.last_evaluation
            run_id = next((lg.run_id for lg in self.loggers if getattr(lg, "run_id", None)), "unknown")
            record = {"metrics": metrics, "rows": rows, "outcomes": outcomes, "run_id": run_id,
                      "seconds": time.monotonic() - t0}  # fmt: skip
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(record, default=str))
            tmp.replace(path)
            return metrics

    START_EVAL_IGNORES: ClassVar[tuple[str, ...]] = (
        "algorithm", "optim", "train", "tracking", "output_dir", "cache_dir", "resume", "init", "warm_start",
        "task.data_root", "trainer.max_steps", "trainer.eval_every", "trainer.checkpoint_every", "trainer.num_threads",
        "trainer.progress_bar", "rollout.group_size", "rollout.prompts_per_step", "rollout.staleness",
        "rollout.prompt_pool", "rollout.pool_samples", "rollout.pool_screened", "rollout.logp_from_sampler",
        "rollout.logp_tolerance",
    )  # fmt: skip
    """Settings that cannot change a step-0 evaluation: what the training does after it, and where things lie (the
    starting weights enter the key as their digest, so init and warm_start need not)."""

    def start_eval_key(self) -> str:
        import dataclasses
        import hashlib
        import inspect
        import json

        from bench.config import flatten

        h = hashlib.blake2b(digest_size=16)
        for name, t in sorted(self.policy.state_dict().items()):
            h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
            h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
        # The code that evaluates: which methods this module uses, and the harness's and the tasks' source (a fix to
        # the evaluation or a reward must not meet an evaluation stored before it), and the libraries that generate.
        code = [getattr(type(self), m).__qualname__ for m in ("evaluate", "_generations", "eval_sampler")]
        root = Path(__file__).resolve().parents[2]
        task_file = Path(inspect.getfile(type(self.task))).resolve()  # a dropped-in task may live elsewhere
        for f in sorted({*root.glob("bench/**/*.py"), *root.glob("tasks/*.py"), task_file}):
            h.update(f.read_bytes())
        for lib in ("torch", "transformers", "vllm"):
            code.append(str(getattr(sys.modules.get(lib), "__version__", None)))
        ignored = self.START_EVAL_IGNORES
        flat = flatten(dataclasses.asdict(self.cfg))
        cfg = {k: v for k, v in flat.items() if not any(k == i or k.startswith(f"{i}.") for i in ignored)}
        key = json.dumps({"cfg": cfg, "weights": h.hexdigest(), "code": code}, sort_keys=True, default=str)
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    def tag_run(self, tags: dict[str, str]) -> None:
        for logger in self.loggers:
            if getattr(logger, "run_id", None) and hasattr(logger, "experiment"):
                for k, v in tags.items():
                    logger.experiment.set_tag(logger.run_id, k, v)

    def _generations(self, examples: list, group: int, temperature: float, *, tag: tuple = (), rollout: bool = False):
        """Yield (first index, problems, decoded completions, lengths, results) chunk by chunk, ``eval.batch_size``
        completions a chunk; ``group`` completions per problem, each problem's sampler seeded by (run seed, ``tag``,
        uid) so its samples do not depend on the batch layout (``tag`` defaults to ("eval", group)). top_p and the
        token budget are the evaluation's, or with ``rollout`` the rollout's. ``results``: None (the caller scores
        the texts with ``Task.reward``), or for an environment task each episode's return and components; its
        episodes are reset by (``tag``'s first part, uid) alone, so every run meets the same worlds."""
        e, r = self.cfg.eval, self.cfg.rollout
        tag = tag or ("eval", group)
        top_p, budget = (r.top_p, r.max_new_tokens) if rollout else (e.top_p, e.max_new_tokens or r.max_new_tokens)
        per_chunk = max(1, e.batch_size // group)
        sampler, brancher = (partial(generate, self.policy), partial(branch, self.policy)) if rollout else (
            self.eval_sampler(), self.eval_brancher())  # fmt: skip
        for start in range(0, len(examples), per_chunk):
            if not rollout:
                self.stop_if_terminated_at_start()
            chunk = examples[start : start + per_chunk]
            batch = self.task.collate_prompts(chunk)
            seeds = [sample_seed(self.cfg.seed, *tag, ex.uid) for ex in chunk]
            args = (batch["prompt_ids"].to(self.device), batch["prompt_mask"].to(self.device))
            kw = self.sampling_args(temperature, top_p if temperature > 0 else 1.0)
            if self.task.is_environment:
                env_seeds = [sample_seed(tag[0], "env", ex.uid) for ex in chunk]
                ep = self.episodes(chunk, *args, group, seeds, env_seeds, sampler, brancher, budget, kw)
                yield (
                    start,
                    chunk,
                    self.decode(ep.completion_ids, ep.mask),
                    ep.loss_mask.sum(1).long().tolist(),
                    ep.results(),
                )
                continue
            gen = sampler(*args, group_size=group, max_new_tokens=budget, seeds=seeds, **kw)
            yield start, chunk, self.decode(gen.completion_ids, gen.mask), gen.lengths.tolist(), None

    def stop_if_terminated_at_start(self) -> None:
        """A SIGTERM during the evaluation before the first step (a warm start's takes minutes) stops the run between
        two of its chunks, as Lightning's own evaluation loop stops between batches, not when the evaluation ends.
        Only there: the resumed run evaluates its start again, so nothing is lost, while a stop inside a later
        evaluation would leave its step unevaluated (that one finishes, and the run stops at the next step). One
        process only: on several, the ranks agree on a SIGTERM at a step's start (bench.run.train._Interrupted)."""
        t = self._trainer
        if t is not None and self.step_count == 0 and t.world_size == 1 and t.received_sigterm:
            raise SIGTERMException()

    def sampling_args(self, temperature: float, top_p: float) -> dict:
        """The engines' sampling keywords besides the prompts, the budget and the seeds."""
        r = self.cfg.rollout
        return {"temperature": temperature, "top_p": top_p, "eos_token_id": self.tokenizer.eos_token_id,
                "pad_token_id": self.tokenizer.pad_token_id, "share_prompt_cache": r.share_prompt_cache,
                "compact_finished": r.compact_finished, "static_cache": r.static_cache}  # fmt: skip

    def episodes(self, examples, prompt_ids, prompt_mask, group, seeds, env_seeds, sampler, brancher, budget, kw):
        """Episodes of an environment task (bench/engine/episode.py): turn 1 from ``sampler`` (an engine's
        ``generate``), the next turns from ``brancher`` (its ``branch``), within ``rollout.max_turns`` and
        ``rollout.turn_tokens`` and ``budget`` tokens an episode."""
        r = self.cfg.rollout
        return run_episodes(
            self.task, self.tokenizer, examples, group,
            lambda n: sampler(prompt_ids, prompt_mask, group_size=group, max_new_tokens=n, seeds=seeds, **kw),
            lambda *a, **k: brancher(*a, **k, **kw),
            prompt_ids=prompt_ids.repeat_interleave(group, 0), prompt_mask=prompt_mask.repeat_interleave(group, 0),
            seeds=seeds, env_seeds=env_seeds, max_turns=r.max_turns, turn_tokens=r.turn_tokens, budget=budget,
        )  # fmt: skip

    def eval_sampler(self):
        """What generates the evaluation's completions (bench.engine.rollout.generate's signature, without the
        model): the hf loop over the policy."""
        return partial(generate, self.policy)

    def eval_brancher(self):
        """What continues the evaluation's episodes (bench.engine.rollout.branch's signature, without the model)."""
        return partial(branch, self.policy)

    def decode(self, completion_ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
        ids = [row[m.bool()].tolist() for row, m in zip(completion_ids.cpu(), mask.cpu(), strict=True)]
        return self.tokenizer.batch_decode(ids, skip_special_tokens=True)


class RLModule(PolicyModule):
    """Manual optimisation. Subclasses implement ``advantages(rollout)`` and ``loss(rows, logp, norm)``."""

    sums_gradients = True  # the losses divide by the global batch's denominators (bench/dist.py)

    def configure_model(self) -> None:
        if self.device_mesh is not None:
            self.behaviour.prepare(self.policy)  # the hf engine's behaviour copy, made whole before FSDP shards
        super().configure_model()

    def __init__(self, cfg, policy, tokenizer, task):
        super().__init__(cfg, policy, tokenizer, task)
        self.automatic_optimization = False
        self.samples_seen = 0
        self.tokens_generated = 0
        self.nonfinite_skipped = 0
        self.extra_tokens = 0  # tokens generated this step outside the trained groups (e.g. ReMax's greedy baseline)
        self.extra_samples = 0  # samples generated this step outside the trained groups (VinePPO's continuations)
        self.timer: dict[str, float] = defaultdict(float)
        self.step_stats: dict[str, float] = {}  # diagnostics a hook computed this step (e.g. advantage statistics)
        self.episode_counts: dict[str, float] = defaultdict(float)  # episode_sums of this step's episodes
        self.sampler_logp_ok: bool | None = None  # rollout.logp_from_sampler: the first step's check (None: not yet)
        r = cfg.rollout
        engine = self.make_engine if r.engine == "vllm" else None
        self.behaviour = BehaviourPolicy(r.sampler_dtype, r.staleness, r.sampler_attention, engine)
        if self.hf_only:
            self.require_hf_engine(self.hf_only)
        self.loss_calls = 0  # loss() calls this step (seeds a trust region's random choices per micro-batch)

    # ---- what an algorithm declares ------------------------------------------------------------------------------
    hf_only: str | None = None
    """What the algorithm samples that only the hf engine serves (e.g. "grows its rollouts as trees"): then
    ``rollout.engine`` other than hf fails at start-up with this reason."""

    def advantages(self, rollout: Rollout) -> torch.Tensor:
        raise NotImplementedError

    def loss(self, rows: dict[str, torch.Tensor], logp: torch.Tensor, norm: Norm):
        """-> (scalar loss for these rows, already divided by the step's denominators in ``norm``; dict of stats)."""
        raise NotImplementedError

    # ---- the step -----------------------------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["bench"].update(
            samples_seen=self.samples_seen,
            tokens_generated=self.tokens_generated,
            nonfinite_skipped=self.nonfinite_skipped,
        )
        if not self.behaviour.is_policy:
            checkpoint["bench"]["behaviour"] = self.behaviour.state_dict()
        if self.task.prompt_pool is not None:
            checkpoint["bench"]["prompt_pool"] = [ex.uid for ex in self.task.prompt_pool]

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        state = checkpoint["bench"]
        self.samples_seen, self.tokens_generated = state["samples_seen"], state["tokens_generated"]
        self.nonfinite_skipped = state["nonfinite_skipped"]
        if "behaviour" in state:
            self.behaviour.load_state_dict(state["behaviour"], self.device)
        if "prompt_pool" in state:
            by_uid = {ex.uid: ex for ex in self.task.examples("train")}
            self.task.prompt_pool = [by_uid[uid] for uid in state["prompt_pool"]]

    # ---- hooks with defaults (the critic-free family in bench/rl/objective.py overrides them from its choices) -------
    max_sampling_rounds: int = 1
    """Generation rounds per step when ``keep_groups`` drops groups (1: no resampling)."""

    @property
    def forward_switches(self) -> dict[str, bool]:
        """Speed switches of the training forward (bench.engine.policy.completion_logprobs): same values, less work."""
        t = self.cfg.train
        return {"trim": t.trim_padding, "share_prompt": t.share_prompt_forward}

    @property
    def zero_adv_rows_inert(self) -> bool:
        """Whether a row whose advantage is 0 at every token contributes exactly 0 to the loss and its gradient (no KL
        or other term in the loss): ``train.skip_zero_adv`` then skips its forward and backward."""
        return False

    @property
    def needs_greedy_baseline(self) -> bool:
        """Score one greedy completion per prompt into ``rollout.baseline`` (ReMax)."""
        return False

    @property
    def reads_old_logp_before_update(self) -> bool:
        """Whether anything before the update (rewards, advantages, corrections, a critic) reads log π_old; if not,
        ``train.old_logp_from_update`` may take it from the update's own forward."""
        return True

    def behaviour_rows(self, rows: dict[str, torch.Tensor]) -> dict[str, float]:
        """With log π_old taken from the update's forward (``rows["old_logp"]`` just set): what ``correct_behaviour``
        would have put on these rows (e.g. ``rows["is_weight"]``); -> their statistics (token-weighted means)."""
        return {}

    def keep_groups(self, ro: Rollout) -> torch.Tensor | None:
        """[P] bool: groups to train on; None keeps all. Dropped groups are replaced by freshly sampled prompts."""
        return None

    def correct_behaviour(self, ro: Rollout) -> None:
        """Set ``ro.is_weight`` [B, T] from ``ro.old_logp`` (the learner's) and ``ro.sampler_logp`` (μ); None: none."""

    def shape_rewards(self, ro: Rollout) -> None:
        """Set ``ro.rewards`` [B] and ``ro.token_rewards`` [B, T] from ``ro.scores`` (after log-probs are known)."""
        ro.rewards = ro.scores
        ro.token_rewards = terminal_rewards(ro.scores, ro.mask)

    def on_train_start(self) -> None:
        model = self.trainer.strategy.model
        if model is not self and hasattr(model, "require_backward_grad_sync"):
            # DDP's own gradient hooks stay off: the step sums the gradients itself once a step's micro-batches are
            # done (bench/dist.py), so ranks may run different numbers of micro-batches
            model.require_backward_grad_sync = False
        super().on_train_start()

    def distributed_blockers(self, world: int) -> list[str]:
        r, out = self.cfg.rollout, []
        if r.prompts_per_step % world:
            out.append(f"rollout.prompts_per_step={r.prompts_per_step} must divide by them (each rank takes whole "
                       f"groups of P / {world} prompts).")  # fmt: skip
        if r.prompt_pool == "solvable":
            out.append("rollout.prompt_pool=solvable screens on one process for now: use prompt_pool=all.")
        return out

    # ---- the prompts ------------------------------------------------------------------------------------------------
    def on_fit_start(self) -> None:
        # After the policy is on its device, before the dataloader is built; a resumed run has its pool back from the
        # checkpoint (on_load_checkpoint) and is not screened again.
        if self.cfg.rollout.prompt_pool == "solvable" and self.task.prompt_pool is None:
            self.task.prompt_pool = self.solvable_prompts()
            for logger in self.loggers:
                logger.log_hyperparams(self.pool_stats)

    @torch.no_grad()
    def solvable_prompts(self) -> list:
        """``rollout.prompt_pool=solvable``: the screened train problems the starting policy answers right at least once
        in ``pool_samples`` completions (each problem's sampler seeded by (run seed, "pool", uid); ``eval.batch_size``
        completions a batch), in screening order. The screening's samples and tokens are added to the run's budget."""
        r = self.cfg.rollout
        k = r.pool_samples
        train = self.task.examples("train")
        screened = random.Random(f"pool-{self.cfg.seed}").sample(train, min(r.pool_screened or len(train), len(train)))
        kept, t0, was_training = [], time.perf_counter(), self.policy.training
        self.policy.eval()
        for _, chunk, texts, lengths, scored in self._generations(
            screened, k, r.temperature, tag=("pool",), rollout=True
        ):
            for i, ex in enumerate(chunk):
                results = scored[i * k : (i + 1) * k] if scored else [
                    self.task.reward(ex, t) for t in texts[i * k : (i + 1) * k]]  # fmt: skip
                if any(self.task.is_correct(res) for res in results):
                    kept.append(ex)
            self.samples_seen += len(texts)
            self.tokens_generated += sum(lengths)
        self.policy.train(was_training)
        if len(kept) < r.prompts_per_step:
            raise ValueError(
                f"rollout.prompt_pool=solvable: the starting policy answered {len(kept)} of {len(screened)} screened "
                f"train prompts right in {k} samples, fewer than rollout.prompts_per_step={r.prompts_per_step}; "
                "raise rollout.pool_screened or rollout.pool_samples, or use rollout.prompt_pool=all"
            )
        self.pool_stats = {
            "data/pool_screened": len(screened),
            "data/pool_kept": len(kept),
            "data/pool_seconds": round(time.perf_counter() - t0, 1),
        }
        return kept

    # ---- the step -----------------------------------------------------------------------------------------------
    def make_rollout(self, batch: dict, round: int = 0) -> Rollout:
        r = self.cfg.rollout
        G = r.group_size
        P = len(batch["examples"])
        # Seeds depend on (run seed, step, [resampling round,] position in the step's batch); the batch itself is a
        # pure function of (seed, step), so a run and its resumption sample identical completions.
        key = (self.step_count,) if round == 0 else (self.step_count, "round", round)
        first = batch.get("first", 0)  # the global index of this rank's first prompt (bench/dist.py)
        seeds = [sample_seed(self.cfg.seed, *key, first + p) for p in range(P)]
        t0 = time.perf_counter()
        episodes = self.task.is_environment
        gen = self.play(batch, seeds, key, first) if episodes else self.sample(batch, G, r.temperature, seeds)
        ro = Rollout(
            examples=batch["examples"],
            prompt_ids=batch["prompt_ids"].repeat_interleave(G, 0),
            prompt_mask=batch["prompt_mask"].repeat_interleave(G, 0),
            completion_ids=gen.completion_ids,
            mask=gen.mask,
            sampler_logp=gen.sampler_logp,
            lengths=gen.lengths,
            truncated=gen.truncated,
            texts=self.decode(gen.completion_ids, gen.mask),
            group_size=G,
            row_key=(round * batch.get("total", P) + first) * G + torch.arange(P * G, device=self.device),
            **(gen.rollout_fields() if episodes else {}),
        )
        t1 = time.perf_counter()
        if episodes:  # scored turn by turn while they were played
            self.set_scores(ro, gen.results())
            for k, v in episode_sums(gen).items():  # every round's, summed over ranks in training_step
                self.episode_counts[k] += v
        else:
            self.score(ro)
        self.timer["generation"] += t1 - t0
        self.timer["scoring"] += time.perf_counter() - t1
        if self.needs_greedy_baseline:
            t0 = time.perf_counter()
            greedy = self.sample(batch, 1, 0.0, seeds)
            t1 = time.perf_counter()
            texts = self.decode(greedy.completion_ids, greedy.mask)
            base = [self.task.reward(ex, t).score for ex, t in zip(batch["examples"], texts, strict=True)]
            ro.baseline = torch.tensor(base, device=self.device).repeat_interleave(G)
            self.extra_tokens += int(greedy.lengths.sum())
            self.timer["generation"] += t1 - t0
            self.timer["scoring"] += time.perf_counter() - t1
        return ro

    def play(self, batch: dict, seeds: list[int], key: tuple, first: int) -> Episodes:
        """An environment task's rollout: G episodes per prompt from the behaviour policy (its engine's ``generate``
        for turn 1, ``branch`` for the next), the G episodes of a prompt reset with one seed (by run seed, step and
        the prompt's global index)."""
        r = self.cfg.rollout
        env_seeds = [sample_seed(self.cfg.seed, *key, "env", first + p) for p in range(len(batch["examples"]))]
        was_training = self.policy.training
        self.policy.eval()
        try:
            return self.episodes(
                batch["examples"], batch["prompt_ids"], batch["prompt_mask"], r.group_size, seeds, env_seeds,
                partial(self.behaviour.generate, self.policy, self.step_count),
                partial(self.behaviour.branch, self.policy, self.step_count),
                r.max_new_tokens, self.sampling_args(r.temperature, r.top_p),
            )  # fmt: skip
        finally:
            self.policy.train(was_training)

    def eval_engine(self):
        """``eval.engine=rollout`` with an engine: the engine, sent the policy's current weights first; else None."""
        return self.behaviour.current(self.policy, self.step_count) if self.cfg.eval.engine == "rollout" else None

    def eval_sampler(self):
        engine = self.eval_engine()
        return super().eval_sampler() if engine is None else engine.generate

    def eval_brancher(self):
        engine = self.eval_engine()
        return super().eval_brancher() if engine is None else engine.branch

    def make_engine(self, policy):
        """The vLLM engine of ``rollout.engine=vllm`` (bench/engine/vllm.py), built from ``policy`` in the run's
        directory (or the cache directory), in ``rollout.sampler_dtype``."""
        import tempfile

        from bench.engine.vllm import VLLMEngine

        r = self.cfg.rollout
        where = self.checkpoint_path.parent.parent if self.checkpoint_path else Path(tempfile.mkdtemp(prefix="engine-"))
        context = self.engine_context(policy)
        folder = where / "engine" if dist.world() == 1 else where / "engine" / f"rank{dist.rank()}"  # one per rank
        engine = VLLMEngine(policy, folder, dtype=r.sampler_dtype, max_model_len=context, seed=self.cfg.seed,
                            gpu_memory=r.engine_gpu_memory, cpu_kv_gb=r.engine_cpu_kv_gb)  # fmt: skip
        devices = ",".join(dist.gather_objects(engine.device))  # each rank's engine's device, in rank order
        for logger in self.loggers:
            # measurements are metrics (at the step the engine started): a resumed run starts a new engine, and
            # MLflow refuses a param whose value changes; where the engines run is a param
            logger.log_hyperparams({"engine/devices": devices})
            logger.log_metrics({"engine/start_s": round(engine.start_s, 1), **engine.memory()}, step=self.step_count)
        return engine

    def engine_context(self, policy) -> int:
        """The engine's context: the task's longest prompt plus the largest token budget (rollout, evaluation), within
        the loaded model's own ``max_position_embeddings``; a start-up error naming the numbers when it cannot fit."""
        from bench.config import ConfigError

        base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
        limit = int(getattr(base.config, "max_position_embeddings", None) or ENGINE_MAX_LEN)
        budget = max(self.cfg.rollout.max_new_tokens, self.cfg.eval.max_new_tokens or 0)
        prompt = self.task.longest_prompt()
        if prompt + budget > limit:
            raise ConfigError(
                f"rollout.engine=vllm: the task's longest prompt ({prompt} tokens) plus the token budget ({budget}: "
                f"rollout.max_new_tokens / eval.max_new_tokens) is {prompt + budget} tokens, more than the model's "
                f"context ({limit}, its max_position_embeddings). Lower the budget, shorten the prompts (the task's "
                "options), or use a model with a longer context."
            )
        return prompt + budget

    def sample(self, batch: dict, group_size: int, temperature: float, seeds: list[int], model=None):
        """G completions per prompt from the behaviour policy (the policy itself unless rollout.sampler_dtype,
        rollout.staleness or rollout.engine say otherwise), or from ``model`` (e.g. the reference: always the hf
        engine, which the frozen reference needs no weight pushes for)."""
        r = self.cfg.rollout
        was_training = self.policy.training
        self.policy.eval()
        sampler = partial(self.behaviour.generate, self.policy, self.step_count) if model is None else partial(
            generate, model)  # fmt: skip
        gen = sampler(
            batch["prompt_ids"],
            batch["prompt_mask"],
            group_size=group_size,
            max_new_tokens=r.max_new_tokens,
            temperature=temperature,
            top_p=r.top_p,
            eos_token_id=self.tokenizer.eos_token_id,
            pad_token_id=self.tokenizer.pad_token_id,
            seeds=seeds,
            share_prompt_cache=r.share_prompt_cache,
            compact_finished=r.compact_finished,
            static_cache=r.static_cache,
        )
        self.policy.train(was_training)
        return gen

    def branch(self, *args, **kw) -> Generation:
        """Continuations from prefixes of this step's completions (bench.engine.rollout.branch's arguments without the
        model), from the step's behaviour policy: the policy itself (or its copy) on the hf engine, the vLLM engine
        under rollout.engine=vllm. The caller counts them (extra_samples, extra_tokens)."""
        was_training = self.policy.training
        self.policy.eval()
        try:
            return self.behaviour.branch(self.policy, self.step_count, *args, **kw)
        finally:
            self.policy.train(was_training)

    def score(self, ro: Rollout) -> None:
        G = ro.group_size
        if self.task.is_environment:
            raise NotImplementedError(
                f"algorithm {self.cfg.algorithm.name!r} scores completions it generates itself as one-turn text "
                f"(Task.reward), which environment task {self.task.cfg.name!r} does not have: choose an algorithm "
                "whose rollouts are the step's episodes (docs/environments.md)"
            )
        self.set_scores(ro, [self.task.reward(ro.examples[i // G], text) for i, text in enumerate(ro.texts)])
        if self.needs_process_rewards:
            steps = [self.task.process_rewards(ro.examples[i // G], text) for i, text in enumerate(ro.texts)]
            decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731  (as in decode())
            ro.step_rewards, ro.step_ends = step_token_rewards(steps, ro.completion_ids, ro.mask, decode)

    def set_scores(self, ro: Rollout, results: list[RewardResult]) -> None:
        """``ro.scores``, ``correct`` and ``components`` from one result per row."""
        ro.scores = torch.tensor([res.score for res in results], dtype=torch.float32, device=self.device)
        ro.correct = torch.tensor([self.task.is_correct(res) for res in results], device=self.device)
        names = sorted({k for res in results for k in res.components})
        ro.components = {k: torch.tensor([float(res.components.get(k, 0.0)) for res in results], device=self.device)
                         for k in names}  # fmt: skip

    @staticmethod
    def local_prompts(batch: dict) -> dict:
        """This rank's contiguous share of the step's global prompt batch (whole groups: a group never spans ranks),
        with the global index of its first prompt and the global count, which seed its samples and order its rows."""
        n = len(batch["examples"])
        part = dist.part(n)
        return {**{k: v[part] for k, v in batch.items()}, "first": part.start, "total": n}

    def collect(self, batch: dict) -> tuple[Rollout, dict[str, float], Rollout]:
        """Generate and score P groups; with a group filter (DAPO's dynamic sampling), keep sampling fresh prompts
        until P groups pass or ``max_sampling_rounds`` is reached. Every generated token counts towards the cost.
        On several ranks each samples its share of every round's prompts, and the groups kept are the first passing
        ones in the global order, as on one process; the returned rollouts are this rank's."""
        P = len(batch["examples"])
        parts, kept, generated, rounds = [], 0, [], 0
        while kept < P and rounds < self.max_sampling_rounds:
            if rounds > 0:
                batch = self.trainer.datamodule.transfer_batch_to_device(
                    self.task.sample_prompts(P, (self.cfg.seed, self.step_count, rounds)), self.device, 0
                )
            local = self.local_prompts(batch)
            ro = self.make_rollout(local, rounds)
            generated.append(ro)
            keep = self.keep_groups(ro)
            if keep is not None:
                every, _ = dist.gather_rows(keep)  # the global round's decisions, in prompt order
                every = every & (every.cumsum(0) <= P - kept)  # never more than P groups in all
                kept += int(every.sum())
                ro = ro.select_groups(every[dist.part(P)])
            else:
                kept += P
            parts.append(ro)
            rounds += 1
        ro = Rollout.concat(parts)
        everything = Rollout.concat(generated)
        return ro, {"rollout/sampling_rounds": rounds, "rollout/groups_kept": kept}, everything

    def old_logp_deferred(self, batch_rows: int) -> bool:
        """``train.old_logp_from_update`` applies: the sampler is not the learner, one optimizer step over the rollout,
        no entropy of π_old, and nothing reads log π_old before the update."""
        t = self.cfg.train
        one_step = t.ppo_epochs == 1 and (t.minibatch_size is None or t.minibatch_size >= batch_rows)
        mismatch = not self.behaviour.is_policy  # else the sampler's own log-probs stand in (logp_from_sampler)
        return (
            t.old_logp_from_update
            and mismatch
            and one_step
            and not self.needs_entropy
            and not self.reads_old_logp_before_update
        )

    @torch.no_grad()
    def behaviour_logprobs(self, ro: Rollout) -> None:
        """log π_old from one batched training-mode forward (the sampler's log-probs are kept to log the gap), or,
        with ``rollout.logp_from_sampler``, the sampler's own log-probs once the first step has checked that they
        match that forward within ``rollout.logp_tolerance``; log π_ref only when the algorithm needs it."""
        mb = self.cfg.train.micro_batch_size
        r = self.cfg.rollout
        use_sampler = not self.needs_old_logp or (
            r.logp_from_sampler and self.sampler_logp_ok is True and not self.needs_entropy and self.behaviour.is_policy
        )
        deferred = not use_sampler and self.old_logp_deferred(ro.size)  # the update's own forward gives log π_old
        old, ref, ent = [], [], []
        for idx in torch.arange(ro.size, device=self.device).split(mb):
            args = (ro.prompt_ids[idx], ro.prompt_mask[idx], ro.completion_ids[idx], ro.mask[idx], r.temperature)
            if not use_sampler and not deferred:
                logp, entropy = completion_logprobs(
                    self.policy, *args, with_entropy=self.needs_entropy, **self.forward_switches
                )
                old.append(logp)
                ent.append(entropy)
            if self.needs_reference:
                with self.reference.model() as ref_model:
                    ref.append(completion_logprobs(ref_model, *args, **self.forward_switches)[0])
        ro.ref_logp = torch.cat(ref) if ref else None
        if deferred:
            ro.old_logp = None
            return
        if use_sampler:
            ro.old_logp = ro.sampler_logp
            return
        ro.old_logp = torch.cat(old)
        ro.entropy = torch.cat(ent) if self.needs_entropy else None
        if r.logp_from_sampler and self.sampler_logp_ok is None and self.behaviour.is_policy:  # does μ match π_old?
            gap = float(((ro.sampler_logp - ro.old_logp).abs() * ro.train_mask).max())
            self.sampler_logp_ok = gap <= r.logp_tolerance
            if not self.sampler_logp_ok:
                rank_zero_warn(
                    f"rollout.logp_from_sampler: sampler/trainer log-prob gap {gap:.2e} > rollout.logp_tolerance="
                    f"{r.logp_tolerance:g}; log π_old keeps coming from the training forward"
                )

    def training_step(self, batch: dict, batch_idx: int):
        t0 = time.perf_counter()
        dist.take_collective_s()  # count this step's collectives only (not the evaluation's before it)
        self.extra_tokens = 0
        self.extra_samples = 0  # samples generated this step outside the trained groups (e.g. VinePPO's continuations)
        self.timer = defaultdict(float)
        self.step_stats = {}
        self.episode_counts = defaultdict(float)
        self.loss_calls = 0
        stats: dict[str, float] = {}
        with dist.full_weights(self.policy):  # FSDP: each rank's own rollout forwards run on the whole weights
            ro, collect_stats, everything = self.collect(batch)
            t1 = time.perf_counter()
            if ro.size > 0:  # per row, where the rows are (on several ranks: this rank's)
                self.behaviour_logprobs(ro)
            # On several ranks every rank now holds the global batch, and what follows reads batch-wide statistics
            # exactly as one process does; the update runs forward and backward on this rank's rows only (ro.owned).
            ro, everything = ro.gather(), everything.gather()
            if ro.size > 0:
                self.correct_behaviour(ro)
                self.shape_rewards(ro)
                ro.adv = self.advantages(ro)
        if ro.size > 0:
            stats = self.update(ro)
        t2 = time.perf_counter()
        self.extra_tokens = int(dist.sum_floats(self.extra_tokens)[0])
        self.samples_seen += everything.size + int(dist.sum_floats(self.extra_samples)[0])
        self.tokens_generated += int(everything.generated_tokens.sum())
        collect_stats |= {"rollout/generated_samples": everything.size,
                          "rollout/generated_tokens": int(everything.generated_tokens.sum())}  # fmt: skip
        self.tokens_generated += self.extra_tokens
        G = ro.group_size
        # reward/ and rollout/ statistics describe every generated sample (what the policy did), not only the kept ones
        m = {
            "reward/mean": everything.scores.mean(),
            "reward/std": everything.scores.std() if everything.size > 1 else 0.0,
            "rollout/accuracy": everything.correct.float().mean(),
            "rollout/completion_len_mean": everything.lengths.float().mean(),
            "rollout/completion_len_max": everything.lengths.max(),
            "rollout/truncated_frac": everything.truncated.float().mean(),
            "rollout/zero_var_group_frac": zero_variance_groups(everything.scores, G).float().mean(),
            "rollout/samples_seen": self.samples_seen,
            "rollout/tokens_generated": self.tokens_generated,
            "rollout/trained_samples": ro.size,
            "stats/nonfinite_skipped": self.nonfinite_skipped,
            "time/generation": self.timer["generation"],
            "time/scoring": self.timer["scoring"],
            "time/update": t2 - t1,
            "time/step": t2 - t0,
        }
        if dist.active():  # this rank's seconds in the step's collectives (gathers, gradient all-reduce, sums)
            m["time/collectives"] = dist.take_collective_s()
        if self.behaviour.engine is not None:  # rollout.engine=vllm: the weight pushes and what the engine holds
            m["time/weight_sync"], self.behaviour.sync_s = self.behaviour.sync_s, 0.0
            m.update(self.behaviour.engine.memory())
        if ro.size > 0:
            m["reward/shaped_mean"] = ro.rewards.mean()
        if ro.size > 0 and ro.old_logp is not None and ro.old_logp is not ro.sampler_logp:  # from the sampler: 0
            m["rollout/sampler_logp_gap_max"] = ((ro.sampler_logp - ro.old_logp).abs() * ro.train_mask).max()
        m.update({f"reward/{k}": v.mean() for k, v in everything.components.items()})
        m.update(collect_stats)
        if self.episode_counts:  # an environment task: its episodes' statistics over every rank's
            m.update(episode_metrics(dist.sum_dict(dict(self.episode_counts))))
        m.update(stats)
        m.update(self.step_stats)
        self.log_metrics(m)
        self.log("reward", float(everything.scores.mean()), prog_bar=True, logger=False)
        self.log("acc", float(everything.correct.float().mean()), prog_bar=True, logger=False)

    def update(self, ro: Rollout) -> dict[str, float]:
        """ppo_epochs passes; each minibatch is one optimizer step whose loss denominators cover the whole
        minibatch, so splitting it into micro-batches (gradient accumulation) leaves the loss unchanged.

        The speed switches keep the update: ``train.skip_zero_adv`` leaves out rows that add exactly 0 to the loss
        and gradient (the denominators still count them); ``train.share_prompt_forward`` keeps a group's rows side by
        side so a micro-batch runs each prompt once; otherwise ``train.trim_padding`` orders rows by length before
        cutting micro-batches, so each is trimmed to little padding."""
        t, r = self.cfg.train, self.cfg.rollout
        opt, sched = self.optimizers(), self.lr_schedulers()
        params = [p for p in self.policy.parameters() if p.requires_grad]
        synced = [p for group in opt.param_groups for p in group["params"]]  # the critic's too (actor-critic)
        B = ro.size
        # [B] rows that can carry a gradient: on several ranks only this rank's (the global batch is on every rank,
        # the denominators below are the global batch's, the gradients are summed over ranks before clipping)
        active = torch.ones(B, dtype=torch.bool, device=self.device) if ro.owned is None else ro.owned.clone()
        if t.skip_zero_adv and self.zero_adv_rows_inert:
            nonzero = ro.adv != 0
            active &= (nonzero & ro.train_mask.bool()).any(1) if ro.adv.dim() == 2 else nonzero
        sharded = dist.sharded(self.policy)
        mb_size = t.minibatch_size or B
        assert B % mb_size == 0, f"rollout batch {B} is not divisible by train.minibatch_size={mb_size}"
        sums: dict[str, float] = defaultdict(float)
        n_steps = 0
        gen = torch.Generator().manual_seed(sample_seed(self.cfg.seed, self.step_count, "minibatches"))
        for _ in range(t.ppo_epochs):
            order = torch.randperm(B, generator=gen) if mb_size < B else torch.arange(B)  # host: row order (an index)
            for mb in order.to(self.device).split(mb_size):
                norm = Norm.of(ro.train_mask[mb], budget=r.max_new_tokens, groups=mb // ro.group_size)
                opt.zero_grad(set_to_none=True)
                finite = True
                step_stats: dict[str, float] = defaultdict(float)
                fwd = mb[active[mb]]  # rows to run forward and backward
                if t.share_prompt_forward:  # a group's rows side by side, so a micro-batch holds whole groups
                    fwd = fwd.sort().values
                elif t.trim_padding:
                    fwd = fwd[ro.mask[fwd].sum(1).argsort(descending=True, stable=True)]
                fwd_tokens = max(dist.sum_floats(float(ro.train_mask[fwd].sum()))[0], 1.0)  # all ranks' rows run
                micros = dist.lockstep(list(fwd.split(t.micro_batch_size)) if len(fwd) else [], mb[:1], sharded)
                if not micros:  # no row carries a gradient: step on zeros, as the full step would
                    for p in params:
                        p.grad = torch.zeros_like(p)
                    step_stats["loss/total"] = 0.0
                for micro, weight in micros:
                    rows = ro.rows(micro)
                    deferred = "old_logp" not in rows
                    logp, entropy = completion_logprobs(
                        self.policy,
                        rows["prompt_ids"],
                        rows["prompt_mask"],
                        rows["completion_ids"],
                        rows["completion_mask"],
                        r.temperature,
                        with_entropy=True,
                        **self.forward_switches,
                    )
                    if deferred:  # π_old is the policy this single update starts from: its forward, detached
                        rows["old_logp"] = logp.detach()
                    extra = self.behaviour_rows(rows) if deferred else {}
                    loss, stats = self.loss(rows, logp, norm)
                    stats = {**extra, **stats}
                    if weight and not torch.isfinite(loss):
                        finite = False
                        if not sharded:  # under FSDP the other ranks' backward needs this one's: the step is skipped
                            break
                    self.manual_backward(loss * weight)
                    if not weight:
                        continue
                    w = float(rows["mask"].sum()) / fwd_tokens  # token-weighted average over the rows run
                    step_stats["loss/total"] += float(loss.detach())
                    step_stats["stats/entropy"] += w * float(
                        (entropy * rows["mask"]).sum() / rows["mask"].sum().clamp(min=1)
                    )
                    for k, v in stats.items():
                        step_stats[k] += w * float(v)
                finite = not dist.any_rank(not finite)
                if finite:
                    dist.all_reduce_grads(synced)
                    keys = sorted(step_stats)
                    step_stats = defaultdict(
                        float, zip(keys, dist.sum_floats(*(step_stats[k] for k in keys)), strict=True)
                    )
                grad_norm = dist.local(torch.nn.utils.clip_grad_norm_(params, self.cfg.optim.max_grad_norm))
                if not finite or not torch.isfinite(grad_norm):
                    # Non-finite loss or gradient: skip this update, count it, continue.
                    opt.zero_grad(set_to_none=True)
                    self.nonfinite_skipped += 1
                    continue
                opt.step()
                sched.step()
                n_steps += 1
                step_stats["stats/grad_norm"] = float(grad_norm)
                for k, v in step_stats.items():
                    sums[k] += v
        out = {k: v / max(n_steps, 1) for k, v in sums.items()}
        out["stats/lr"] = sched.get_last_lr()[0]
        out["stats/optimizer_steps"] = n_steps
        return out
