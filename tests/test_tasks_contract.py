"""Contract over the task registry: every registered task (including drop-ins) keeps these promises."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from bench.config import compose
from bench.engine.policy import char_tokenizer
from bench.registry import TASKS
from tests.conftest import data_root

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
    """Gold completions score 1 (correct), hostile/garbage/empty completions score 0 within a second each."""
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
        assert dt < 1.0, f"{name}: {dt:.2f}s on hostile input {text[:30]!r}"
        assert not task.is_correct(res) and res.score < 0.5, (name, text[:30], res.score)


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


def _databases(task) -> dict[Path, str]:
    paths = {Path(ex.answer["db_path"]) for ex in task.eval_examples() if isinstance(ex.answer, dict)
             and "db_path" in ex.answer}  # fmt: skip
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(paths)}


@pytest.mark.parametrize("name", TASKS.names())
def test_reward_fuzz_never_raises_stays_in_its_time_bound_and_leaves_databases_intact(name):
    """Hostile completions for every registered task: no exception, a score in [0, 1] (finite), each call within the
    task's ``reward_time_bound_s``; a task with databases (text-to-SQL) leaves every file byte-identical."""
    task = loaded(name, num_eval=5)
    examples = task.eval_examples()[:5]
    before = _databases(task)
    bound = task.reward_time_bound_s()
    # warm the verifier: the gold goes through it (a worker's start-up is not part of a call's bound)
    task.reward(examples[0], task.gold_completion(examples[0]) or "")

    # derandomized: the same cases on every machine, so CI and a laptop test the same inputs
    @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None, derandomize=True)
    @given(st.sampled_from(range(len(examples))).flatmap(
        lambda i: st.tuples(st.just(i), _completions(task.gold_completion(examples[i])))))  # fmt: skip
    def fuzz(case):
        i, text = case
        t0 = time.perf_counter()
        res = task.reward(examples[i], text)
        dt = time.perf_counter() - t0
        assert dt < bound, f"{name}: {dt:.2f}s > bound {bound:.2f}s on {text[:60]!r}"
        assert 0.0 <= res.score <= 1.0, (name, text[:60], res)

    fuzz()
    assert _databases(task) == before, f"{name}: a database file changed"
