"""Countdown: combine the given numbers with + - * / to reach a target, using each number exactly once.

Reference setup: TinyZero (Jiayi Pan et al., https://github.com/Jiayi-Pan/TinyZero, data
``Jiayi-Pan/Countdown-Tasks-3to4``), the small-scale "aha moment" RL recipe. One literal record, as stored in
``<data_root>/countdown/cd3_test.jsonl``::

    {"target": 23, "nums": [30, 100, 93]}          # one gold answer: <answer>30-(100-93)</answer>

Reward in one sentence: the last complete ``<answer>EXPR</answer>`` block scores 1.0 iff EXPR is an arithmetic
expression over integer literals with + - * / and parentheses only, uses exactly the multiset ``nums``, and equals
``target`` exactly; anything else scores 0.0.

version = "2"
    1: initial version (generated problems with hash-assigned splits; AST reward with exact Fraction arithmetic).
    2: generated test split 15 % of problems (was 5 %), so the default evaluation holds 1000 problems: the hash
       buckets moved, every generated split changed (rewards unchanged).

Answer format: ``<answer>(3+5)*7</answer>``. Only digits, ``+ - * / ( )`` and ASCII whitespace are allowed between
the tags; no unary minus, no ``=``, no decimals, no ``**`` or ``//``.

Data: by default problems are generated from ``gen_seed`` (a data seed independent of the run seed, so every run sees
the same problems) and assigned to train/val/test by a stable hash of ``(sorted nums, target)``, so the splits are
disjoint by construction. With ``source=<stem>`` the eval splits are ``<data_root>/countdown/<stem>.jsonl`` instead
(val = test = that file) and training still uses the generated train split, minus any problem in that file.

Prompts: chat models get a natural-language ``instruction``. ``plain_prompt`` (tokenizers without a chat template,
in practice the tiny character-level random-init model where every character is a token) is deliberately terse,
``"nums 3 5 7 target 56\\n"``, so prompts stay a few dozen tokens; the model learns the answer format from the
demonstrations, not from the prompt.

Deviations from the reference reward (TinyZero ``countdown.py``), per docs/field-notes.md "Rewards":
``# NOTE(deviation)`` it searches the completion's last MAX_SCAN_CHARS for the last complete block instead of only
the last line, parses with an AST allow-list instead of ``eval``, bounds the input size and nesting depth, and
compares exactly (``fractions.Fraction``) instead of with a float tolerance of 1e-5.
"""

from __future__ import annotations

import ast
import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Literal

from bench.task import Example, RewardResult, Split, Task, TaskConfig, hash_unit, read_jsonl

# ---- answer parsing -----------------------------------------------------------------------------------------------

OPEN_TAG, CLOSE_TAG = "<answer>", "</answer>"
MAX_SCAN_CHARS = 16_384
"""Only this tail of a completion is searched (about 4k tokens of text, so an answer followed by a long ramble is
still found); str.rfind over it is linear and in C, so a 100 kB completion costs the same as a 16 kB one."""
MAX_EXPR_CHARS = 256
"""Longer answers are rejected before parsing; a real answer for <= 6 numbers is a few dozen characters."""
MAX_DEPTH = 32
"""Bound on parenthesis nesting and on AST depth: keeps ast.parse and the recursive walk far from recursion limits."""

# Cheap pre-filter before ast.parse: ASCII digits, the four operators, parentheses and ASCII whitespace. It rejects
# names, calls, attributes, floats, hex/underscore literals and non-ASCII digits (which str.isdigit would accept).
_ALLOWED_CHARS = re.compile(r"[0-9+\-*/() \t\r\n]*")
_WHITESPACE = re.compile(r"[ \t\r\n]+")

# The example expression shown in `instruction`: echoing it must not earn the format component (field notes:
# "Format rewards must not match text that the prompt itself contains").
PROMPT_EXAMPLE_EXPR = "(1+2)/3"

Tree = int | tuple[str, "Tree", "Tree"]
"""An expression tree: an int leaf or ``(op, left, right)`` with op in ``+ - * /``."""

_AST_OPS: dict[type, str] = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}


def extract_answer(completion: str) -> str | None:
    """The text inside the last complete ``<answer>...</answer>`` block of the completion's tail, or None."""
    tail = completion[-MAX_SCAN_CHARS:]
    end = tail.rfind(CLOSE_TAG)
    if end < 0:
        return None
    start = tail.rfind(OPEN_TAG, 0, end)  # the nearest opening tag before it, so "<answer>a<answer>b</answer>" -> b
    if start < 0:
        return None
    return tail[start + len(OPEN_TAG) : end]


