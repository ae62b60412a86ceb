"""reasoning-gym: the field's library of procedural reasoning tasks with verifiers, as one task.

Source: reasoning-gym (Stojanovski et al. 2025, "REASONING GYM: Reasoning Environments for Reinforcement Learning with
Verifiable Rewards", https://github.com/open-thought/reasoning-gym, Apache-2.0), 106 generators, each with difficulty
parameters, a seed, gold answers and its own ``score_answer``. ``task=reasoning_gym task.dataset=<name>`` picks one;
the generator's own parameters follow as ``task.params.<key>=<value>`` (``task.params.min_terms=2``), and
``task.dataset=composite`` mixes several (``task.params.datasets='[{name: chain_sum, weight: 1, config: {}}, ...]'``).
``python -m bench list`` shows the generators (``reasoning_gym.<name>`` lines). One literal record (basic_arithmetic,
``min_terms=2 max_terms=2 min_digits=1 max_digits=1``)::

    {"question": "Calculate 5 - 3.", "answer": "2", "metadata": {"expression": "5 - 3", ...}}
    prompt (chat models): the question, then "Give only the final answer, between <answer> and </answer>."
    gold completion: "<answer>2</answer>"
    with task.demo=working: "... Work it out step by step, then give the final answer between <answer> and </answer>."
    gold completion: "5 - 3 = 2\n<answer>2</answer>"   (worked solutions: WORKINGS)

Reward in one sentence: the content of the last complete ``<answer>...</answer>`` in the completion is given to the
generator's own ``score_answer`` for the same item, in a confined worker process under a hard time limit; its value
(in [0, 1]; some generators give partial credit) is the score, and a completion is correct when it scores 1.

Splits: train items come from ``train_seed`` and the evaluation items from ``eval_seed`` (item i of a seed s is drawn
from ``Random(s + i)``, so with the defaults the two ranges of seeds never meet); train items whose question is also an
evaluation question are dropped (counted as ``data/train_overlap_dropped``: small parameter spaces repeat problems).
The evaluation set is a pure function of (dataset, params, eval_seed): the same in every process and run.

version: ``"1/rg<reasoning-gym version>/<dataset>/<sha256 of the params, 8 hex>"`` (``Task.version_of``, logged as the
run's ``task.version``): two runs are comparable only when their versions match.

**The verifiers execute answers.** In reasoning-gym 0.1.25, ``score_answer`` of string_insertion, spiral_matrix,
binary_matrix and n_queens passes the answer to Python's ``eval``, and simple_integration, intermediate_integration,
polynomial_multiplication, countdown and puzzle24 pass it to ``sympy.parse_expr`` (which evals); the answer
``__import__('os').system('touch /tmp/x')`` created the file through each of the first seven. Three layers make that
impossible here:
1. Guarded sinks: in the verifier's worker, ``eval`` as reasoning-gym's modules call it takes plain literals only
   (``literal_ok``: what ``ast.literal_eval`` accepts, so ``eval`` computes the same value), and sympy's
   ``parse_expr`` (which ``sympify`` of a string calls) takes only expressions of numbers, operators, brackets and
   allowed names (``expression_ok``: single letters, the elementary functions, ``pi``, ``E``); anything else raises
   inside the verifier, which scores it 0 (reason "refused: ..."). The guards sit at the sinks, not on a list of
   generators, so a generator that starts to eval in a later version is covered too; the exact-match paths that come
   before a verifier's ``eval`` still score a gold answer 1. No verifier passes an answer to ``exec``.
2. Confinement: the verifier runs in a worker process (bench/sandbox.py) that, once its imports are done, calls
   ``bench.sandbox.confine``: a seccomp filter under which no file can be written, no process started, no socket
   made and no other process signalled, whatever runs in it, plus an audit hook saying so in Python terms.
3. Bounds: each call waits at most ``verify_timeout_s`` and a worker that overruns is killed (SIGKILL) and replaced;
   workers run under an address-space limit (``worker_memory_mb``) and a CPU-time backstop; answers longer than
   ``MAX_ANSWER_CHARS`` are not scored, and only the completion's last ``MAX_SCAN_CHARS`` are searched.
tests/test_reasoning_gym.py runs a battery of hostile answers through every generator and asserts that no file
appears, no process starts and every call returns within the bound.
"""

