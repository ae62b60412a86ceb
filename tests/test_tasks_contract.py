"""Contract over the task registry: every registered task (including drop-ins) keeps these promises."""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from bench.config import compose
from bench.engine.policy import char_tokenizer
from bench.registry import TASKS
from bench.task import RewardResult, Task, environment_names
from tests.conftest import data_root

ENVIRONMENTS = sorted(environment_names())
"""Environment tasks (multi-turn): their reward is their turns' (``step``), held to the contract below."""
ENVIRONMENT_SKIP = "an environment: scored turn by turn (test_environment_* below), not by Task.reward"

HOSTILE = [
    "",
    " ",
    "\x00" * 100,
    "garbage " * 12_500,
    "<answer>" * 10_000,
    "\\boxed{" * 10_000,
    "#### " * 20_000,
    "```sql\n" + "SELECT " * 50_000,
    "😀" * 10_000,
]


def make(name: str, num_eval: int = 20):
    cfg = compose(["algorithm=grpo", f"task={name}", f"task.num_eval={num_eval}"])
    obj = OmegaConf.to_object(cfg)
    return TASKS.get(name)(obj.task, char_tokenizer(), seed=0)


def loaded(name: str, num_eval: int = 20):
    task = make(name, num_eval)
    try:
        task.eval_examples()
    except FileNotFoundError as e:
        if data_root() is None:
            pytest.skip(f"{name} needs the data root: {e}")
        raise
    return task


@pytest.mark.parametrize("name", TASKS.names())
def test_task_has_version_and_description(name):
    cls = TASKS.get(name)
    assert cls.version and cls.version != "0", f"{name} has no version"
    assert cls.description, f"{name} has no description"


@pytest.mark.parametrize("name", TASKS.names())
def test_gold_scores_one_and_hostile_scores_zero_quickly(name):
    """Gold completions score 1 (correct), hostile/garbage/empty completions score 0, each within what bounds the
    task's reward: the time limit its verifier enforces (``reward_time_bound_s``), or for a task whose reward has no
    limit of its own the characters it reads (``scan``: nothing beyond them changes the result). Never a machine
    speed."""
    if name in ENVIRONMENTS:
        pytest.skip(ENVIRONMENT_SKIP)
    task = loaded(name)
    for ex in task.eval_examples()[:20]:
        gold = task.gold_completion(ex)
        if gold is None:
            continue
        res = task.reward(ex, gold)
        assert res.score == pytest.approx(1.0) and task.is_correct(res), (name, ex.uid, gold[:200], res)
    ex = task.eval_examples()[0]
    for text in HOSTILE:
        t0 = time.perf_counter()
        res = task.reward(ex, text)
        dt = time.perf_counter() - t0
        assert not task.is_correct(res) and res.score < 0.5, (name, text[:30], res.score)
        if task.scan is None:  # the verifier's own time limit
            assert dt < task.reward_time_bound_s(), f"{name}: {dt:.2f}s on hostile input {text[:30]!r}"
        else:  # the cap the reward reads within: what lies beyond it changes nothing
            assert_reads_only_its_scan(task, ex, text)


