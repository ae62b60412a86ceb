"""Countdown task: hostile-input reward table, generation/split invariants, solver, printer, data loading."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.config import ConfigError, compose
from bench.task import Task
from tasks.countdown import (
    MAX_EXPR_CHARS,
    Countdown,
    CountdownConfig,
    evaluate,
    leaves,
    load_jsonl,
    make_example,
    parse_expression,
    problem_key,
    reward,
    solve,
    to_expr,
)
from tests.conftest import data_root as conftest_data_root

DATA_ROOT = conftest_data_root() or Path("/nonexistent")  # the one way the tests find the data (tests/conftest.py)
CD3 = DATA_ROOT / "countdown" / "cd3_test.jsonl"

# nums (3, 5, 7), target 56, gold (3+5)*7
EX = make_example("t-0", (3, 5, 7), 56, "(3+5)*7", "test")
GARBAGE = "lorem <answer ipsum </answ 3+5*7 ((( >>> " * 2500  # ~100 kB
assert len(GARBAGE) >= 100_000


def tag(expr: str) -> str:
    return f"<answer>{expr}</answer>"


# (id, completion, expected score, expected format component)
REWARD_CASES = [
    ("correct_parens", tag("(3+5)*7"), 1.0, 1.0),
    ("correct_other_expr", "so 5+3 = 8, times 7: " + tag("7*(5+3)"), 1.0, 1.0),
    ("redundant_parens_ok", tag("((3+5))*(7)"), 1.0, 1.0),
    ("wrong_value", tag("3+5+7"), 0.0, 1.0),
    ("number_reused_value_right", tag("(3+5)*7*(7/7)"), 0.0, 1.0),
    ("number_missing_value_right", tag("8*7"), 0.0, 1.0),
    ("extra_number_value_right", tag("(3+5)*7*1"), 0.0, 1.0),
    ("float_constant", tag("(3.0+5)*7"), 0.0, 0.0),
    ("unary_minus", tag("(5- -3)*7"), 0.0, 0.0),
    ("leading_unary_minus", tag("-(3-5)*28/7"), 0.0, 0.0),
    ("power", tag("(3+5)*7**1"), 0.0, 0.0),
    ("huge_power", tag("2**99999999"), 0.0, 0.0),
    ("floor_div", tag("(3+5)*7//1"), 0.0, 0.0),
    ("import_call", tag("__import__('os').system('x')"), 0.0, 0.0),
    ("name", tag("(three+5)*7"), 0.0, 0.0),
    ("bool_constant", tag("(True+2+5)*7"), 0.0, 0.0),
    ("hex_literal", tag("(0x3+5)*7"), 0.0, 0.0),
    ("equals_sign", tag("(3+5)*7=56"), 0.0, 0.0),
    ("division_by_zero", tag("7/(5-5)+3"), 0.0, 1.0),
    ("no_tags", "(3+5)*7", 0.0, 0.0),
    ("multiple_last_right", tag("3+5+7") + " no wait " + tag("(3+5)*7"), 1.0, 1.0),
    ("multiple_last_wrong", tag("(3+5)*7") + " no wait " + tag("3+5+7"), 0.0, 1.0),
    ("unclosed_tag", "<answer>(3+5)*7", 0.0, 0.0),
    ("complete_then_unclosed", tag("(3+5)*7") + "<answer>3+", 1.0, 1.0),
    ("nested_open_tags", "<answer>junk" + tag("(3+5)*7"), 1.0, 1.0),
    ("whitespace_inside", "<answer>  ( 3 + 5 ) *\n\t7 \n</answer>", 1.0, 1.0),
    ("digits_split_by_space", tag("(3 5)*7"), 0.0, 0.0),
    ("garbage_100kB", GARBAGE, 0.0, 0.0),
    ("open_tags_100kB", "<answer>(" * 12_500, 0.0, 0.0),
    ("garbage_100kB_then_answer", GARBAGE + tag("(3+5)*7"), 1.0, 1.0),
    ("answer_then_100kB_garbage", tag("(3+5)*7") + GARBAGE, 0.0, 0.0),  # only the tail is scanned
    ("answer_then_short_ramble", tag("(3+5)*7") + " I am confident." * 200, 1.0, 1.0),
    ("nested_parens_40", tag("(" * 40 + "3+5" + ")" * 40 + "*7"), 0.0, 0.0),
    ("nested_parens_1000", tag("(" * 1000 + "3+5" + ")" * 1000 + "*7"), 0.0, 0.0),
    ("nested_parens_10000", tag("(" * 10000 + "3+5" + ")" * 10000 + "*7"), 0.0, 0.0),
    ("unbalanced_parens", tag("((3+5)*7"), 0.0, 0.0),
    ("long_chain", tag("+".join(["1"] * 120)), 0.0, 0.0),
    ("big_literals", tag("9" * 200 + "*" + "9" * 50), 0.0, 1.0),
    ("empty_string", "", 0.0, 0.0),
    ("empty_tags", tag(""), 0.0, 0.0),
    ("non_ascii_outside_tags", "答案：" + tag("(3+5)*7") + " ✓", 1.0, 1.0),
    ("fullwidth_digit", tag("(３+5)*7"), 0.0, 0.0),
    ("fullwidth_parens", tag("（3+5）*7"), 0.0, 0.0),
    ("nbsp_inside", tag("(3+5)\u00a0*7"), 0.0, 0.0),
    ("null_byte", tag("(3+5)*7\x00"), 0.0, 0.0),
    ("copied_prompt_example", tag("(1+2)/3"), 0.0, 0.0),
]


@pytest.mark.parametrize(
    ("completion", "score", "fmt"), [c[1:] for c in REWARD_CASES], ids=[c[0] for c in REWARD_CASES]
)
def test_reward_table(completion: str, score: float, fmt: float) -> None:
    """Hostile completions get the intended score and format component, never raise, and return within 0.5 s."""
    t0 = time.perf_counter()
    res = reward(EX, completion)
    elapsed = time.perf_counter() - t0
    assert res.score == score, f"score {res.score} != {score}; info={res.info}"
    assert res.components["format"] == fmt, f"format {res.components['format']} != {fmt}; info={res.info}"
    assert res.components["correct"] == res.score, f"correct component != score: {res.components}"
    assert set(res.components) == {"format", "uses_numbers", "correct"}, f"components: {res.components}"
    assert isinstance(res.info["reason"], str) and res.info["reason"], f"missing reason: {res.info}"
    assert elapsed < Task.reward_time_bound_s(None), f"reward took {elapsed:.3f}s on a hostile input"  # the contract


def test_reward_components_and_info() -> None:
    """uses_numbers separates 'right numbers, wrong value' from 'wrong numbers'; info holds the expression."""
    right_nums = reward(EX, tag("3*5+7"))
    wrong_nums = reward(EX, tag("8*7"))
    assert right_nums.components["uses_numbers"] == 1.0 and right_nums.score == 0.0, f"{right_nums}"
    assert wrong_nums.components["uses_numbers"] == 0.0 and wrong_nums.score == 0.0, f"{wrong_nums}"
    assert right_nums.info["expr"] == "3*5+7", f"info: {right_nums.info}"
    assert reward(EX, "nothing here").info["expr"] is None, "expr should be None without an answer block"


def test_reward_is_exact_not_approximate() -> None:
    """A value within 1e-6 of the target but not equal to it scores 0 (exact Fraction comparison)."""
    ex = make_example("t-1", (7, 10000001, 10000000), 7, None, "test")
    near = reward(ex, tag("7*10000001/10000000"))  # 7.0000007: within 1e-6 of the target, still wrong
    assert near.score == 0.0 and near.components["uses_numbers"] == 1.0, f"{near}"


def test_task_reward_delegates_to_module_reward() -> None:
    """Countdown.reward is the pure module-level reward."""
    task = Countdown(CountdownConfig(num_generated=10))
    for completion in (tag("(3+5)*7"), tag("3+5+7"), "junk"):
        assert task.reward(EX, completion) == reward(EX, completion), f"mismatch on {completion!r}"


def test_prompts() -> None:
    """The chat instruction names the numbers, target and tag format; the plain prompt is the short fixed form."""
    task = Countdown(CountdownConfig(num_generated=10))
    assert task.instruction(EX) == (
        "Using the numbers [3, 5, 7], create an equation that equals 56. You can use + - * / and each number "
        "exactly once. Give the final equation in <answer></answer> tags, for example <answer>(1+2)/3</answer>."
    ), task.instruction(EX)
    assert task.plain_prompt(EX) == "nums 3 5 7 target 56\n", repr(task.plain_prompt(EX))
    assert task.render_prompt(EX) == task.plain_prompt(EX), "no tokenizer -> plain prompt"


# ---- generation ---------------------------------------------------------------------------------------------------

GEN_CFG = CountdownConfig(num_generated=6000, num_count_min=3, num_count_max=4)


@pytest.fixture(scope="module")
def generated() -> dict[str, list]:
    task = Countdown(GEN_CFG)
    return {s: task.load_split(s) for s in ("train", "val", "test")}


def test_generation_is_deterministic(generated) -> None:
    """The same gen_seed gives identical problems and demonstrations; the run seed does not matter."""
    again = Countdown(GEN_CFG, seed=999)
    for split, exs in generated.items():
        other = again.load_split(split)
        assert other == exs, f"split {split} differs between two builds with gen_seed={GEN_CFG.gen_seed}"
        assert [e.data for e in other] == [e.data for e in exs], f"data differs in {split}"
    different = Countdown(CountdownConfig(num_generated=6000, num_count_min=3, num_count_max=4, gen_seed=1))
    assert different.load_split("train")[:50] != generated["train"][:50], "a different gen_seed gave the same data"


def test_generated_splits_disjoint_and_nonempty(generated) -> None:
    """Train/val/test share no (sorted nums, target) problem, and no problem repeats within a split."""
    keys = {s: [problem_key(e.answer["nums"], e.answer["target"]) for e in exs] for s, exs in generated.items()}
    for s, ks in keys.items():
        assert ks, f"split {s} is empty"
        assert len(ks) == len(set(ks)), f"split {s} has {len(ks) - len(set(ks))} duplicate problems"
    for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
        common = set(keys[a]) & set(keys[b])
        assert not common, f"{a} and {b} share {len(common)} problems, e.g. {sorted(common)[:3]}"
    total = sum(len(k) for k in keys.values())
    for split, share in (("test", GEN_CFG.test_share), ("val", GEN_CFG.val_share)):  # hash buckets: about the share
        assert abs(len(keys[split]) / total - share) < 0.03, f"{split}: {len(keys[split])}/{total}, expected ~{share}"


def test_generated_problems_respect_config(generated) -> None:
    """Generated problems have 3-4 numbers in 1..max_number and a target in 1..max_target, mirrored in data."""
    for exs in generated.values():
        for e in exs:
            nums, target = e.answer["nums"], e.answer["target"]
            assert isinstance(nums, tuple) and 3 <= len(nums) <= 4, f"{e.uid}: nums {nums}"
            assert all(1 <= n <= GEN_CFG.max_number for n in nums), f"{e.uid}: nums {nums}"
            assert 1 <= target <= GEN_CFG.max_target, f"{e.uid}: target {target}"
            assert e.data["nums"] == nums and e.data["target"] == target, f"{e.uid}: data {e.data}"


def test_generated_demonstrations_score_one(generated) -> None:
    """Every generated demonstration is a correct answer: all of val and test, the first 500 of train."""
    for exs in (generated["val"], generated["test"], generated["train"][:500]):
        for e in exs:
            res = reward(e, e.demonstration)
            assert res.score == 1.0, f"{e.uid} {e.answer}: demonstration {e.demonstration!r} scored {res}"


@pytest.mark.parametrize("rate", [0.0, 0.3, 1.0])
def test_demo_error_rate_makes_that_share_of_demonstrations_wrong_and_nothing_else(generated, rate) -> None:
    """task.demo_error_rate: about that share of the SFT demonstrations (exactly the hash-chosen problems, the same in
    every build and run seed) are well-formed wrong equations (format 1, every number once, correct 0); the others
    are the solver's right ones; RL prompts and the evaluation split are untouched."""
    cfg = CountdownConfig(num_generated=6000, num_count_min=3, num_count_max=4, demo_error_rate=rate)
    demos = Countdown(cfg, seed=7).demonstrations()
    assert demos == Countdown(cfg, seed=8).demonstrations()  # the run seed does not choose them
    train = generated["train"]
    assert [(e.uid, e.answer) for e in demos] == [(e.uid, e.answer) for e in train]
    wrong = 0
    for e, right in zip(demos, train, strict=True):
        res = reward(e, e.demonstration)
        assert res.components["format"] == 1.0 and res.components["uses_numbers"] == 1.0, (e.demonstration, res)
        if e.demonstration != right.demonstration:
            wrong += 1
            assert res.score == 0.0, (e.uid, e.demonstration, e.answer)
    assert abs(wrong / len(demos) - rate) < 0.03, (wrong, len(demos))
    task = Countdown(cfg)
    assert task.load_split("train") == train and task.load_split("test") == generated["test"]
    with pytest.raises(ValueError, match="demo_error_rate"):
        CountdownConfig(demo_error_rate=1.5)