def answer_span(completion: str) -> tuple[int, int] | None:
    """Character span [start, end) of the block ``extract_answer`` reads, tags included, in the whole completion's
    coordinates; None without a complete block."""
    offset = max(len(completion) - MAX_SCAN_CHARS, 0)
    tail = completion[offset:]
    end = tail.rfind(CLOSE_TAG)
    start = tail.rfind(OPEN_TAG, 0, end) if end >= 0 else -1
    return None if start < 0 else (offset + start, offset + end + len(CLOSE_TAG))


def parse_expression(expr: str) -> Tree:
    """Parse an answer into a Tree. Raises ValueError (short reason) or SyntaxError on anything not allowed."""
    if len(expr) > MAX_EXPR_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPR_CHARS} chars")
    if not _ALLOWED_CHARS.fullmatch(expr):
        raise ValueError("disallowed character")
    depth = deepest = 0
    for ch in expr:  # checked before ast.parse, whose own limits raise MemoryError/RecursionError far later
        depth += (ch == "(") - (ch == ")")
        deepest = max(deepest, depth)
    if deepest > MAX_DEPTH:
        raise ValueError(f"parentheses nested deeper than {MAX_DEPTH}")
    # Newlines are legal only inside brackets in eval mode; a space keeps "3 5" two tokens (a syntax error).
    source = _WHITESPACE.sub(" ", expr).strip()
    return _to_tree(ast.parse(source, mode="eval").body, 0)


def _to_tree(node: ast.AST, depth: int) -> Tree:
    """Allow-list walk: BinOp(+ - * /) and int Constants only (bool is an int subclass, so it is excluded by name)."""
    if depth > MAX_DEPTH:
        raise ValueError(f"expression deeper than {MAX_DEPTH}")
    if isinstance(node, ast.BinOp) and type(node.op) in _AST_OPS:
        return (_AST_OPS[type(node.op)], _to_tree(node.left, depth + 1), _to_tree(node.right, depth + 1))
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    what = type(node.op).__name__ if isinstance(node, ast.BinOp) else type(node).__name__
    raise ValueError(f"disallowed {what}")


def evaluate(tree: Tree) -> Fraction:
    """Exact value of a tree. Raises ZeroDivisionError."""
    if isinstance(tree, int):
        return Fraction(tree)
    op, left, right = tree
    a, b = evaluate(left), evaluate(right)
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return a / b


def leaves(tree: Tree) -> list[int]:
    """The integer literals of a tree, left to right."""
    if isinstance(tree, int):
        return [tree]
    return leaves(tree[1]) + leaves(tree[2])


def to_expr(tree: Tree) -> str:
    """Print a tree with only the parentheses its value needs: ``(3+5)*7``, ``12/(6-4)``, ``3-(5-7)``, ``3+5+7``.

    A left child needs parentheses when it binds looser than its parent; a right child also when it binds equally
    and the parent is ``-`` or ``/`` (not associative). ``a*(b/c)`` prints as ``a*b/c``: a different tree with the
    same exact value, which is all the reward reads.
    """
    if isinstance(tree, int):
        return str(tree)
    op, left, right = tree
    ls, rs = to_expr(left), to_expr(right)
    if not isinstance(left, int) and _PREC[left[0]] < _PREC[op]:
        ls = f"({ls})"
    if not isinstance(right, int) and (_PREC[right[0]] < _PREC[op] or (_PREC[right[0]] == _PREC[op] and op in "-/")):
        rs = f"({rs})"
    return f"{ls}{op}{rs}"


# ---- problems -----------------------------------------------------------------------------------------------------


def problem_key(nums: Sequence[int], target: int) -> str:
    """Canonical identity of a problem: the number order shown to the model does not make a new problem."""
    return ",".join(map(str, sorted(nums))) + "=" + str(target)


def split_of(nums: Sequence[int], target: int, test_share: float = 0.15, val_share: float = 0.05) -> Split:
    """Stable split by hash of the canonical key (hashlib, not hash(), which is salted per process): a share
    ``test_share`` of problems to test, ``val_share`` to val, the rest to train."""
    u = hash_unit(problem_key(nums, target))
    return "test" if u < test_share else "val" if u < test_share + val_share else "train"


