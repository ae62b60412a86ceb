"""Contract over the task registry: every registered task (including drop-ins) keeps these promises."""

from __future__ import annotations

import time

import pytest
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