def test_demo_error_mode_add_keeps_every_right_demonstration_and_adds_the_wrong_ones(generated) -> None:
    """task.demo_error_mode=add: the right demonstrations all stay, in order, and the chosen problems' wrong ones (the
    same as replace's) follow; the share of wrong demonstrations is rate / (1 + rate)."""
    cfg = CountdownConfig(num_generated=6000, num_count_min=3, num_count_max=4, demo_error_rate=0.3)
    replaced = Countdown(cfg).demonstrations()
    added = Countdown(replace(cfg, demo_error_mode="add")).demonstrations()
    train = generated["train"]
    assert added[: len(train)] == train
    wrong = [r for r, t in zip(replaced, train, strict=True) if r.demonstration != t.demonstration]
    assert added[len(train) :] == wrong and len(wrong) > 0
    assert all(reward(e, e.demonstration).score == 0.0 for e in added[len(train) :])
    with pytest.raises(ConfigError, match=r"'task.demo_error_mode'.*'both', expected one of \['replace', 'add'\]"):
        compose(["algorithm=grpo", "task=countdown", "task.demo_error_mode=both"])


def test_default_config_generates_all_splits() -> None:
    """The default config yields non-empty train/val/test with num_eval-sized eval sets available."""
    task = Countdown(CountdownConfig())
    sizes = {s: len(task.load_split(s)) for s in ("train", "val", "test")}
    assert sizes["train"] > 5000 and min(sizes["val"], sizes["test"]) >= task.cfg.num_eval, f"sizes {sizes}"
    assert len(task.examples("test")) == task.cfg.num_eval, "examples() should cut the eval split to num_eval"