from __future__ import annotations

import ast
import hashlib
import json
import operator
import sys
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal

from bench import ROOT
from bench.sandbox import SharedPool, WorkerPool, expression_ok, literal_ok  # noqa: F401 (re-exported)
from bench.task import Example, RewardResult, Split, Task, TaskConfig

MAX_SCAN_CHARS = 32_768
"""Only this tail of a completion is searched for the answer tags."""
MAX_ANSWER_CHARS = 4_096
"""Answers longer than this score 0 unscored (reason "answer too long")."""
OPEN, CLOSE = "<answer>", "</answer>"
INSTRUCTION = f"Give only the final answer, between {OPEN} and {CLOSE}."
WORKING_INSTRUCTION = f"Work it out step by step, then give the final answer between {OPEN} and {CLOSE}."

ANY_ANSWER_WINS = {
    "game_of_life_halting": "its verifier compares bool(answer) with bool(gold), and both golds are non-empty strings, "
    "so every non-empty answer scores 1",
}
"""Generators whose verifier scores a wrong answer 1 (reasoning-gym 0.1.25): refused, as RL on them rewards anything."""
EVAL_VERIFIERS = frozenset({"string_insertion", "spiral_matrix", "binary_matrix", "n_queens"})
"""Generators whose ``score_answer`` passes the answer to ``eval`` (reasoning-gym 0.1.25, read from its source)."""
PARSE_EXPR_VERIFIERS = frozenset({"simple_integration", "intermediate_integration", "polynomial_multiplication",
                                  "countdown", "puzzle24"})  # fmt: skip
"""Generators whose ``score_answer`` passes the answer to ``sympy.parse_expr`` (which evals)."""


def rg_version() -> str:
    from importlib.metadata import version

    return version("reasoning-gym")


def extract_answer(completion: str) -> str | None:
    """The stripped content of the last complete ``<answer>...</answer>`` in the completion's tail, or None. Linear:
    the last closing tag, then the last opening tag before it (reasoning-gym's own regex is quadratic on a completion
    of many unclosed opening tags)."""
    tail = completion[-MAX_SCAN_CHARS:]
    end = tail.rfind(CLOSE)
    if end < 0:
        return None
    start = tail.rfind(OPEN, 0, end)
    return None if start < 0 else tail[start + len(OPEN) : end].strip()


