"""reasoning-gym as a task (tasks/reasoning_gym.py): every generator's gold answers score 1, malformed completions
score 0, hostile answers run nothing, and every call returns within its bound.

The reward calls reasoning-gym's own verifiers, some of which ``eval`` the answer or pass it to ``sympy.parse_expr``.
Each hostile answer below would write a marker file, start a process, open a socket or hang the trainer if it reached
an unconfined ``eval``; the tests run all of them through every generator and look for the marker, for children of
the workers, and at the clock."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from omegaconf import OmegaConf

pytest.importorskip("reasoning_gym")

from bench.config import compose  # noqa: E402
from bench.engine.policy import char_tokenizer  # noqa: E402
from bench.registry import TASKS  # noqa: E402
from tasks import reasoning_gym as RG  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 2.0
NO_GOLD = {"boxnet", "graph_color", "propositional_logic", "rubiks_cube", "rush_hour"}
"""Generators whose items carry no gold answer (many answers are right; the verifier checks validity): no SFT."""


def make(dataset: str, n: int = 2, **params):
    extra = [f"task.params.{k}={v}" for k, v in params.items()]
    cfg = compose(["task=reasoning_gym", f"task.dataset={dataset}", f"task.num_eval={n}",
                   f"task.num_train_problems={n}", f"task.verify_timeout_s={TIMEOUT_S}", *extra])  # fmt: skip
    return TASKS.get("reasoning_gym")(OmegaConf.to_object(cfg.task), char_tokenizer(), seed=0)


BUILDS = [g for g in RG.generators() if g != "composite" and g not in RG.ANY_ANSWER_WINS]  # composite: its own test


def hostile(marker: Path) -> list[str]:
    m = str(marker)
    return [
        f"__import__('os').system('touch {m}')",
        f"[__import__('os').system('touch {m}')]",
        f"(lambda: __import__('os').system('touch {m}'))()",
        f"getattr(__builtins__, '__imp' + 'ort__')('os').system('touch {m}')",
        f"[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == 'Popen'][0](['touch', '{m}'])",
        "().__class__.__base__.__subclasses__()",
        f"open('{m}', 'w').write('x')",
        f"exec('import os; os.system(\"touch {m}\")')",
        f"eval(compile('import os\\nos.system(\"touch {m}\")', 'x', 'exec'))",
        f"x**2 + __import__('subprocess').call(['touch', '{m}'])",
        f"sin(x).__class__.__mro__[-1].__subclasses__()[0]('{m}')",
        f"[1, 2, open('{m}', 'w')]",
        f"{{'a': __import__('os').system('touch {m}')}}",
        f"x + (lambda f: f('os').system('touch {m}'))(__import__)",
        f"__import__('pty').spawn(['touch', '{m}'])",
        "__import__('socket').create_connection(('1.1.1.1', 80), timeout=1)",
        f"__import__('ctypes').CDLL(None).system(b'touch {m}')",
        f"__import__('os').kill({psutil.Process().pid}, 9)",  # the trainer itself
        "9" * 4_000,  # a long number the verifiers do read
        "9" * 100_000,  # longer than any answer is scored
        "(" * 5_000 + "1" + ")" * 5_000,  # deeply nested
        "[" * 3_000 + "]" * 3_000,
        "9**9**9**9",
        "2**(10**10) + x",
    ]


def worker_children() -> list[psutil.Process]:
    out = []
    for pid in RG.pool().pids():
        try:
            out += psutil.Process(pid).children(recursive=True)
        except psutil.NoSuchProcess:
            pass
    return out


def test_the_registry_and_bench_list_show_the_generators():
    out = subprocess.run([sys.executable, "-m", "bench", "list"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "reasoning_gym" in out.stdout
    for name in ("basic_arithmetic", "spell_backward", "countdown", "n_queens"):
        assert f"reasoning_gym task.dataset={name}" in out.stdout, out.stdout[-2000:]
    assert len(BUILDS) >= 100


@pytest.mark.slow
@pytest.mark.parametrize("dataset", BUILDS)
def test_every_generator_gold_scores_one_and_malformed_scores_zero(dataset):
    task = make(dataset)
    ex = task.eval_examples()
    for e in ex:
        if dataset in NO_GOLD:
            assert e.answer is None and e.demonstration is None
            continue
        r = task.reward(e, "Let me think.\n" + e.demonstration)
        assert r.score == 1.0 and r.components["correct"] == 1.0, (dataset, e.answer, r.info)
    assert (dataset in NO_GOLD) == all(e.demonstration is None for e in ex)
    e = ex[0]
    if dataset not in NO_GOLD:  # a wrong answer does not win (game_of_life_halting's did: refused, tested below)
        for junk in ("zzz", "0", "[]", "None"):
            if junk != e.answer:
                assert task.reward(e, f"{RG.OPEN}{junk}{RG.CLOSE}").score < 1.0, (dataset, junk)
    gold = e.demonstration or f"{RG.OPEN}x{RG.CLOSE}"
    for completion in ("", gold[: len(gold) // 2], gold.replace(RG.CLOSE, ""), "<answer></answer>", "<answer>"):
        r = task.reward(e, completion)
        assert r.score == 0.0, (dataset, completion, r)


def test_the_gold_of_the_evaluating_generators_scores_one_through_the_guards():
    for dataset in sorted(RG.EVAL_VERIFIERS | RG.PARSE_EXPR_VERIFIERS):
        task = make(dataset, 3)
        for e in task.eval_examples():
            r = task.reward(e, e.demonstration)
            assert r.score == 1.0 and r.info["reason"] == "ok", (dataset, e.answer, r.info)


def test_the_guards_take_literals_and_plain_expressions_only():
    assert RG.literal_ok("['_Q__', '___Q']") and RG.literal_ok("[[1, 0], [0, 1]]") and RG.literal_ok("'a'")
    for bad in ("__import__('os')", "[1, open('x')]", "(lambda: 1)()", "1 if x else 2", "9**9"):
        assert not RG.literal_ok(bad), bad
    for good in ("x**2/2 + sin(x) + C", "(3 + 5) * 2 - 7", "-20*x**3 + 4.5*x", "exp(2*x)/2 + log(x)", "sqrt(x)*pi"):
        assert RG.expression_ok(good), good
    for bad in ("__import__('os')", "x.__class__", "Symbol('x')", "sin(x).func", "lambda: 1", "x; y", "eval('1')",
                "x.y", "[x]", "{x}", "Function('f')", "x if y else z"):  # fmt: skip
        assert not RG.expression_ok(bad), bad


@pytest.mark.parametrize("dataset", ["basic_arithmetic", "n_queens", "simple_integration", "countdown"])
def test_hostile_answers_run_nothing_and_return_within_the_bound(dataset, tmp_path):
    _hostile_battery(dataset, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("dataset", BUILDS)
def test_hostile_answers_run_nothing_through_any_generator(dataset, tmp_path):
    _hostile_battery(dataset, tmp_path)


def _hostile_battery(dataset: str, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    task = make(dataset, 1)
    e = task.eval_examples()[0]
    RG.pool().warm_up()
    bound = task.reward_time_bound_s()
    for answer in hostile(marker):
        t0 = time.perf_counter()
        r = task.reward(e, f"{RG.OPEN}{answer}{RG.CLOSE}")
        took = time.perf_counter() - t0
        assert took <= bound, (dataset, answer[:60], took, r.info)
        assert not marker.exists(), (dataset, answer[:60], "wrote a file")
        assert not worker_children(), (dataset, answer[:60], "started a process")
        if r.info["reason"] in ("timeout", "crashed"):
            RG.pool().warm_up()  # the bound is per call with a warm worker; a replacement's start-up is not in it
    assert psutil.Process().is_running()


def test_a_confined_worker_cannot_write_fork_or_connect_even_from_code_that_runs():
    """The second layer alone: code running inside a confined process (as a missed case of the screen would)."""
    code = (
        "import sys, os, ctypes; sys.path.insert(0, sys.argv[1]); libc = ctypes.CDLL(None)\n"
        "from bench.sandbox import confine; confine()\n"
        "out = []\n"
        "for f in (lambda: open(sys.argv[2], 'w'), lambda: os.system('touch ' + sys.argv[2]), lambda: os.fork(),\n"
        "          lambda: __import__('socket').socket()):\n"
        "    try: f(); out.append('ran')\n"
        "    except PermissionError: out.append('refused')\n"
        "out.append(libc.open(sys.argv[2].encode(), 0o101, 0o644))\n"  # C-level, past the audit hook: seccomp
        "out.append(libc.syscall(57))\n"  # fork
        "out.append(libc.socket(2, 1, 0))\n"
        "print(out)\n"
    )
    marker = Path(f"/tmp/rg-confine-{psutil.Process().pid}")
    p = subprocess.run([sys.executable, "-c", code, str(ROOT), str(marker)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "['refused', 'refused', 'refused', 'refused', -1, -1, -1]", p.stdout
    assert not marker.exists()


def test_the_evaluation_set_is_the_same_in_another_process():
    code = (
        "import hashlib, sys; sys.path.insert(0, sys.argv[1]); from tests.test_reasoning_gym import make\n"
        "t = make('basic_arithmetic', 50, min_terms=2, max_terms=3)\n"
        "print(hashlib.sha256(repr([(e.question, e.answer) for e in t.eval_examples()]).encode()).hexdigest())"
    )
    p = subprocess.run([sys.executable, "-c", code, str(ROOT)], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    here = make("basic_arithmetic", 50, min_terms=2, max_terms=3).eval_examples()
    assert (
        p.stdout.strip().splitlines()[-1]
        == hashlib.sha256(repr([(e.question, e.answer) for e in here]).encode()).hexdigest()
    )


def test_train_and_evaluation_never_share_a_problem_and_the_version_names_the_params():
    t = make("basic_arithmetic", 100, min_terms=2, max_terms=2, min_digits=1, max_digits=1)
    held = {e.question for e in t.eval_examples()}
    train = t.examples("train")
    assert not held & {e.question for e in train}
    assert t.data_stats()["train_overlap_dropped"] > 0  # one-digit sums: only a few hundred problems exist
    other = make("basic_arithmetic", 100, min_terms=2, max_terms=3)
    assert t.version != other.version and t.version.startswith(f"1/rg{RG.rg_version()}/basic_arithmetic/")
    assert make("basic_arithmetic", 100, min_terms=2, max_terms=3).version == other.version


def test_a_generator_whose_verifier_rewards_any_answer_is_refused():
    with pytest.raises(ValueError, match=r"game_of_life_halting is refused: .*every non-empty answer scores 1"):
        make("game_of_life_halting")


def test_bad_names_and_params_say_what_to_use():
    with pytest.raises(ValueError, match=r"not a reasoning-gym generator; nearest: \['basic_arithmetic'"):
        make("basic_arithmetik")
    with pytest.raises(
        ValueError, match=r"task.params.max_digit: basic_arithmetic has no parameter .*nearest: 'max_digits'"
    ):
        make("basic_arithmetic", max_digit=2)
    with pytest.raises(ValueError, match=r"task.dataset=composite .*could not draw.*at least one dataset"):
        make("composite").eval_examples()


def test_composite_mixes_generators_by_weight():
    mix = "[{name: chain_sum, weight: 1, config: {}}, {name: spell_backward, weight: 1, config: {}}]"
    cfg = compose(["task=reasoning_gym", "task.dataset=composite", "task.num_eval=40", f"task.params.datasets={mix}"])
    t = TASKS.get("reasoning_gym")(OmegaConf.to_object(cfg.task), char_tokenizer(), seed=0)
    ex = t.eval_examples()
    assert len(ex) == 40
    assert all(t.reward(e, e.demonstration).score == 1.0 for e in ex)


# ---- worked solutions (task.demo=working) ----------------------------------------------------------------------------
def make_working(dataset: str, n: int, **params):
    extra = [f"task.params.{k}={v}" for k, v in params.items()]
    cfg = compose(["task=reasoning_gym", f"task.dataset={dataset}", f"task.num_eval={n}",
                   f"task.num_train_problems={n}", "task.demo=working", *extra])  # fmt: skip
    return TASKS.get("reasoning_gym")(OmegaConf.to_object(cfg.task), char_tokenizer(), seed=0)


def test_worked_steps_golden():
    assert RG.arithmetic_steps("12 + 7 - 5") == (["12 + 7 = 19", "19 - 5 = 14"], 14)
    assert RG.arithmetic_steps("2 + 3 * 4") == (["3 * 4 = 12", "2 + 12 = 14"], 14)  # precedence, as the answer has it
    assert RG.arithmetic_steps("-7 / 2") == (["-7 / 2 = -4"], -4)  # floor division, as the generators compute gold
    assert RG.arithmetic_steps("-( 3 - 8 ) * -2") == (["3 - 8 = -5", "-(-5) = 5", "5 * -2 = -10"], -10)
    assert RG._legs({"animals": {"crab": 2, "chicken": 1}}) == (["crab: 2 x 10 = 20", "chicken: 1 x 2 = 2",
                                                                "20 + 2 = 22"], "22")  # fmt: skip
    assert RG._gcd({"numbers": [18, 48]}) == (["48 = 2 x 18 + 12", "18 = 1 x 12 + 6", "12 = 2 x 6 + 0"], "6")
    with pytest.raises(ValueError, match="not an arithmetic expression"):
        RG.arithmetic_steps("__import__('os')")  # parsed, never run
    with pytest.raises(ValueError, match="reaches 14, the gold answer is '15'"):
        RG.worked("chain_sum", {"expression": "12 + 7 - 5"}, "15")


@pytest.mark.parametrize(
    "dataset,params",
    [("basic_arithmetic", {}), ("basic_arithmetic", {"min_terms": 2, "max_terms": 3, "max_digits": 2}),
     ("chain_sum", {}), ("leg_counting", {}),
     ("leg_counting", {"min_animals": 1, "max_animals": 2, "max_instances": 2}),
     ("gcd", {}), ("gcd", {"min_numbers": 3, "max_numbers": 4})],
)  # fmt: skip
def test_worked_demonstrations_reach_the_gold_answer_and_score_one(dataset, params):
    import reasoning_gym

    for item in reasoning_gym.create_dataset(dataset, seed=3, size=1000, **params):  # the builder on many items
        RG.worked(dataset, item["metadata"], str(item["answer"]))
    t = make_working(dataset, 20, **params)
    for e in t.eval_examples():
        assert e.demonstration.endswith(f"<answer>{e.answer}</answer>") and "\n" in e.demonstration
        assert t.reward(e, e.demonstration).score == 1.0
        assert "step by step" in t.instruction(e)


def test_working_is_its_own_version_and_refused_where_no_builder_exists():
    plain, working = make("chain_sum", 10), make_working("chain_sum", 10)
    assert working.version == plain.version + "/working"
    assert [e.question for e in working.eval_examples()] == [e.question for e in plain.eval_examples()]
    assert plain.eval_examples()[0].demonstration.startswith("<answer>")  # answer-only stays the default
    with pytest.raises(ValueError, match=r"no worked solutions for 'spell_backward'.*\['basic_arithmetic', 'chain"):
        make_working("spell_backward", 2)