def test_config_validation() -> None:
    """Bad configs fail at construction, naming the field; a source cannot escape the data root."""
    with pytest.raises(ValueError, match="num_count_min"):
        CountdownConfig(num_count_min=4, num_count_max=3)
    with pytest.raises(ValueError, match="max_number"):
        CountdownConfig(max_number=0)
    with pytest.raises(ValueError, match="source"):
        CountdownConfig(source="../../etc/passwd")


# ---- solver and printer -------------------------------------------------------------------------------------------


def test_solver_on_cd3_test() -> None:
    """solve() finds an answer that scores 1 for the first 50 problems of cd3_test.jsonl."""
    if not CD3.is_file():
        pytest.skip(f"{CD3} not found; set BENCH_DATA to the directory that holds countdown/")
    rows = load_jsonl(CD3)[:50]
    assert len(rows) == 50, f"expected 50 rows, got {len(rows)}"
    for i, (nums, target) in enumerate(rows):
        expr = solve(nums, target)
        assert expr is not None, f"row {i}: no solution for {nums} -> {target}"
        res = reward(make_example(f"cd3-{i}", nums, target, expr, "cd3_test"), tag(expr))
        assert res.score == 1.0, f"row {i}: {nums} -> {target}: solver gave {expr!r}, scored {res}"