# ---- the verification worker -----------------------------------------------------------------------------------------
# ``python -c <source> <memory_mb> <repo root>``: imports reasoning-gym (every generator, so no import happens after
# confinement), guards the sinks, confines itself, then answers one JSON request per line: {"key": [dataset, params,
# seed, size], "index": i, "answer": s, "cpu": budget} -> {"status": "ok", "score": x, "refused": [...]} |
# {"status": "error", "error": name}. The guards (literal_ok, expression_ok) are bench/sandbox.py's.
_WORKER_SOURCE = r"""
import sys

sys.path[:] = [p for p in sys.path if p not in ("", ".")] + [sys.argv[2]]
import ast, builtins, json, os, re

from bench.sandbox import confine, expression_ok, limit_cpu, limit_memory, literal_ok

proto = os.fdopen(os.dup(1), "wb", buffering=0)  # the protocol channel; fd 1 then points at stderr (devnull)
os.dup2(2, 1)
sys.stdout = sys.stderr
refused = []
current = {"answer": ""}  # the answer under scoring (the guards refuse what carries it unless it is safe)


def make_dataset(name, params, seed, size):
    from reasoning_gym.composite import DatasetSpec
    from reasoning_gym.factory import create_dataset

    if name == "composite" and params.get("datasets"):  # its config takes DatasetSpec objects, not mappings
        params = {**params, "datasets": [DatasetSpec(**d) for d in params["datasets"]]}
    return create_dataset(name, seed=seed, size=size, **params)


def send(obj):
    proto.write(json.dumps(obj, default=str).encode() + b"\n")  # default: metadata values JSON has no type for


def guard_sinks():
    # Layer 1: reasoning-gym's own eval takes plain literals only, sympy's parse_expr plain expressions only
    # (sympify of a string goes through it); anything else raises, and the verifier scores 0. Not the builtin eval
    # or exec for the whole process: sympy evals its own generated code, and no verifier passes an answer to exec.
    from sympy.parsing import sympy_parser
    import sympy

    real_parse = sympy_parser.parse_expr

    def tainted(text, check):
        # text that may carry a dangerous answer: only when the answer under scoring fails the sink's own check (a
        # safe answer adds nothing dangerous to what trusted code builds from it), and then the answer itself or any
        # of its names of two or more characters appears in the text (a verifier may strip or rewrite the answer
        # first). The gold, the item's metadata and sympy's own strings (its unit names) pass untouched otherwise.
        answer = current["answer"].strip()
        if not answer or check(answer):
            return False
        names = {n for n in re.findall(r"(?<![0-9A-Za-z_])[A-Za-z_][A-Za-z_0-9]*", answer) if len(n) > 1}
        return answer in text or any(n in text for n in names)

    def guard(sink, check, call):
        def guarded(source, *args, **kwargs):
            if not isinstance(source, str) or check(source) or not tainted(source, check):
                return call(source, *args, **kwargs)
            refused.append(sink)
            raise ValueError(f"refused: {sink}")

        return guarded

    safe_eval = guard("eval of a non-literal", literal_ok, lambda s, *a, **k: ast.literal_eval(s) if literal_ok(s)
                      else builtins.eval(s, *a, **k))
    safe_compile = guard("compile of the answer", literal_ok, builtins.compile)
    for name, module in list(sys.modules.items()):
        if name.startswith("reasoning_gym"):  # a module global shadows the builtin for the verifiers' own calls
            for attr, fn in (("eval", safe_eval), ("compile", safe_compile)):
                if attr not in vars(module):  # not a module's own function of that name (bfit's compile)
                    setattr(module, attr, fn)
        if getattr(module, "parse_expr", None) is real_parse:
            module.parse_expr = guard("parse_expr of a non-expression", expression_ok, real_parse)
    sympy_parser.parse_expr = sympy.parse_expr = guard("parse_expr of a non-expression", expression_ok, real_parse)


def main():
    limit_memory(int(sys.argv[1]))
    try:
        import importlib, logging, pkgutil
        logging.disable(logging.CRITICAL)
        import reasoning_gym
        for m in pkgutil.walk_packages(reasoning_gym.__path__, "reasoning_gym."):  # every generator, before confine
            if ".contrib" not in m.name and not m.name.endswith("__main__"):
                try:
                    importlib.import_module(m.name)
                except Exception:
                    pass
        import sympy
        sympy.parse_expr("x**2 + sin(x)")
        confine()  # before the guards: pyseccomp's own import runs exec
        guard_sinks()
    except BaseException as e:
        send({"ready": False, "error": f"{type(e).__name__}: {e}"})
        return
    send({"ready": True, "pid": os.getpid()})
    datasets = {}
    for line in sys.stdin.buffer:
        req = json.loads(line)
        refused.clear()
        current["answer"] = req.get("answer", "")
        try:
            limit_cpu(req["cpu"])
            key = json.dumps(req["key"], sort_keys=True)
            if key not in datasets:
                if len(datasets) > 64:
                    datasets.clear()
                name, params, seed, size = req["key"]
                datasets[key] = make_dataset(name, params, seed, size)
            ds = datasets[key]
            if req.get("op") == "items":
                items = [ds[i] for i in range(len(ds))]
                rows = [[it["question"], None if it["answer"] is None else str(it["answer"])] for it in items]
                if req.get("metadata"):  # each item's metadata too, JSON-safe (worked demonstrations read it)
                    rows = [r + [it["metadata"]] for r, it in zip(rows, items)]
                send({"status": "ok", "items": rows})
                continue
            score = ds.score_answer(req["answer"], ds[req["index"]])
            send({"status": "ok", "score": float(score), "refused": sorted(set(refused))})
        except BaseException as e:  # MemoryError under the address-space limit, RecursionError, PermissionError, ...
            why = {"error": type(e).__name__, "message": str(e)[:300], "refused": sorted(set(refused))}
            send({"status": "error", **why})


main()
"""


