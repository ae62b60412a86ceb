"""The task contract: a LightningDataModule with a verifiable reward.

A task file in ``tasks/`` defines one subclass of :class:`Task` (file stem == registry name). It supplies
``Example`` records for train/val/test, renders prompts, scores completions with a pure ``reward`` and, where its
data has them, demonstrations for SFT. Shared code never asks which task it is; it reads what the class declares.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import lightning as L
import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, IterableDataset

from bench.engine.episode import Turn

Split = Literal["train", "val", "test"]


HUB_PROBE_S = 3.0
"""How long the hub's host may take to accept a TCP connection before the hub counts as unreachable."""
_HUB_PROBED: list[BaseException | None] = []


def hub_unreachable() -> BaseException | None:
    """None when the Hugging Face hub's host (HF_ENDPOINT, default huggingface.co) accepts a connection within
    HUB_PROBE_S, or when an offline mode is set (the local cache is read); else the error, remembered for the rest of
    the process."""
    import os
    import socket
    from urllib.parse import urlparse

    if any(
        os.environ.get(k, "").lower() in ("1", "true", "yes", "on") for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    ):
        return None
    if not _HUB_PROBED:
        url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
        host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
        try:
            socket.create_connection((host, port), timeout=HUB_PROBE_S).close()
            _HUB_PROBED.append(None)
        except OSError as e:
            _HUB_PROBED.append(ConnectionError(f"{host}:{port} did not accept a connection within {HUB_PROBE_S:g} s "
                                               f"({type(e).__name__}: {e})"))  # fmt: skip
    return _HUB_PROBED[0]


def hash_unit(*parts) -> float:
    """A stable number in [0, 1) from ``parts`` joined by "/" (hashlib, not hash(), which is salted per process): the
    generated tasks' splits and hash-chosen shares."""
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:8], "big") / 2**64


@dataclass(frozen=True)
class Example:
    """One problem. ``answer`` is the gold answer in whatever form the task's reward reads; ``data`` holds the rest."""

    uid: str
    question: str
    answer: Any
    demonstration: str | None = None
    data: dict = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True)
class RewardResult:
    """Score of one completion. ``components`` are logged as ``reward/<name>``; ``info`` is free-form diagnostics."""

    score: float
    components: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class TaskConfig:
    """Fields every task has; a task extends this dataclass with its own fields."""

    name: str = "countdown"
    """Registry name of the task (file stem in tasks/)."""
    data_root: str | None = None
    """Root of local datasets; ``${oc.env:BENCH_DATA}`` by default (see conf/config.yaml)."""
    correct_threshold: float = 1.0
    """A completion counts as correct (accuracy, pass@1) when its score >= this threshold."""
    num_train: int | None = None
    """Cap on train examples (None: all)."""
    num_eval: int = 200
    """Size of the fixed held-out evaluation set (first N of the eval split, fixed order)."""
    eval_split: str = "test"
    """Split used for held-out evaluation: val or test."""