def test_solver_small_cases() -> None:
    """solve() handles fractional and negative intermediates and reports unsolvable problems as None."""
    cases = {((1, 5, 5, 5), 24): True, ((3, 3, 8, 8), 24): True, ((1, 1, 1), 100): False, ((4,), 4): True}
    for (nums, target), solvable in cases.items():
        expr = solve(nums, target)
        assert (expr is not None) == solvable, f"solve({nums}, {target}) = {expr!r}"
        if expr is not None:
            ex = make_example("s", nums, target, expr, "test")
            assert reward(ex, tag(expr)).score == 1.0, f"solve({nums}, {target}) = {expr!r} does not score 1"


def test_loaded_source_cd3() -> None:
    """source=cd3_test: val = test = the file with solver demonstrations; train stays generated and disjoint."""
    if not CD3.is_file():
        pytest.skip(f"{CD3} not found; set BENCH_DATA to the directory that holds countdown/")
    task = Countdown(CountdownConfig(source="cd3_test", data_root=str(DATA_ROOT), num_generated=2000))
    test, val, train = task.load_split("test"), task.load_split("val"), task.load_split("train")
    assert len(test) == 256 and test == val, f"test {len(test)} rows, val == test: {test == val}"
    assert test[0].answer == {"target": 23, "nums": (30, 100, 93)}, f"first row {test[0].answer}"
    assert all(e.data["solvable"] for e in test), "SOURCE.txt says every cd3 instance is solvable"
    held = {problem_key(e.answer["nums"], e.answer["target"]) for e in test}
    assert train and all(e.data["source"] == "generated" for e in train), "train must be generated problems"
    leaked = [e.uid for e in train if problem_key(e.answer["nums"], e.answer["target"]) in held]
    assert not leaked, f"train contains eval problems: {leaked[:5]}"