def _worker_command(memory_mb: int) -> list[str]:
    return [sys.executable, "-c", _WORKER_SOURCE, str(int(memory_mb)), str(ROOT)]


def _worker_env() -> dict[str, str]:
    # a fixed hash seed: some generators iterate over sets of strings, so an item drawn from the same seed differs
    # between two processes unless their hash seeds agree (polynomial_multiplication did); the items are drawn in
    # the workers, never in the trainer, and every worker draws the same ones
    import os

    return {**os.environ, "PYTHONHASHSEED": "0"}


_SHARED = SharedPool(_worker_command, "reasoning-gym", env=_worker_env)
GENERATE_TIMEOUT_S = 900.0
"""How long drawing one split's items may take in a worker (the slowest generators take seconds an item)."""


def pool() -> WorkerPool:
    return _SHARED.get()


def shutdown() -> None:
    _SHARED.shutdown()


# ---- the task -------------------------------------------------------------------------------------------------------
@dataclass
class ReasoningGymConfig(TaskConfig):
    name: str = "reasoning_gym"
    """Registry name of the task."""
    dataset: str = "basic_arithmetic"
    """The reasoning-gym generator (``python -m bench list`` shows them), or ``composite``."""
    params: dict[str, Any] = field(default_factory=dict)
    """The generator's own parameters (its config class's fields), e.g. ``task.params.max_digits=2``."""
    num_train_problems: int = 5_000
    """Train items drawn (before the overlap with the evaluation set is dropped)."""
    train_seed: int = 0
    """Seed of the train items (item i from Random(train_seed + i))."""
    eval_seed: int = 1_000_000_007
    """Seed of the evaluation items: far from the train seeds, so the two never share an item's seed."""
    num_eval: int = 500
    """Size of the fixed held-out evaluation set."""
    verify_timeout_s: float = 5.0
    """Wall-clock limit of one verifier call in the worker (killed beyond it; the completion scores 0, "timeout")."""
    worker_memory_mb: int = 4096
    """Address-space limit of a verifier worker."""
    demo: Literal["answer", "working"] = "answer"
    """What SFT demonstrates and the prompt asks for: ``answer``, the gold answer in tags alone ("Give only the final
    answer"); ``working``, the steps that reach it, one a line, then the answer in tags ("Work it out step by step"),
    for the generators in ``WORKINGS`` (built from the item's metadata and checked against its gold answer)."""

    def __post_init__(self):
        if self.demo == "working" and self.dataset not in WORKINGS:
            raise ValueError(
                f"task.demo=working: no worked solutions for {self.dataset!r}; they exist for {sorted(WORKINGS)}. "
                "Use task.demo=answer"
            )