def random_tree(rng: random.Random, nums: Sequence[int]) -> tuple[Tree, int]:
    """Combine random pairs until one node is left, using every number once; every intermediate value is a positive
    integer (``-`` only when the result is positive, ``/`` only when exact), so the demonstration is human-checkable.
    Returns ``(tree, value)``."""
    nodes: list[tuple[int, Tree]] = [(n, n) for n in nums]
    while len(nodes) > 1:
        i, j = rng.sample(range(len(nodes)), 2)  # ordered pair: the order of operands is random too
        (a, ta), (b, tb) = nodes[i], nodes[j]
        ops = ["+", "*"] + (["-"] if a > b else []) + (["/"] if a % b == 0 else [])
        op = rng.choice(ops)
        value = a + b if op == "+" else a * b if op == "*" else a - b if op == "-" else a // b
        nodes = [n for k, n in enumerate(nodes) if k not in (i, j)] + [(value, (op, ta, tb))]
    value, tree = nodes[0]
    return tree, value


def solve(nums: Sequence[int], target: int) -> str | None:
    """Exhaustive exact search (all orderings, all binary trees, + - * /, Fraction arithmetic, negative and fractional
    intermediates allowed as the reward allows them). Returns a minimally parenthesised expression or None."""
    if not nums:
        return None
    failed: set[tuple[Fraction, ...]] = set()  # value multisets already shown to miss the target

    def search(items: list[tuple[Fraction, Tree]]) -> Tree | None:
        if len(items) == 1:
            return items[0][1] if items[0][0] == target else None
        key = tuple(sorted(v for v, _ in items))
        if key in failed:
            return None
        for i in range(len(items)):
            for j in range(i + 1, len(items)):
                (a, ta), (b, tb) = items[i], items[j]
                rest = items[:i] + items[i + 1 : j] + items[j + 1 :]
                cands = [(a + b, ("+", ta, tb)), (a * b, ("*", ta, tb)), (a - b, ("-", ta, tb)), (b - a, ("-", tb, ta))]
                if b:
                    cands.append((a / b, ("/", ta, tb)))
                if a:
                    cands.append((b / a, ("/", tb, ta)))
                for value, tree in cands:
                    found = search([*rest, (value, tree)])
                    if found is not None:
                        return found
        failed.add(key)
        return None

    tree = search([(Fraction(n), n) for n in nums])
    return None if tree is None else to_expr(tree)


def question_text(nums: Sequence[int], target: int) -> str:
    return f"Using the numbers {list(nums)}, create an equation that equals {target}."


def make_example(uid: str, nums: Sequence[int], target: int, expr: str | None, source: str) -> Example:
    nums = tuple(int(n) for n in nums)
    demo = None if expr is None else f"{OPEN_TAG}{expr}{CLOSE_TAG}"
    return Example(
        uid=uid,
        question=question_text(nums, target),
        answer={"target": int(target), "nums": nums},
        demonstration=demo,
        data={"target": int(target), "nums": nums, "source": source, "solvable": expr is not None},
    )


def generate(cfg: CountdownConfig) -> dict[str, list[Example]]:
    """``cfg.num_generated`` seeded draws, deduplicated by problem_key (first draw wins), split by hash."""
    rng = random.Random(cfg.gen_seed)
    seen: set[str] = set()
    out: dict[str, list[Example]] = {"train": [], "val": [], "test": []}
    for _ in range(cfg.num_generated):
        n = rng.randint(cfg.num_count_min, cfg.num_count_max)
        nums = [rng.randint(1, cfg.max_number) for _ in range(n)]
        tree, target = random_tree(rng, nums)
        key = problem_key(nums, target)
        if not 1 <= target <= cfg.max_target or key in seen:
            continue
        seen.add(key)
        split = split_of(nums, target, cfg.test_share, cfg.val_share)
        out[split].append(make_example(f"cd-{split}-{len(out[split])}", nums, target, to_expr(tree), "generated"))
    return out


def demo_is_wrong(example: Example, cfg: CountdownConfig) -> bool:
    """Whether ``task.demo_error_rate`` picks this problem for a wrong demonstration (a stable hash share)."""
    key = problem_key(example.answer["nums"], example.answer["target"])
    return hash_unit(f"wrong-demo|{cfg.gen_seed}|{key}") < cfg.demo_error_rate


def wrong_demonstration(example: Example, cfg: CountdownConfig) -> Example | None:
    """The example with a demonstration that uses every number once and misses the target (a random equation of its
    numbers, seeded by the problem); None when 20 draws all hit the target."""
    nums, target = example.answer["nums"], example.answer["target"]
    rng = random.Random(f"{cfg.gen_seed}|{problem_key(nums, target)}")
    for _ in range(20):
        tree, value = random_tree(rng, nums)
        if value != target:
            return replace(example, demonstration=f"{OPEN_TAG}{to_expr(tree)}{CLOSE_TAG}")
    return None