def assert_reads_only_its_scan(task, ex, text: str) -> None:
    """``text`` filled to exactly the task's scan length, then two different long junk strings added on the far side
    of it: the reward is the same (so its work is bounded by the scan, not the input)."""
    side, n = task.scan
    kept = (text or " ") * (n // max(len(text), 1) + 1)
    kept = kept[:n] if side == "head" else kept[-n:]
    a, b = "9 " * 40_000, "<answer>(1+2)</answer>#### 5\n" * 4_000
    x, y = (kept + a, kept + b) if side == "head" else (a + kept, b + kept)
    assert task.reward(ex, x) == task.reward(ex, y), (type(task).__name__, side, n, text[:30])


def test_every_task_is_bounded_by_a_limit_or_a_scan_cap():
    """A task whose reward_time_bound_s is the unenforced default must declare the cap its reward reads within."""

    for name in TASKS.names():
        cls = TASKS.get(name)
        assert cls.scan is not None or cls.reward_time_bound_s is not Task.reward_time_bound_s, name


@pytest.mark.parametrize("name", TASKS.names())
def test_every_prompt_renders(name):
    """Every eval example renders a non-empty plain prompt and chat instruction, and tokenizes."""
    task = loaded(name, num_eval=10_000)
    tok = task.tokenizer
    for ex in task.eval_examples():
        assert task.plain_prompt(ex).strip() and task.instruction(ex).strip(), (name, ex.uid)
        assert len(tok(task.render_prompt(ex)).input_ids) > 0


# Pieces hostile completions are built from: every task's answer markers, near-miss numbers, SQL that loops inside one
# VM instruction or writes, LaTeX that is slow to parse, control characters, long runs. Combined with the task's own
# gold completion cut and spliced, so the fuzz reaches past the format checks.
FRAGMENTS = [
    "####", "#### ", "18", "-3", "1e3", "1,000", "3 1/2", "5:30", "**", "\n", "\r\n", "\x00", " ", "😀", "\u202e",
    "<answer>", "</answer>", "(12-4)*3", "1/0", "((((((((", "9**9**9", "\\boxed{", "}", "\\frac{1}{0}",
    "\\sqrt{-1}", "10^{10^{10}}", "\\begin{pmatrix}", "```sql\n", "```", "SELECT ", "printf('%.*c', 2147483647, 'x')",
    "; DROP TABLE singer", "ATTACH DATABASE '/tmp/x' AS x", "PRAGMA writable_schema=1", "WITH RECURSIVE c(x) AS "
    "(SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c", "zeroblob(2147483647)", "3 0 7", "A" * 64,
]  # fmt: skip


def _completions(gold: str | None):
    pieces = FRAGMENTS + ([gold, gold[: len(gold) // 2], gold[len(gold) // 2 :]] if gold else [])
    spliced = st.lists(st.sampled_from(pieces), max_size=12).map("".join)
    repeated = st.tuples(st.sampled_from(pieces), st.integers(1, 2000)).map(lambda t: (t[0] * t[1])[:100_000])
    return st.one_of(st.text(max_size=300), spliced, repeated)


# Well-formed answers: the gold completion with its answer span (Task.answer_span) edited token by token, so that what
# is generated still parses and reaches the task's verifier (a query that runs, an expression that parses, LaTeX that
# math-verify reads): numbers replaced by other numbers (huge, negative, fractional), an operator by another of its
# kind, a name by another name of the same answer, a token dropped or repeated.
_TOKEN = re.compile(
    r"\d+(?:\.\d+)?|\\[A-Za-z]+|[A-Za-z_]+(?:\d+[A-Za-z_]+)*|<=|>=|!=|<>|\*\*|[-+*/^<>=]|\s+|.", re.DOTALL
)
NUMBERS = [*"0123456789", "12", "100", "2147483647", "99999999999999999999", "0.5", "3.25", "1000000"]
OPERATOR_KINDS = [["+", "-", "*", "/"], ["<", ">", "=", "<=", ">=", "!="]]


def _is_name(t: str) -> bool:
    return t[0].isalpha() or t[0] in "_\\"


def _edit(tokens: list[str], op: tuple[str, int, int]) -> list[str]:
    """One edit of ``kind`` on the ``i``-th token it applies to (modulo their number); ``j`` picks the replacement
    among those that differ from the token. No token of the kind: unchanged."""
    kind, i, j = op
    where = [k for k, t in enumerate(tokens) if {
        "number": t[0].isdigit(),
        "operator": any(t in ops for ops in OPERATOR_KINDS),
        "name": _is_name(t),
        "drop": not t.isspace(),
        "repeat": not t.isspace(),
    }[kind]]  # fmt: skip
    if not where:
        return tokens
    k = where[i % len(where)]
    t, out = tokens[k], list(tokens)
    if kind == "drop":
        del out[k]
        return out
    if kind == "repeat":
        out.insert(k, t)
        return out
    if kind == "number":
        options = NUMBERS
    elif kind == "operator":
        options = next(ops for ops in OPERATOR_KINDS if t in ops)
    else:
        options = sorted({x for x in tokens if _is_name(x)})
    options = [o for o in options if o != t] or [t]
    out[k] = options[j % len(options)]
    return out


def _well_formed(task, gold: str):
    """Completions that keep the gold's shape: its answer span edited by 1-3 token edits (see _edit)."""
    span = task.answer_span(gold) or (0, len(gold))
    head, body, tail = gold[: span[0]], gold[span[0] : span[1]], gold[span[1] :]
    tokens = _TOKEN.findall(body)
    kinds = ["number", "number", "number", "operator", "operator", "name", "drop", "repeat"]  # mostly value edits
    edit = st.tuples(st.sampled_from(kinds),
                     st.integers(0, 10_000), st.integers(0, 10_000))  # fmt: skip

    def apply(ops):
        out = tokens
        for op in ops:
            out = _edit(out, op)
        return head + "".join(out) + tail

    return st.lists(edit, min_size=1, max_size=3).map(apply)


def _files(root: Path | None) -> dict[str, str]:
    """Every file under the data root with its sha256 (databases included): any write or new file shows."""
    if root is None:
        return {}
    return {str(f): hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(root.rglob("*")) if f.is_file()}


@pytest.mark.parametrize("name", TASKS.names())
def test_reward_fuzz_never_raises_stays_in_its_time_bound_and_leaves_data_intact(name):
    """Hostile and well-formed completions for every registered task: no exception, a score in [0, 1], each call
    within the task's ``reward_time_bound_s``. The well-formed ones (the gold's answer edited token by token, on 20
    examples) must reach the verifier (the task's ``verified_component`` is 1) in at least a third of the cases and be
    judged wrong in some of those: the fuzz tests the checker, not only the format checks. Every file under the data
    root (each text-to-SQL database among them) is byte-identical afterwards, no file appears there, and the SQL
    sandbox's temporary directory stays empty."""
    from bench.sqlite_sandbox import temp_dir

    if name in ENVIRONMENTS:
        pytest.skip(ENVIRONMENT_SKIP)
    task = loaded(name, num_eval=20)
    examples = task.eval_examples()[:20]
    root = data_root()
    before = _files(root)
    bound = task.reward_time_bound_s()
    # warm the verifier: the gold goes through it (a worker's start-up is not part of a call's bound)
    task.reward(examples[0], task.gold_completion(examples[0]) or "")
    golds = [task.gold_completion(ex) for ex in examples]
    seen: list[tuple[bool, object]] = []

    def check(i: int, text: str, formed: bool) -> None:
        t0 = time.perf_counter()
        res = task.reward(examples[i], text)
        dt = time.perf_counter() - t0
        if task.scan is None:  # a limit the verifier enforces; a task with a scan cap is held to it above
            assert dt < bound, f"{name}: {dt:.2f}s > bound {bound:.2f}s on {text[:60]!r}"
        assert 0.0 <= res.score <= 1.0, (name, text[:60], res)
        seen.append((formed, res))

    # derandomized: the same cases on every machine, so CI and a laptop test the same inputs
    fuzz = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None,
                    derandomize=True)  # fmt: skip
    pick = st.sampled_from(range(len(examples)))
    fuzz(given(pick.flatmap(lambda i: st.tuples(st.just(i), _completions(golds[i]))))(
        lambda drawn: check(*drawn, formed=False)))()  # fmt: skip
    usable = [i for i, g in enumerate(golds) if g]
    if usable:
        fuzz(given(st.sampled_from(usable).flatmap(lambda i: st.tuples(st.just(i), _well_formed(task, golds[i]))))(
            lambda drawn: check(*drawn, formed=True)))()  # fmt: skip
    after = _files(root)
    assert after.keys() == before.keys(), f"{name}: files appeared or vanished: {set(after) ^ set(before)}"
    assert after == before, f"{name}: changed: {[f for f in before if after[f] != before[f]]}"
    sandbox_tmp = temp_dir()
    assert not any(sandbox_tmp.iterdir()), list(sandbox_tmp.iterdir())
    comp = type(task).verified_component
    formed = [r for f, r in seen if f]
    if comp is None or not any(golds):
        return
    reached = [r for r in formed if r.components.get(comp) == 1.0]
    print(f"{name}: {len(reached)}/{len(formed)} reached {comp}, {sum(r.score < 1 for r in reached)} judged wrong")
    assert len(formed) >= 15, f"{name}: only {len(formed)} well-formed cases were drawn"
    assert len(reached) >= len(formed) / 3, f"{name}: {len(reached)}/{len(formed)} well-formed cases reached {comp}"
    assert any(r.score < 1.0 for r in reached), f"{name}: no well-formed answer reached the verifier and was wrong"


@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_environment_demonstrations_reach_one_and_hostile_actions_are_ordinary_turns(name, tmp_path):
    """An environment's demonstrations, replayed through reset and step, score 1 where they are all-right (its
    error knob at 0 by default); every hostile action is an ordinary turn: no exception, a reward in [0, 1], no file
    written, and, for a task that declares ``scan``, nothing past the cap changes the turn."""
    task = loaded(name)
    data_before = _files(data_root())
    for ex in task.eval_examples()[:20]:
        if not ex.demonstration:
            continue
        _, state = task.reset(ex, 0)
        turns = [task.step(state, a) for a in ex.demonstration]
        res = RewardResult(sum(t.reward for t in turns), turns[-1].components)
        assert turns[-1].done and task.is_correct(res), (name, ex.uid, ex.demonstration, res)
    ex = task.eval_examples()[0]
    marker = tmp_path / "x"
    hostile = [*HOSTILE, f"__import__('os').system('touch {marker}')", f"open('{marker}', 'w')",
               "().__class__.__base__.__subclasses__()"]  # fmt: skip
    for text in hostile:
        _, state = task.reset(ex, 0)
        t0 = time.perf_counter()
        turn = task.step(state, text)
        dt = time.perf_counter() - t0
        assert 0.0 <= turn.reward <= 1.0, (name, text[:30], turn)
        if task.scan is None:
            assert dt < task.reward_time_bound_s(), f"{name}: {dt:.2f}s on hostile action {text[:30]!r}"
        else:
            side, n = task.scan
            kept = ((text or " ") * (n // max(len(text), 1) + 1))[:n]
            outcomes = []
            for junk in ("9 " * 40_000, "left right up down SELECT 1; " * 3_000):
                _, state = task.reset(ex, 0)
                outcomes.append(task.step(state, kept + junk if side == "head" else junk + kept))
            assert outcomes[0] == outcomes[1], (name, text[:30])
    assert not marker.exists() and _files(data_root()) == data_before