class ReasoningGym(Task):
    Config = ReasoningGymConfig
    version = "1"
    description = "reasoning-gym's procedural tasks and verifiers (task.dataset=<generator>, task.params.<key>=...)"
    verified_component = "format"

    cfg: ReasoningGymConfig

    @classmethod
    def choices(cls) -> list[str]:
        return [f"task.dataset={g}" for g in generators()]

    def __init__(self, cfg: ReasoningGymConfig, *args, **kwargs):
        names = generators()
        if cfg.dataset not in names:
            import difflib

            near = difflib.get_close_matches(cfg.dataset, names, n=3)
            raise ValueError(
                f"task.dataset={cfg.dataset!r} is not a reasoning-gym generator; nearest: {near}. "
                f"Available ({len(names)}): python -m bench list"
            )
        if cfg.dataset in ANY_ANSWER_WINS:
            raise ValueError(f"task.dataset={cfg.dataset} is refused: {ANY_ANSWER_WINS[cfg.dataset]} (reasoning-gym "
                             f"{rg_version()}). Choose another generator (python -m bench list).")  # fmt: skip
        check_params(cfg.dataset, dict(cfg.params))
        _SHARED.configure(_SHARED.settings["max_workers"], cfg.worker_memory_mb)
        super().__init__(cfg, *args, **kwargs)
        self.overlap_dropped = 0
        self.version = version_of(cfg)

    def _items(self, split: Split) -> list[tuple]:
        """(question, gold answer or None[, metadata with demo=working]) of each item of the split, drawn in a worker
        (fixed hash seed)."""
        req = {"op": "items", "key": self.key(split), "metadata": self.cfg.demo == "working"}
        reply = pool().call(req, GENERATE_TIMEOUT_S)
        if reply.get("status") != "ok":
            c = self.cfg
            raise ValueError(
                f"task.dataset={c.dataset} with task.params {dict(c.params)}: reasoning-gym could not draw the "
                f"{split} items ({reply.get('error', reply.get('status'))}: {reply.get('message', '')}); check the "
                "parameters"
            )
        return [tuple(x) for x in reply["items"]]

    def key(self, split: Split) -> list:
        c = self.cfg
        seed, size = (c.train_seed, c.num_train_problems) if split == "train" else (c.eval_seed, c.num_eval)
        return [c.dataset, dict(c.params), seed, size]

    def load_split(self, split: Split) -> list[Example]:
        out = []
        for i, (question, gold, *meta) in enumerate(self._items(split)):
            # gold None where many answers are right (boxnet, graph_color, ...): no demonstration
            demo = None if gold is None else f"{OPEN}{gold}{CLOSE}"
            if meta and demo is not None:
                demo = worked(self.cfg.dataset, meta[0], str(gold)) + demo
            out.append(Example(uid=f"rg/{self.cfg.dataset}/{split}/{i}", question=question,
                               answer=None if gold is None else str(gold), demonstration=demo,
                               data={"index": i, "split": split}))  # fmt: skip
        if split == "train":
            held = {e.question for e in self.eval_examples()}
            kept = [e for e in out if e.question not in held]
            self.overlap_dropped = len(out) - len(kept)
            if not kept:
                raise ValueError(
                    f"task.dataset={self.cfg.dataset} with params {dict(self.cfg.params)}: every train problem is also "
                    "an evaluation problem (the parameter space is too small to hold problems out); widen the params"
                )
            out = kept
        return out

    def instruction(self, example: Example) -> str:
        return f"{example.question}\n\n{WORKING_INSTRUCTION if self.cfg.demo == 'working' else INSTRUCTION}"

    def data_stats(self) -> dict[str, float]:
        return {**super().data_stats(), "train_overlap_dropped": self.overlap_dropped}

    def reward_time_bound_s(self) -> float:
        return self.cfg.verify_timeout_s + 1.0

    def reward(self, example: Example, completion: str) -> RewardResult:
        """The generator's ``score_answer`` on the last tagged answer, confined and bounded (module docstring).
        ``info["reason"]``: ok, no answer, answer too long, refused: <why>, timeout, crashed, error: <exception>."""

        def result(reason: str, answer: str | None, fmt: float = 0.0, score: float = 0.0) -> RewardResult:
            correct = float(score >= 1.0)
            info = {"reason": reason, "answer": None if answer is None else answer[:200]}
            return RewardResult(score=score, components={"format": fmt, "correct": correct}, info=info)

        answer = extract_answer(completion)
        if answer is None:
            return result("no answer", None)
        if not answer:
            # NOTE(deviation): several verifiers give an empty answer a format credit (0.01-0.05); here it scores 0
            return result("empty answer", answer)
        if len(answer) > MAX_ANSWER_CHARS:
            return result(f"answer too long (> {MAX_ANSWER_CHARS} chars)", answer, 1.0)
        split = example.data["split"]
        req = {"key": self.key(split), "index": example.data["index"], "answer": answer}
        reply = pool().call(req, self.cfg.verify_timeout_s)
        status = reply.get("status")
        if status != "ok":
            why = f"error: {reply.get('error')}" if status == "error" else str(status)
            return result(why + (f" (refused: {', '.join(reply['refused'])})" if reply.get("refused") else ""),
                          answer, 1.0)  # fmt: skip
        reason = f"refused: {', '.join(reply['refused'])}" if reply.get("refused") else "ok"
        return result(reason, answer, 1.0, min(max(float(reply["score"]), 0.0), 1.0))


def check_params(dataset: str, params: dict) -> None:
    """A clear error for a parameter the generator does not have (with the nearest it has), before anything runs."""
    import dataclasses
    import difflib

    from reasoning_gym.factory import DATASETS

    fields = [f.name for f in dataclasses.fields(DATASETS[dataset][1]) if f.name not in ("seed", "size")]
    for key in params:
        if key not in fields:
            near = difflib.get_close_matches(key, fields, n=1)
            raise ValueError(
                f"task.params.{key}: {dataset} has no parameter {key!r}"
                + (f"; nearest: {near[0]!r}" if near else "")
                + f". Its parameters: {', '.join(fields)}"
            )