def test_missing_source_raises_with_fix(tmp_path: Path) -> None:
    """A missing jsonl raises FileNotFoundError naming the full path and how to fix it (BENCH_DATA)."""
    task = Countdown(CountdownConfig(source="does_not_exist", data_root=str(tmp_path), num_generated=10))
    with pytest.raises(FileNotFoundError) as err:
        task.load_split("test")
    expected = str((tmp_path / "countdown" / "does_not_exist.jsonl").resolve())
    assert expected in str(err.value) and "BENCH_DATA" in str(err.value), str(err.value)
    unset = Countdown(CountdownConfig(source="does_not_exist", data_root=None, num_generated=10))
    with pytest.raises(FileNotFoundError, match="BENCH_DATA"):
        unset.load_split("val")


@pytest.mark.parametrize(
    ("tree", "expected"),
    [
        (("*", ("+", 3, 5), 7), "(3+5)*7"),
        (("/", 12, ("-", 6, 4)), "12/(6-4)"),
        (("-", 3, ("-", 5, 7)), "3-(5-7)"),
        (("+", 3, ("+", 5, 7)), "3+5+7"),
        (("-", ("-", 3, 5), 7), "3-5-7"),
        (("/", 8, ("/", 4, 2)), "8/(4/2)"),
        (("/", ("*", 8, 4), 2), "8*4/2"),
        (("*", 8, ("/", 4, 2)), "8*4/2"),
        (("-", 3, ("*", 5, 7)), "3-5*7"),
        (("*", ("-", 3, 5), ("+", 5, 7)), "(3-5)*(5+7)"),
    ],
)
def test_printer_examples(tree, expected: str) -> None:
    """The printer adds parentheses only where precedence or non-associativity needs them."""
    assert to_expr(tree) == expected, f"to_expr({tree}) = {to_expr(tree)!r}, expected {expected!r}"


trees = st.recursive(
    st.integers(min_value=0, max_value=100),
    lambda sub: st.tuples(st.sampled_from("+-*/"), sub, sub),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(trees)
def test_printer_round_trips(tree) -> None:
    """Parsing the printed expression gives the same value (or the same ZeroDivisionError) and leaf order, and
    printing is idempotent."""
    text = to_expr(tree)
    assert len(text) <= MAX_EXPR_CHARS, f"test trees must fit the reward's length cap: {text!r}"
    parsed = parse_expression(text)
    assert leaves(parsed) == leaves(tree), f"{text!r}: leaves {leaves(parsed)} != {leaves(tree)}"
    assert to_expr(parsed) == text, f"not idempotent: {text!r} -> {to_expr(parsed)!r}"
    try:
        want = evaluate(tree)
    except ZeroDivisionError:
        with pytest.raises(ZeroDivisionError):
            evaluate(parsed)
        return
    got = evaluate(parsed)
    assert got == want, f"{tree} printed as {text!r} evaluates to {got}, not {want}"
