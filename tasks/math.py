"""MATH: competition mathematics with a boxed final answer, evaluated on MATH-500.

Dataset: MATH (Hendrycks et al., 2021, "Measuring Mathematical Problem Solving With the MATH Dataset",
https://github.com/hendrycks/math); evaluation on MATH-500, the 500-problem test subset of Lightman et al., 2023
("Let's Verify Step by Step", PRM800K; hub ``HuggingFaceH4/MATH-500``). Training problems are the 7,500-problem MATH
train split (hub ``DigitalLearningGmbH/MATH-lighteval``), stored here with answers only. One literal record, as stored
in ``<data_root>/math/math500_test.jsonl`` (solution shortened)::

    {"problem": "Convert the point $(0,3)$ in rectangular coordinates to polar coordinates. ...",
     "solution": "We have that $r = \\sqrt{0^2 + 3^2} = 3.$ ... $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}.$",
     "answer": "\\left( 3, \\frac{\\pi}{2} \\right)", "subject": "Precalculus", "level": 2,
     "unique_id": "test/precalculus/807.json"}

Reward in one sentence: the content of the last complete ``\\boxed{...}`` (or ``\\fbox{...}``) in the completion
scores 1.0 iff math-verify (``parse`` + ``verify``) finds it equivalent to the gold ``answer``, checked in a separate
worker process under a hard time limit; anything else (no box, timeout, crash, unscorable gold) scores 0.0.

version = "1"
    1: initial version (train = MATH train minus MATH-500, val = 500 hash-chosen train problems, test = MATH-500;
       math-verify 0.9 in a killable worker process).

Answer format: ``... so the answer is $\\boxed{\\frac{1}{2}}$.`` Equivalent forms score alike (``\\frac{1}{2}``,
``0.5``, ``\\dfrac12``, ``1/2``). The box is found by a brace-balanced scan; ``\\{`` and ``\\}`` are literal braces.

Splits (all fixed, independent of the run seed):
  train = ``math_train.jsonl`` minus any problem whose whitespace-normalised text is a MATH-500 problem (0 of 7,500
          in the stored file; the count is kept in ``Math.overlap_removed``), minus exact duplicates (1), minus val.
  val   = the ``val_size`` train problems with the smallest sha256 of their normalised text (stable, order-free).
  test  = MATH-500. ``math_test_full.jsonl`` (the 5,000-problem MATH test split) contains all of MATH-500 and is never
          read by this task.
There are no worked solutions for the train problems, so the task has no demonstrations and SFT on it fails with the
base class's "has no demonstrations" error. MATH-500 solutions stay in ``Example.data["solution"]`` (tests only).

Unscorable examples: the gold answer is parsed once at load time (in the worker). If math-verify extracts no sympy
expression from it (empty answer, or only its raw-string fallback, which only a character-identical answer matches),
``Example.data["scorable"]`` is False, the reward never scores it (0.0, reason "unscorable"), and the task DROPS it
from every split: an unscorable eval example would count as a failure of every model, an unscorable train example
only yields zero-variance groups. Dropped uids are in ``Math.unscorable`` and their count in ``Math.num_unscorable``
(stored data: 0 of 500 test, 11 of 7,499 train/val, e.g. answers ``""``, ``"{17}."``, ``"\\text{(E)},"``).

Time limits (docs/field-notes.md, "Rewards"): math-verify's own timeouts use ``signal.alarm``, which only works in the
main thread. Here both of its timeouts are disabled (``parsing_timeout=None``, ``timeout_seconds=None``) and every
parse/verify runs in a small pool of worker processes (bench/sandbox.py, shared with text-to-SQL; ``python -c
<source>``: only math-verify and sympy are imported there, never torch). The caller waits at most
``verify_timeout_s`` for an answer; on timeout the worker is killed (SIGKILL, it may be stuck inside one C call such
as a huge integer power) and replaced, and the completion scores 0 with reason "timeout". This works from any thread.
A worker that is still starting (about 1 s after a kill) is waited for separately, up to
bench.sandbox.STARTUP_TIMEOUT_S, so a correct answer is never failed for the restart of a worker; the worst-case wall
time of one reward call is therefore startup + ``verify_timeout_s``. Workers also run under an address-space limit
(``worker_memory_mb``) and a CPU-time backstop, are shut down at exit (atexit), and are not shared with forked
children.

Prompts: chat models get the problem plus the standard "Please reason step by step, and put your final answer within
\\boxed{}." ``plain_prompt`` (tokenizers without a chat template, in practice the tiny character-level model with 256
positions) is the whitespace-collapsed problem cut to ``plain_prompt_chars`` characters plus a newline: a smoke-test
prompt, not one a model can solve from.

Deviations from the reference scorer (Hendrycks ``last_boxed_only_string`` + math-verify), per the field notes:
``# NOTE(deviation)`` the last COMPLETE box of either kind wins (the reference takes the last ``\\boxed`` even when
unclosed, and ``\\fbox`` only when there is no ``\\boxed``); ``\\boxed 5`` without braces is not an answer; escaped
braces do not count when balancing; only the last MAX_SCAN_CHARS of a completion are searched; boxed answers longer
than MAX_ANSWER_CHARS score 0 without being parsed (the longest MATH gold answer is 159 characters).
"""