class Task(L.LightningDataModule):
    """Base DataModule. Subclasses set ``Config``, ``version`` and implement ``load_split``, ``instruction`` and
    ``reward``."""

    Config: ClassVar[type[TaskConfig]] = TaskConfig
    version: ClassVar[str] = "0"
    description: ClassVar[str] = ""
    hub_dataset: ClassVar[str | None] = None
    """Public hub dataset id the task can load from when online (named in missing-data errors)."""
    verified_component: ClassVar[str | None] = None
    """The reward component that is 1 when a completion got past the format checks to the verifier (a query that
    ran, an expression that parsed, a box math-verify was given); None when every completion reaches it (ROUGE).
    The contract's fuzz test must reach it with the well-formed answers it generates."""
    scan: ClassVar[tuple[Literal["head", "tail"], int] | None] = None
    """Where ``reward`` reads a completion, when it runs under no time limit of its own: ("head", n) its first n
    characters, ("tail", n) its last n. Nothing outside them changes the result, so that cap, not a timing, is what
    bounds the reward's work (the contract tests check it on hostile inputs). None: the reward enforces a time limit
    (a worker it kills, a query's deadline) and ``reward_time_bound_s`` says it."""
    rl_only: ClassVar[tuple[str, ...]] = ()
    """Config keys that change only what RL is rewarded with, not the demonstrations (chain's ``reward``): the SFT
    warm start is shared across their values, trained at their defaults (``sft_task``)."""

    def __init__(
        self,
        cfg: TaskConfig,
        tokenizer=None,
        *,
        seed: int = 0,
        prompts_per_step: int = 8,
        train_stream: Literal["prompts", "demonstrations"] = "prompts",
        batch_size: int = 8,
    ):
        super().__init__()
        self.cfg, self.tokenizer, self.seed = cfg, tokenizer, seed
        self.prompts_per_step, self.train_stream, self.batch_size = prompts_per_step, train_stream, batch_size
        self.start_step = 0  # set on resume so the prompt stream continues where it stopped
        # The train prompts RL draws from when not all of them (rollout.prompt_pool): set by the algorithm.
        self.prompt_pool: list[Example] | None = None
        self._splits: dict[str, list[Example]] = {}

    # ---- data ---------------------------------------------------------------------------------------------------
    @classmethod
    def choices(cls) -> list[str]:
        """What this one task offers beyond its config's defaults (reasoning-gym's generators): ``bench list`` shows
        each as a line ``<task> <override>``."""
        return []

    def load_split(self, split: Split) -> list[Example]:
        raise NotImplementedError

    def data_file(self, *parts: str) -> Path:
        """A file under the data root; a clear error naming the expected path and both ways to get the data."""
        root = self.cfg.data_root
        path = Path(root).expanduser().joinpath(*parts) if root else None
        if path is None or not path.exists():
            raise self.missing_data(parts)
        return path

    def missing_data(
        self, parts: Sequence[str], hub_error: BaseException | None = None, hub_dataset: str | None = None
    ) -> FileNotFoundError:
        """The one missing-data error: the expected path under the data root, how to set the root and, for a task
        with a hub dataset, either how to use it or (``hub_error``) that it was tried and could not be reached."""
        root = self.cfg.data_root
        where = str(Path(root).expanduser().joinpath(*parts)) if root else "<data root>/" + "/".join(parts)
        if hub_error is not None:
            first = (str(hub_error).splitlines() or [""])[0][:200]
            hub = (
                f"; the hub dataset {hub_dataset or self.hub_dataset} was tried instead and could not be reached "
                f"({type(hub_error).__name__}: {first})"
            )
        elif self.hub_dataset:
            hub = f", or with network access install `datasets` and use the hub dataset {self.hub_dataset}"
        else:
            hub = ""
        return FileNotFoundError(
            f"task {self.cfg.name!r} needs {where}, which does not exist{hub}. Set BENCH_DATA or task.data_root to "
            f"the directory that holds {parts[0]}/ (in this project: ../shared/data)."
        )

    def use_hub(self) -> bool:
        """Load from the hub instead of the data root: no root is set, the task has a hub dataset and the optional
        ``datasets`` package is installed."""
        return (
            self.cfg.data_root is None and bool(self.hub_dataset) and importlib.util.find_spec("datasets") is not None
        )

    def load_hub(self, local: Sequence[str], *args: Any, dataset: str | None = None, **kwargs: Any):
        """``datasets.load_dataset(dataset or self.hub_dataset, *args, **kwargs)``; when the hub cannot be reached
        (offline, no cache) the missing-data error for the ``local`` parts, saying the hub was tried. The hub's host
        is probed first (one TCP connect, HUB_PROBE_S): an unreachable hub fails at once instead of after the
        client's retries (80-110 s of warnings, once per split). With HF_HUB_OFFLINE or HF_DATASETS_OFFLINE set the
        probe is skipped and the local hub cache is read."""
        import datasets

        error = hub_unreachable()
        if error is not None:
            raise self.missing_data(local, hub_error=error, hub_dataset=dataset)
        try:
            return datasets.load_dataset(dataset or self.hub_dataset, *args, **kwargs)
        except (ConnectionError, OSError) as e:  # OSError covers the hub's not-found and offline errors
            raise self.missing_data(local, hub_error=e, hub_dataset=dataset) from e

    def examples(self, split: Split) -> list[Example]:
        if split not in self._splits:
            exs = self.load_split(split)
            if split == "train" and self.cfg.num_train is not None:
                exs = exs[: self.cfg.num_train]
            if split != "train":
                exs = exs[: self.cfg.num_eval]
            if not exs:
                raise ValueError(f"task {self.cfg.name!r}: split {split!r} is empty")
            self._splits[split] = exs
        return self._splits[split]

    def eval_examples(self) -> list[Example]:
        return self.examples(self.cfg.eval_split)  # type: ignore[arg-type]

    def longest_prompt(self) -> int:
        """Tokens in the longest rendered prompt of the train and evaluation splits (what an engine's context must
        hold before the completion's budget)."""
        add_special = not getattr(self.tokenizer, "chat_template", None)
        longest = 0
        for split in dict.fromkeys(("train", self.cfg.eval_split)):
            prompts = [self.render_prompt(e) for e in self.examples(split)]
            for start in range(0, len(prompts), 1024):
                ids = self.tokenizer(prompts[start : start + 1024], add_special_tokens=add_special).input_ids
                longest = max(longest, *map(len, ids))
        return longest

    def demonstrations(self) -> list[Example]:
        demos = [e for e in self.examples("train") if e.demonstration is not None]
        if not demos:
            raise ValueError(f"task {self.cfg.name!r} has no demonstrations, so SFT cannot run on it")
        return demos

    # ---- prompts and rewards ------------------------------------------------------------------------------------
    def instruction(self, example: Example) -> str:
        """The user message for chat models."""
        raise NotImplementedError

    def plain_prompt(self, example: Example) -> str:
        """The prompt for tokenizers without a chat template."""
        return self.instruction(example) + "\n"

    def render_prompt(self, example: Example) -> str:
        tok = self.tokenizer
        if tok is not None and getattr(tok, "chat_template", None):
            msgs = [{"role": "user", "content": self.instruction(example)}]
            return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        return self.plain_prompt(example)

    def reward(self, example: Example, completion: str) -> RewardResult:
        """Pure, deterministic, bounded in time, never raises on model output."""
        raise NotImplementedError

    def reward_time_bound_s(self) -> float:
        """Wall seconds one ``reward`` call may take on any completion, with a warm verifier. A task whose verifier
        runs under its own limit (a query, a math-verify call) returns that limit plus its overhead, and the contract's
        fuzz test holds it to that; a task that declares ``scan`` is held to its cap instead, and this default (1 s)
        is only what it promises, not a bound any code enforces."""
        return 1.0

    def data_stats(self) -> dict[str, float]:
        """Counts about the loaded data, logged as ``data/<name>`` at the start of a run (e.g. unscorable examples)."""
        return {f"{split}_examples": len(exs) for split, exs in self._splits.items()}

    def gold_completion(self, example: Example) -> str | None:
        """A completion that must score 1 (the contract tests check it): the demonstration by default."""
        return example.demonstration

    def is_correct(self, result: RewardResult) -> bool:
        return result.score >= self.cfg.correct_threshold

    # ---- structure for fine-grained credit assignment (optional) -------------------------------------------------
    def answer_span(self, completion: str) -> tuple[int, int] | None:
        """Character span [start, end) of the final answer in a completion (e.g. the SQL block, the boxed answer);
        None when there is none. Tokens outside it are the reasoning part."""
        return None

    def segment(self, completion: str) -> list[int] | None:
        """Character offsets where natural segments (macro actions) of a completion start, first one 0; None when
        the task has no natural segmenter."""
        return None

    def process_rewards(self, example: Example, completion: str) -> list[tuple[int, float]] | None:
        """Step rewards of an oracle process supervisor: (character offset of each step's last character, the step's
        reward) for every step the completion made, a step rewarded 0 included; None when the task has none. The
        harness places each on the token holding that character (``algorithm.reward_shaping=process``)."""
        return None

    # ---- environments: multi-turn episodes (optional) -------------------------------------------------------------
    def reset(self, example: Example, seed: int) -> tuple[str, Any]:
        """An environment task starts an episode: -> (the first observation, the episode's state). The prompt,
        ``instruction(example)``, must show that observation; every episode of a group is reset with the same
        ``seed`` (the same world). The state is whatever ``step`` needs; nothing outside the task reads it."""
        raise NotImplementedError

    def step(self, state: Any, action: str) -> Turn:
        """The environment's answer to one action (the policy's decoded turn, untrusted text): the next observation,
        the turn's reward, whether the episode is over, and its reward components so far. Never raises on any
        action, and bounded in time like ``reward``. A task that defines it is an environment (bench/engine/
        episode.py runs its episodes); ``reward`` is then not called."""
        raise NotImplementedError

    @property
    def is_environment(self) -> bool:
        """Whether the task answers between turns (it defines ``step``)."""
        return type(self).step is not Task.step

    # ---- batches ------------------------------------------------------------------------------------------------
    def collate_prompts(self, examples: Sequence[Example]) -> dict:
        prompts = [self.render_prompt(e) for e in examples]
        enc = self.tokenizer(
            prompts,
            padding=True,
            return_tensors="pt",
            padding_side="left",
            add_special_tokens=not getattr(self.tokenizer, "chat_template", None),
        )
        return {"examples": list(examples), "prompt_ids": enc.input_ids, "prompt_mask": enc.attention_mask}

    def collate_demonstrations(self, examples: Sequence[Example]) -> dict:
        """Prompt + demonstration + EOS, right-padded; ``labels`` are -100 outside the completion."""
        tok = self.tokenizer
        add_special = not getattr(tok, "chat_template", None)
        rows = []
        for e in examples:
            p = tok(self.render_prompt(e), add_special_tokens=add_special).input_ids
            if self.is_environment:
                rows.append((p, *self.demonstration_episode(e)))
                continue
            c = tok(e.demonstration, add_special_tokens=False).input_ids + [tok.eos_token_id]
            rows.append((p, c))
        return pad_demonstrations(rows, tok.pad_token_id)

    def demonstration_episode(self, example: Example) -> tuple[list[int], list[bool]]:
        """An environment's demonstration (its actions, ``example.demonstration``) replayed through ``reset`` (seed
        0) and ``step`` into the episode's completion tokens, as bench/engine/episode.py lays an episode out: each
        action and EOS (trained), then the observation (not trained) -> (ids, which ids are trained)."""
        from bench.engine.episode import observation_text

        tok = self.tokenizer
        _, state = self.reset(example, 0)
        ids: list[int] = []
        trained: list[bool] = []
        actions = list(example.demonstration)
        for k, action in enumerate(actions):
            a = tok(action, add_special_tokens=False).input_ids + [tok.eos_token_id]
            ids += a
            trained += [True] * len(a)
            turn = self.step(state, action)
            if turn.done or k == len(actions) - 1:
                break
            o = tok(observation_text(tok, turn.observation, True), add_special_tokens=False).input_ids
            ids += o
            trained += [False] * len(o)
        return ids, trained

    def rl_prompts(self) -> list[Example]:
        """The train problems RL draws its prompts from: all of them, or the pool the algorithm chose."""
        return self.examples("train") if self.prompt_pool is None else self.prompt_pool

    def sample_prompts(self, n: int, key: tuple) -> dict:
        """n train prompts drawn by a seeded RNG keyed by ``key`` (e.g. (seed, step, round)): extra prompts for
        resampling (dynamic sampling), reproducible like the main stream."""
        rng = random.Random("/".join(map(str, key)))
        return self.collate_prompts(rng.sample(self.rl_prompts(), n))

    def transfer_batch_to_device(self, batch: dict, device, dataloader_idx: int) -> dict:
        # Only tensors move; Example records stay as they are (Lightning refuses to walk frozen dataclasses).
        return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    def train_dataloader(self) -> DataLoader:
        if self.train_stream == "demonstrations":
            stream = _Stream(self.demonstrations(), self.batch_size, self.seed, self)
            return DataLoader(stream, batch_size=None, collate_fn=self.collate_demonstrations)
        stream = _Stream(self.rl_prompts(), self.prompts_per_step, self.seed, self)
        return DataLoader(stream, batch_size=None, collate_fn=self.collate_prompts)