@cache
def generators() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def version_of(cfg: ReasoningGymConfig) -> str:
    """The task's version for one configuration: this adapter's, reasoning-gym's, the generator and its parameters."""
    params = json.dumps(dict(cfg.params), sort_keys=True, default=str)
    v = f"{ReasoningGym.version}/rg{rg_version()}/{cfg.dataset}/{hashlib.sha256(params.encode()).hexdigest()[:8]}"
    return v if cfg.demo == "answer" else f"{v}/{cfg.demo}"  # the prompt differs: not comparable with answer-only


# ---- worked solutions (task.demo=working) ----------------------------------------------------------------------------
# Built from the item's metadata (the generator's own record of the problem, never model output), one step a line, and
# checked against the gold answer: a builder that disagrees with the generator raises rather than teach a wrong step.
def arithmetic_steps(expression: str) -> tuple[list[str], int]:
    """Each operation of an integer arithmetic expression (+ - * /, brackets, unary minus) as ``a op b = c``, in the
    order Python's precedence computes it, and the value. ``/`` is floor division: reasoning-gym's generators compute
    their gold answers with every ``/`` read as ``//`` (their divisions are mostly exact). Parsed with ``ast``: nothing
    is evaluated."""
    ops = {ast.Add: ("+", operator.add), ast.Sub: ("-", operator.sub), ast.Mult: ("*", operator.mul),
           ast.Div: ("/", operator.floordiv)}  # fmt: skip
    lines: list[str] = []

    def value(node) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = value(node.operand)
            if isinstance(node.op, ast.UAdd):
                return v
            if not isinstance(node.operand, ast.Constant):  # the negation of a result is a step of its own
                lines.append(f"-({v}) = {-v}")
            return -v
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            a, b = value(node.left), value(node.right)
            sym, fn = ops[type(node.op)]
            c = fn(a, b)
            lines.append(f"{a} {sym} {b} = {c}")
            return c
        raise ValueError(f"not an arithmetic expression: {ast.dump(node)[:80]}")

    return lines, value(ast.parse(expression, mode="eval").body)


def _arithmetic(meta: dict) -> tuple[list[str], str]:
    lines, v = arithmetic_steps(meta["expression"])
    return lines, str(v)


def _legs(meta: dict) -> tuple[list[str], str]:
    from reasoning_gym.arithmetic.leg_counting import ANIMALS

    counts = [(name, n, n * ANIMALS[name]) for name, n in meta["animals"].items()]
    lines = [f"{name}: {n} x {ANIMALS[name]} = {legs}" for name, n, legs in counts]
    total = sum(legs for *_, legs in counts)
    if len(counts) > 1:
        lines.append(" + ".join(str(legs) for *_, legs in counts) + f" = {total}")
    return lines, str(total)


def _gcd(meta: dict) -> tuple[list[str], str]:
    """Euclid's algorithm, pair by pair: ``a = q x b + r`` until the remainder is 0."""
    nums = [int(x) for x in meta["numbers"]]
    lines, g = [], nums[0]
    for b in nums[1:]:
        a, b = max(g, b), min(g, b)
        while b:
            lines.append(f"{a} = {a // b} x {b} + {a % b}")
            a, b = b, a % b
        g = a
    return lines, str(g)


WORKINGS = {"basic_arithmetic": _arithmetic, "chain_sum": _arithmetic, "leg_counting": _legs, "gcd": _gcd}
"""Generators with worked solutions for ``task.demo=working``: name -> metadata -> (steps, answer)."""


def worked(dataset: str, meta: dict, gold: str) -> str:
    """The worked steps of one item, one a line, ending in a newline; raises if they reach an answer other than gold."""
    lines, answer = WORKINGS[dataset](meta)
    if answer != gold.strip():
        raise ValueError(f"{dataset}: the worked solution reaches {answer}, the gold answer is {gold!r} ({meta})")
    return "".join(line + "\n" for line in lines)