def data_path(data_root: str | None, source: str) -> Path:
    """``<data_root>/countdown/<source>.jsonl``; FileNotFoundError with the fix when it is not there."""
    hint = (
        "Set BENCH_DATA or task.data_root to the directory that holds countdown/ (e.g. ../shared/data), "
        "or use task.source=generated."
    )
    if data_root is None:
        raise FileNotFoundError(
            f"countdown source {source!r} needs <data_root>/countdown/{source}.jsonl but "
            f"task.data_root is not set. {hint}"
        )
    path = Path(data_root) / "countdown" / f"{source}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"countdown data file not found: {path.resolve()}. {hint}")
    return path


def load_jsonl(path: Path) -> list[tuple[tuple[int, ...], int]]:
    """Rows ``{"target": int, "nums": [int, ...]}``; malformed rows fail loudly with file and line."""
    rows = []
    for lineno, rec in enumerate(read_jsonl(path, ("target",), int), 1):
        nums, target = rec.get("nums"), rec["target"]
        if not (isinstance(nums, list) and nums and all(type(n) is int for n in nums)):
            raise ValueError(f"{path}: record {lineno}: expected {{'target': int, 'nums': [int, ...]}}, got {rec!r}")
        rows.append((tuple(nums), target))
    return rows


# ---- reward -------------------------------------------------------------------------------------------------------


def reward(example: Example, completion: str) -> RewardResult:
    """1.0 iff the last complete <answer> block is an allowed expression over exactly ``nums`` equal to ``target``.

    Components: ``format`` (an answer block holds a parseable allowed expression, not the prompt's own example),
    ``uses_numbers`` (its literals are exactly the multiset ``nums``), ``correct`` (= score). Never raises on model
    output; cost is bounded by MAX_SCAN_CHARS and MAX_EXPR_CHARS.
    """
    nums, target = example.answer["nums"], example.answer["target"]

    def result(reason: str, expr: str | None, fmt: float = 0.0, uses: float = 0.0, correct: float = 0.0):
        return RewardResult(
            score=correct,
            components={"format": fmt, "uses_numbers": uses, "correct": correct},
            info={"expr": expr, "reason": reason},
        )

    expr = extract_answer(completion)
    if expr is None:
        return result("no complete <answer> block", None)
    try:
        tree = parse_expression(expr)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError) as e:
        reason = e.msg if isinstance(e, SyntaxError) and e.msg else str(e) or type(e).__name__
        return result(f"unparseable: {reason}"[:120], expr[:MAX_EXPR_CHARS])
    uses = float(Counter(leaves(tree)) == Counter(nums))
    try:
        value = evaluate(tree)
    except ZeroDivisionError:
        return result("division by zero", expr, 1.0, uses)
    # NOTE(deviation): exact Fraction equality, not |value - target| < 1e-5 (TinyZero): with exact arithmetic a
    # tolerance only admits near misses such as 7*10000001/10000000 for target 7.
    correct = float(uses == 1.0 and value == target)
    if not correct and _WHITESPACE.sub("", expr) == PROMPT_EXAMPLE_EXPR:
        return result("copied the prompt's example", expr, 0.0, uses)
    reason = "ok" if correct else "wrong numbers" if not uses else f"value {value} != {target}"
    return result(reason, expr, 1.0, uses, correct)


# ---- DataModule ---------------------------------------------------------------------------------------------------