class _Stream(IterableDataset):
    """Endless batches: batch k is a pure function of (seed, k), so a resumed run sees the batches it would have."""

    def __init__(self, items: list, batch: int, seed: int, owner: Task):
        if batch > len(items):
            raise ValueError(f"batch of {batch} is larger than the {len(items)} examples available")
        self.items, self.batch, self.seed, self.owner = items, batch, seed, owner

    def __iter__(self) -> Iterator[list]:
        per_epoch = len(self.items) // self.batch
        k = self.owner.start_step
        while True:
            epoch, j = divmod(k, per_epoch)
            order = list(range(len(self.items)))
            random.Random(f"{self.seed}-{epoch}").shuffle(order)
            yield [self.items[i] for i in order[j * self.batch : (j + 1) * self.batch]]
            k += 1


def read_jsonl(path: Path, required: Sequence[str] = (), kind: type = str) -> list[dict]:
    """The records of a JSONL file (blank lines skipped). A line that is not JSON, not an object, or lacks one of the
    ``required`` fields as a non-empty ``kind`` fails naming the file, the line and what was expected."""
    rows = []
    with Path(path).open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not a JSON line ({e})") from None
            if not isinstance(rec, dict) or not all(_present(rec.get(k), kind) for k in required):
                want = f"non-empty {kind.__name__} fields {list(required)}" if required else "a JSON object"
                raise ValueError(f"{path}:{lineno}: expected {want}, got {str(rec)[:300]}")
            rows.append(rec)
    return rows