from __future__ import annotations

import hashlib
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from bench import ROOT
from bench.sandbox import SharedPool, WorkerPool
from bench.task import Example, RewardResult, Split, Task, TaskConfig, read_jsonl

# ---- answer extraction ----------------------------------------------------------------------------------------------

MAX_SCAN_CHARS = 32_768
"""Only this tail of a completion is searched for the box (about 8k tokens of text); the scan is linear."""
MAX_ANSWER_CHARS = 512
"""Boxed answers longer than this score 0 without being parsed (3x the longest MATH gold answer, a 3x3 matrix)."""
DEFAULT_TIMEOUT_S = 5.0
"""Default wall-clock limit for one parse + verify in the worker."""
PROMPT_SUFFIX = "Please reason step by step, and put your final answer within \\boxed{}."

# A box command and its opening brace: ``\boxed{``, ``\boxed {``, ``\fbox{`` (the group 'brace' is the '{').
_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*(?P<brace>\{)")
# Brace tokens for the balanced scan: an escape pair (``\{``, ``\}``, ``\\``, ``\b``...) is skipped as a unit, so
# escaped braces are literal and ``\\{`` (line break, then a group) still opens a group.
_BRACE_TOKEN = re.compile(r"\\.|[{}]", re.DOTALL)
# Segment boundaries: a line break, a sentence end (. ! ? then blanks), or a LaTeX row break ``\\``; any whitespace
# after it belongs to the boundary, so the next segment starts at visible text.
_SEGMENT_BREAK = re.compile(r"(?:\n|(?<=[.!?])[ \t]+|\\\\)\s*")
_WS = re.compile(r"\s+")


def brace_matches(text: str) -> dict[int, int]:
    """``{open index: close index}`` for every balanced group of unescaped braces in ``text``; linear time."""
    stack: list[int] = []
    match: dict[int, int] = {}
    for m in _BRACE_TOKEN.finditer(text):
        tok = m.group()
        if tok == "{":
            stack.append(m.start())
        elif tok == "}" and stack:
            match[stack.pop()] = m.start()
    return match


def find_last_box(completion: str) -> tuple[str, int, int] | None:
    """``(content, start, end)`` of the last complete ``\\boxed{...}``/``\\fbox{...}`` in the completion's tail, where
    ``[start, end)`` spans the whole command in ``completion`` coordinates; None when there is none.

    Matches Hendrycks et al. ``last_boxed_only_string`` (rfind + brace counting) on well-formed text; see the module
    docstring for the deviations on unclosed boxes, ``\\fbox`` and escaped braces.
    """
    offset = max(0, len(completion) - MAX_SCAN_CHARS)
    tail = completion[offset:]
    opens = [(m.start(), m.start("brace")) for m in _BOX_OPEN.finditer(tail)]
    if not opens:
        return None
    match = brace_matches(tail)
    for start, brace in reversed(opens):
        close = match.get(brace)
        if close is not None:
            return tail[brace + 1 : close], offset + start, offset + close + 1
    return None


def extract_answer(completion: str) -> str | None:
    """The content of the last complete box, or None."""
    box = find_last_box(completion)
    return None if box is None else box[0]


def segment_starts(completion: str) -> list[int]:
    """Offsets where steps start: 0, then after each line break, sentence end or ``\\\\`` row break (whitespace after
    the break is skipped); sorted, unique, all < len(completion) except the leading 0 of an empty completion."""
    starts = [0]
    for m in _SEGMENT_BREAK.finditer(completion):
        if 0 < m.end() < len(completion) and m.end() != starts[-1]:
            starts.append(m.end())
    return starts


def normalise_problem(text: str) -> str:
    """Whitespace-collapsed problem text: the key for overlap checks, duplicates and the val hash."""
    return _WS.sub(" ", text).strip()


# ---- the verification worker ----------------------------------------------------------------------------------------

# Runs as ``python -c _WORKER_SOURCE <memory_mb> <repo root>`` with the working directory removed from sys.path and
# the repository appended last (PYTHONPATH is kept), so the worker imports math-verify, sympy and bench.sandbox
# (standard library only), never torch or a task module. Protocol: one JSON
# object per line each way; the first line the worker writes is {"ready": true} or {"ready": false, "error": ...}.
# Requests: {"op": "gold", "gold": s} and {"op": "score", "gold": s, "pred": s}, each with "cpu": a CPU-seconds budget
# for the backstop limit.
_WORKER_SOURCE = r"""
import sys

sys.path[:] = [p for p in sys.path if p not in ("", ".")] + [sys.argv[2]]  # the repository last: bench.sandbox only
import json, logging, math, os

from bench.sandbox import limit_cpu, limit_memory

proto = os.fdopen(os.dup(1), "wb", buffering=0)  # the protocol channel; fd 1 then points at stderr (devnull)
os.dup2(2, 1)
sys.stdout = sys.stderr


def send(obj):
    proto.write(json.dumps(obj).encode() + b"\n")


def main():
    limit_memory(int(sys.argv[1]))
    try:
        logging.disable(logging.CRITICAL)
        from math_verify import parse, verify
        from sympy import Basic, MatrixBase
    except BaseException as e:
        send({"ready": False, "error": f"{type(e).__name__}: {e}"})
        return
    send({"ready": True, "pid": os.getpid()})

    def parse_boxed(text):
        # both of math-verify's signal-based timeouts are off: the parent enforces the limit by killing this process
        return parse("\\boxed{" + text + "}", parsing_timeout=None)

    def has_expr(parsed):
        return any(isinstance(x, (Basic, MatrixBase)) for x in parsed)

    golds = {}
    for line in sys.stdin.buffer:
        req = json.loads(line)
        try:
            # Backstop for an orphaned worker (parent killed): SIGXCPU ends it after this much more CPU time.
            limit_cpu(req["cpu"])
            gold = golds.get(req["gold"])
            if gold is None:
                if len(golds) > 50000:
                    golds.clear()
                gold = golds[req["gold"]] = parse_boxed(req["gold"])
            scorable = has_expr(gold)
            if req["op"] == "gold" or not scorable:
                send({"status": "ok", "scorable": scorable})
                continue
            pred = parse_boxed(req["pred"])
            correct = bool(verify(gold, pred, timeout_seconds=None))
            send({"status": "ok", "scorable": True, "parsed": has_expr(pred), "correct": correct})
        except BaseException as e:  # MemoryError under the address-space limit, RecursionError, ...
            send({"status": "error", "error": type(e).__name__})


main()
"""


def _worker_command(memory_mb: int) -> list[str]:
    return [sys.executable, "-c", _WORKER_SOURCE, str(int(memory_mb)), str(ROOT)]


_SHARED = SharedPool(_worker_command, "math-verify")
_GOLD_CACHE: dict[str, bool] = {}
"""gold answer -> scorable, for this process (a reloaded task does not re-check its golds)."""


def pool() -> WorkerPool:
    """The process-wide worker pool, created on first use."""
    return _SHARED.get()


def configure_pool(max_workers: int, memory_mb: int) -> None:
    """Size and memory limit of the process-wide pool (now and for pools created after a shutdown)."""
    _SHARED.configure(max_workers, memory_mb)


def shutdown() -> None:
    """Stop the worker pool (registered with atexit; a later call starts a new pool)."""
    _SHARED.shutdown()


def check_golds(golds: list[str], timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, bool]:
    """``{gold: scorable}`` for the distinct golds: math-verify extracts a sympy expression from ``\\boxed{gold}``
    within the time limit. Parallel over the pool's workers; cached per process."""
    todo = sorted({g for g in golds if g not in _GOLD_CACHE})
    if todo:
        p = pool()

        def one(g: str) -> bool:
            reply = p.call({"op": "gold", "gold": g}, timeout_s)
            return reply.get("status") == "ok" and bool(reply.get("scorable"))

        with ThreadPoolExecutor(max_workers=p.max_workers) as ex:
            _GOLD_CACHE.update(zip(todo, ex.map(one, todo), strict=True))
    return {g: _GOLD_CACHE[g] for g in golds}


# ---- reward -------------------------------------------------------------------------------------------------------


def reward(example: Example, completion: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> RewardResult:
    """1.0 iff the last complete box's content is math-verify-equivalent to ``example.answer``.

    Components: ``format`` (a complete box with non-empty content exists; the prompt's own empty ``\\boxed{}`` does
    not count), ``correct`` (= score). ``info["reason"]`` says why: ok, wrong, no box, empty box, answer too long,
    unparseable, timeout, crashed, error:<exception>, unscorable. Never raises on model output; the wall time is
    bounded by the linear scan plus ``timeout_s`` (plus a worker start, see the module docstring).
    """

    def result(reason: str, answer: str | None, fmt: float = 0.0, correct: float = 0.0) -> RewardResult:
        return RewardResult(
            score=correct,
            components={"format": fmt, "correct": correct},
            info={"reason": reason, "answer": None if answer is None else answer[:200]},
        )

    if example.data.get("scorable") is False:
        return result("unscorable", None)
    answer = extract_answer(completion)
    if answer is None:
        return result("no box", None)
    if not answer.strip():
        return result("empty box", answer)
    if len(answer) > MAX_ANSWER_CHARS:
        # NOTE(deviation): long boxed answers are not parsed at all (bounded cost; no MATH gold is near this long).
        return result(f"answer too long (> {MAX_ANSWER_CHARS} chars)", answer, 1.0)
    reply = pool().call({"op": "score", "gold": str(example.answer), "pred": answer}, timeout_s)
    status = reply.get("status")
    if status != "ok":
        reason = f"error: {reply.get('error')}" if status == "error" else str(status)
        return result(reason, answer, 1.0)
    if not reply.get("scorable"):
        return result("unscorable", answer, 1.0)
    if reply.get("correct"):
        return result("ok", answer, 1.0, 1.0)
    return result("wrong" if reply.get("parsed") else "unparseable", answer, 1.0)


# ---- data ---------------------------------------------------------------------------------------------------------

HUB_TRAIN_DATASET = "DigitalLearningGmbH/MATH-lighteval"
"""The hub source of math_train.jsonl (MATH train split with solutions; the answer is its last box)."""


def _level(value: Any) -> int | None:
    """MATH levels come as 3 or "Level 3" ("Level ?" for a few train problems -> None)."""
    if isinstance(value, int):
        return value
    m = re.search(r"\d+", str(value))
    return int(m.group()) if m else None


def math500_example(rec: dict) -> Example:
    uid = rec["unique_id"].removesuffix(".json")
    return Example(
        uid=f"math500/{uid}",
        question=rec["problem"],
        answer=rec["answer"],
        demonstration=None,  # MATH-500 solutions are eval material, never SFT targets
        data={
            "source": "math500",
            "subject": rec["subject"],
            "level": _level(rec["level"]),
            "unique_id": rec["unique_id"],
            "solution": rec["solution"],
        },
    )


def train_example(index: int, rec: dict) -> Example:
    return Example(
        uid=f"math_train/{index}",
        question=rec["problem"],
        answer=rec["answer"],
        demonstration=None,  # the stored train split has no worked solutions
        data={"source": "math_train", "subject": rec.get("type"), "level": _level(rec.get("level"))},
    )


def val_key(problem: str) -> str:
    """sha256 of the normalised problem: val is the val_size smallest keys, so it is stable and order-free."""
    return hashlib.sha256(normalise_problem(problem).encode()).hexdigest()


def with_scorable(example: Example, scorable: bool) -> Example:
    return Example(
        uid=example.uid,
        question=example.question,
        answer=example.answer,
        demonstration=example.demonstration,
        data={**example.data, "scorable": scorable},
    )


# ---- DataModule ---------------------------------------------------------------------------------------------------


@dataclass
class MathConfig(TaskConfig):
    name: str = "math"
    """Registry name of the task."""
    val_size: int = 500
    """Train problems held out as the val split (chosen by hash of the problem text, the same for every run)."""
    verify_timeout_s: float = DEFAULT_TIMEOUT_S
    """Wall-clock limit for one math-verify parse + verify in the worker; on timeout the completion scores 0."""
    verify_workers: int = 2
    """Worker processes for math-verify (process-wide pool; the last task constructed sets it)."""
    worker_memory_mb: int = 4096
    """Address-space limit of each worker (0: none); a huge expression fails with MemoryError instead of swapping."""
    plain_prompt_chars: int = 160
    """Length cap of plain_prompt's problem text (the tiny char-level model has 256 positions in all)."""

    def __post_init__(self) -> None:
        if self.val_size < 1:
            raise ValueError(f"val_size must be >= 1, got {self.val_size}")
        if not self.verify_timeout_s > 0:
            raise ValueError(f"verify_timeout_s must be > 0, got {self.verify_timeout_s}")
        if self.verify_workers < 1:
            raise ValueError(f"verify_workers must be >= 1, got {self.verify_workers}")
        if self.plain_prompt_chars < 1:
            raise ValueError(f"plain_prompt_chars must be >= 1, got {self.plain_prompt_chars}")


class Math(Task):
    Config = MathConfig
    version = "1"
    description = "MATH competition problems, last \\boxed{} answer checked with math-verify; eval on MATH-500."
    verified_component = "format"
    hub_dataset = "HuggingFaceH4/MATH-500"

    cfg: MathConfig

    def __init__(self, cfg: MathConfig, tokenizer=None, **kwargs) -> None:
        super().__init__(cfg, tokenizer, **kwargs)
        configure_pool(cfg.verify_workers, cfg.worker_memory_mb)
        self._test: list[Example] | None = None
        self._train_val: dict[str, list[Example]] | None = None
        self.overlap_removed = 0
        """Train problems dropped because their text is a MATH-500 problem."""
        self.duplicates_removed = 0
        """Train problems dropped as exact (normalised) repeats of an earlier one."""
        self.unscorable: dict[str, list[str]] = {}
        """Split -> uids dropped because their gold answer does not parse."""

    @property
    def num_unscorable(self) -> int:
        """Examples dropped as unscorable over the splits loaded so far (log it with the run)."""
        return sum(len(v) for v in self.unscorable.values())

    # -- raw rows --
    def _rows(self, which: str) -> list[dict]:
        file = {"math500": "math500_test.jsonl", "train": "math_train.jsonl"}[which]
        if self.use_hub():
            return self._hub_rows(which, ("math", file))
        return read_jsonl(self.data_file("math", file))

    def _hub_rows(self, which: str, local: tuple[str, str]) -> list[dict]:
        if which == "math500":
            return [dict(r) for r in self.load_hub(local, split="test")]
        rows = []
        for r in self.load_hub(local, dataset=HUB_TRAIN_DATASET, split="train"):
            box = find_last_box(r["solution"])
            answer = box[0] if box else ""
            rows.append({"problem": r["problem"], "answer": answer, "level": r["level"], "type": r["type"]})
        return rows

    def _math500(self) -> list[Example]:
        if self._test is None:
            self._test = [math500_example(r) for r in self._rows("math500")]
        return self._test

    def _split_train(self) -> dict[str, list[Example]]:
        if self._train_val is None:
            held_out = {normalise_problem(e.question) for e in self._math500()}
            seen: set[str] = set()
            pool_: list[Example] = []
            self.overlap_removed = self.duplicates_removed = 0
            for i, rec in enumerate(self._rows("train")):
                key = normalise_problem(rec["problem"])
                if key in held_out:
                    self.overlap_removed += 1
                elif key in seen:
                    self.duplicates_removed += 1
                else:
                    seen.add(key)
                    pool_.append(train_example(i, rec))
            val_uids = {e.uid for e in sorted(pool_, key=lambda e: val_key(e.question))[: self.cfg.val_size]}
            self._train_val = {
                "train": [e for e in pool_ if e.uid not in val_uids],
                "val": [e for e in pool_ if e.uid in val_uids],
            }
        return self._train_val

    def data_stats(self) -> dict[str, float]:
        return {**super().data_stats(), "unscorable": self.num_unscorable}

    def gold_completion(self, example: Example) -> str:
        """MATH-500 has solutions, MATH train only answers: the contract's gold is the answer in the instructed box."""
        return f"The final answer is $\\boxed{{{example.answer}}}$."

    def load_split(self, split: Split) -> list[Example]:
        if split not in ("train", "val", "test"):
            raise ValueError(f"unknown split {split!r}")
        raw = self._math500() if split == "test" else self._split_train()[split]
        ok = check_golds([str(e.answer) for e in raw], self.cfg.verify_timeout_s)
        marked = [with_scorable(e, ok[str(e.answer)]) for e in raw]
        self.unscorable[split] = [e.uid for e in marked if not e.data["scorable"]]
        return [e for e in marked if e.data["scorable"]]

    # -- prompts and reward --
    def instruction(self, example: Example) -> str:
        return f"{example.question}\n\n{PROMPT_SUFFIX}"

    def plain_prompt(self, example: Example) -> str:
        return normalise_problem(example.question)[: self.cfg.plain_prompt_chars] + "\n"

    def reward_time_bound_s(self) -> float:
        # the worker's limit, then the kill and the scan; + a worker's restart when the previous call killed one
        return self.cfg.verify_timeout_s + 10.0

    def reward(self, example: Example, completion: str) -> RewardResult:
        return reward(example, completion, self.cfg.verify_timeout_s)

    def answer_span(self, completion: str) -> tuple[int, int] | None:
        box = find_last_box(completion)
        return None if box is None else (box[1], box[2])

    def segment(self, completion: str) -> list[int] | None:
        return segment_starts(completion)