@dataclass
class CountdownConfig(TaskConfig):
    name: str = "countdown"
    """Registry name of the task."""
    source: str = "generated"
    """Eval data: "generated", or a jsonl stem under <data_root>/countdown, e.g. "cd3_test" or "tinyzero_test"."""
    num_count_min: int = 3
    """Fewest numbers per generated problem."""
    num_count_max: int = 3
    """Most numbers per generated problem."""
    max_number: int = 20
    """Generated numbers are drawn uniformly from 1..max_number (with repetition)."""
    max_target: int = 100
    """Generated problems keep only targets in 1..max_target."""
    num_generated: int = 20000
    """Random draws before deduplication and the split. Fewer problems survive: the default space (3 numbers <= 20,
    target <= 100) holds only 16,292 distinct problems, and draws over max_target are dropped; the defaults yield
    7,329 problems (5,896 train / 358 val / 1,075 test)."""
    gen_seed: int = 1234
    """Data seed, independent of the run seed so that all runs share the same problems."""
    demo_error_rate: float = 0.0
    """Share of training problems (hash-chosen, the same in every run) whose SFT demonstration is a well-formed wrong
    equation: every number once, a value other than the target. A partial-demonstration warm start: the model learns
    the format and, from the rest, how to reach a target, but puts mass on wrong answers that RL can move. RL
    prompts and the evaluation are unchanged."""
    demo_error_mode: Literal["replace", "add"] = "replace"
    """replace: a chosen problem's right demonstration is replaced by the wrong one; add: it is kept and the wrong one
    added beside it (the warm start sees every right demonstration, and the chosen problems twice, right and wrong)."""
    test_share: float = 0.15
    """Share of generated problems in the test split (by hash): 15 % of the default 7,329 gives 1,075, enough for
    the default 1000-problem evaluation (binomial SE 0.015 at p = 0.4; results/eval_noise.md)."""
    val_share: float = 0.05
    """Share of generated problems in the val split (by hash)."""

    def __post_init__(self) -> None:
        if not 1 <= self.num_count_min <= self.num_count_max:
            raise ValueError(
                f"need 1 <= num_count_min <= num_count_max, got {self.num_count_min}, {self.num_count_max}"
            )
        if not (0 < self.test_share and 0 <= self.val_share and self.test_share + self.val_share < 1):
            raise ValueError(f"need 0 < test_share, 0 <= val_share, sum < 1; got {self.test_share}, {self.val_share}")
        if not 0 <= self.demo_error_rate <= 1:
            raise ValueError(f"task.demo_error_rate must be in [0, 1], got {self.demo_error_rate}")
        for field_name in ("max_number", "max_target", "num_generated"):
            if getattr(self, field_name) < 1:
                raise ValueError(f"{field_name} must be >= 1, got {getattr(self, field_name)}")
        # The stem becomes a path component: no separators, so a config cannot point outside <data_root>/countdown.
        if not re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*", self.source):
            raise ValueError(f"source must be 'generated' or a jsonl file stem, got {self.source!r}")


class Countdown(Task):
    scan = ("tail", MAX_SCAN_CHARS)  # the reward reads no more (Task.scan)
    Config = CountdownConfig
    version = "2"
    description = "Reach a target with + - * / using each given number exactly once (TinyZero Countdown)."
    verified_component = "format"

    cfg: CountdownConfig

    def __init__(self, cfg: CountdownConfig, tokenizer=None, **kwargs) -> None:
        super().__init__(cfg, tokenizer, **kwargs)
        self._generated: dict[str, list[Example]] | None = None
        self._loaded: list[Example] | None = None

    def load_split(self, split: Split) -> list[Example]:
        if self._generated is None:
            self._generated = generate(self.cfg)
        if self.cfg.source == "generated":
            return list(self._generated[split])
        if self._loaded is None:
            path = data_path(self.cfg.data_root, self.cfg.source)
            self._loaded = [
                make_example(f"cd-{self.cfg.source}-{i}", nums, target, solve(nums, target), self.cfg.source)
                for i, (nums, target) in enumerate(load_jsonl(path))
            ]
        if split == "train":
            held_out = {problem_key(e.answer["nums"], e.answer["target"]) for e in self._loaded}
            return [
                e for e in self._generated["train"] if problem_key(e.answer["nums"], e.answer["target"]) not in held_out
            ]
        return list(self._loaded)

    def demonstrations(self) -> list[Example]:
        demos = super().demonstrations()
        if self.cfg.demo_error_rate == 0:
            return demos
        wrong = [wrong_demonstration(e, self.cfg) if demo_is_wrong(e, self.cfg) else None for e in demos]
        if self.cfg.demo_error_mode == "add":
            return demos + [w for w in wrong if w is not None]
        return [w or e for w, e in zip(wrong, demos, strict=True)]

    def instruction(self, example: Example) -> str:
        return (
            f"{example.question} You can use + - * / and each number exactly once. Give the final equation "
            f"in <answer></answer> tags, for example <answer>{PROMPT_EXAMPLE_EXPR}</answer>."
        )

    def plain_prompt(self, example: Example) -> str:
        nums, target = example.answer["nums"], example.answer["target"]
        return "nums " + " ".join(map(str, nums)) + " target " + str(target) + "\n"

    def reward(self, example: Example, completion: str) -> RewardResult:
        return reward(example, completion)

    def answer_span(self, completion: str) -> tuple[int, int] | None:
        return answer_span(completion)