def _present(value, kind: type) -> bool:
    return isinstance(value, kind) and not isinstance(value, bool) and (value.strip() != "" if kind is str else True)


def pad_demonstrations(rows: list[tuple], pad_id: int) -> dict:
    """(prompt ids, completion ids[, which completion ids are trained]) rows -> the SFT batch: their concatenations
    right-padded with ``pad_id``, ``labels`` -100 outside the completion (and on its untrained ids: an episode's
    observations), and the attention mask. On the host: Lightning moves the batch."""
    rows = [(r[0], r[1], r[2] if len(r) > 2 else [True] * len(r[1])) for r in rows]
    ids = [torch.tensor(p + c, dtype=torch.long) for p, c, _ in rows]  # host: the SFT batch
    labels = [torch.tensor([-100] * len(p) + [t if k else -100 for t, k in zip(c, keep, strict=True)],
                           dtype=torch.long) for p, c, keep in rows]  # host: the SFT batch  # fmt: skip
    mask = [torch.ones(len(p) + len(c), dtype=torch.long) for p, c, _ in rows]  # host: the SFT batch
    return {"input_ids": pad_sequence(ids, batch_first=True, padding_value=pad_id),
            "attention_mask": pad_sequence(mask, batch_first=True),
            "labels": pad_sequence(labels, batch_first=True, padding_value=-100)}  # fmt: skip


def environment_names() -> list[str]:
    """The registered tasks that are environments (they define ``Task.step``), in registry order."""
    from bench.registry import TASKS

    return [n for n in TASKS.names() if TASKS.get(n).step is not Task.step]


def sft_task(task_cfg) -> dict:
    """The task section an SFT warm start is trained with: ``task_cfg`` with the task's ``rl_only`` keys at their
    defaults, so that variants differing only in them share one warm start (and one cache entry)."""
    from omegaconf import OmegaConf

    from bench.registry import TASKS

    cls = TASKS.get(task_cfg.name)
    out = OmegaConf.to_container(task_cfg) if not isinstance(task_cfg, dict) else dict(task_cfg)
    defaults = cls.Config()
    return out | {k: getattr(defaults, k) for k in cls.rl_only}
