"""GSM8K task: number parsing table, strict/lenient extraction, hostile-input reward table, structure hooks, splits,
prompts, and every gold solution of the real data scoring 1."""

from __future__ import annotations

import sys
import time
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.task import Example
from tasks.gsm8k import (
    MAX_SCAN_CHARS,
    PROMPT_FORMAT,
    Gsm8k,
    Gsm8kConfig,
    answer_span,
    demonstration,
    extract_lenient,
    extract_strict,
    gold_answer,
    numbers_equal,
    parse_number,
    reward,
    segment,
    val_rows,
)
from tests.conftest import data_root as conftest_data_root


def data_root() -> Path | None:
    """The data root when it holds gsm8k/ (tests/conftest.py finds it), else None (data tests skip)."""
    return conftest_data_root("gsm8k/test.jsonl")


NO_DATA = "no data root with gsm8k/test.jsonl (BENCH_DATA or ../shared/data)"
needs_data = pytest.mark.skipif(data_root() is None, reason=NO_DATA)

# The first test record, literally (gold 18).
JANET = (
    "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18 every day at the "
    "farmer\u2019s market.\n#### 18"
)
EX = Example("t-0", "How much does Janet make?", "18", demonstration(JANET, "18"))
GARBAGE = "lorem #### ipsum 3.1.4 $ -- 1,00 ((( 17x " * 2500  # ~100 kB, its last number 17 (gold 18)
assert len(GARBAGE) >= 100_000


# ---- numbers ------------------------------------------------------------------------------------------------------

PARSE_CASES = [
    ("18", Fraction(18)),
    ("18.0", Fraction(18)),
    ("18.00", Fraction(18)),
    ("$18", Fraction(18)),
    ("18.", Fraction(18)),  # trailing sentence period
    ("  18  ", Fraction(18)),
    ("+18", Fraction(18)),
    ("-3", Fraction(-3)),
    ("\u22123", Fraction(-3)),  # U+2212 minus sign (28 uses in GSM8K solutions)
    ("-$5", Fraction(-5)),
    ("$-5", Fraction(-5)),
    ("\u20ac5", Fraction(5)),
    ("\u00a35.50", Fraction(11, 2)),
    ("0.5", Fraction(1, 2)),
    (".5", Fraction(1, 2)),
    ("-0.25", Fraction(-1, 4)),
    ("1,000", Fraction(1000)),
    ("1,000.50", Fraction(2001, 2)),
    ("$1,000.50", Fraction(2001, 2)),
    ("1,234,567", Fraction(1234567)),
    ("70000", Fraction(70000)),
    ("25%", Fraction(25)),  # percent points, as GSM8K golds are
    ("25%.", Fraction(25)),
    ("0", Fraction(0)),
    ("-0", Fraction(0)),
    ("007", Fraction(7)),
    ("1,00", None),  # bad thousands grouping
    ("1,0000", None),
    ("12,34", None),
    (",000", None),
    ("1.2.3", None),
    ("18..", None),
    ("--5", None),
    ("+-5", None),
    ("$$5", None),
    ("- 5", None),
    ("$", None),
    ("-", None),
    (".", None),
    ("", None),
    ("   ", None),
    ("eighteen", None),
    ("18 apples", None),
    ("3/4", None),
    ("1e5", None),
    ("0x1F", None),
    ("\uff11\uff18", None),  # fullwidth digits
    ("\u0661\u0668", None),  # Arabic-Indic digits
    ("18\n19", None),
    ("9" * 40, Fraction(int("9" * 40))),
    ("9" * 41, None),  # absurdly long: rejected before conversion
    ("9" * 100_000, None),
]


@pytest.mark.parametrize(("text", "value"), PARSE_CASES, ids=[repr(c[0])[:24] for c in PARSE_CASES])
def test_parse_number_table(text: str, value: Fraction | None) -> None:
    """parse_number reads commas, signs, currency, decimals, trailing period and % exactly; rejects the rest, and
    anything over MAX_NUMBER_CHARS before converting it (the cap, not a timing, is what bounds its work)."""
    got = parse_number(text)
    assert got == value, f"parse_number({text[:40]!r}) = {got!r}, expected {value!r}"


EQUAL_CASES = [
    ("18", "18.0", True),
    ("18", "$18", True),
    ("18", "18.", True),
    ("$18.00", "18", True),
    ("1000", "1,000", True),
    ("1000.5", "1,000.50", True),
    ("-3", "\u22123", True),
    ("+7", "7", True),
    ("0.1", ".1", True),
    ("0", "-0", True),
    ("18", "18.0001", False),
    ("18", "-18", False),
    ("0.3", "0.30000000000000004", False),  # exact, not float: 0.1+0.2 style near misses differ
    ("1000", "1,00", False),
    ("18", "eighteen", False),
    ("", "", False),
    ("x", "x", False),
]


@pytest.mark.parametrize(("a", "b", "equal"), EQUAL_CASES)
def test_numbers_equal_table(a: str, b: str, equal: bool) -> None:
    """Numeric comparison is exact and symmetric; unparseable strings are never equal, not even to themselves."""
    assert numbers_equal(a, b) is equal, f"numbers_equal({a!r}, {b!r}) should be {equal}"
    assert numbers_equal(b, a) is equal, f"numbers_equal({b!r}, {a!r}) should be {equal}"


# (completion, strict text, lenient text)
EXTRACT_CASES = [
    ("#### 18", "18", "18"),
    ("so 9 * 2 = 18\n#### 18", "18", "18"),
    ("####18", "18", "18"),
    ("####   18", "18", "18"),
    ("#### $18.00.", "$18.00", "$18.00"),
    ("#### -3", "-3", "-3"),
    ("#### 1,000.50 dollars", "1,000.50", "1,000.50"),
    ("#### 25%", "25", "25"),
    ("#### 18 dollars, that is 20 minus 2", "18", "2"),  # strict and lenient diverge
    ("#### 18\nCheck: 20 - 2 = 18", "18", "18"),
    ("#### 18\nCheck: 18 + 2 = 20", "18", "20"),
    ("#### 5\n#### 18", "18", "18"),  # the last #### counts
    ("#### 18\n#### 5", "5", "5"),
    ("#### 18 ####", None, "18"),  # the last #### has no number
    ("#### 18\n####", None, "18"),
    ("#### eighteen", None, None),
    ("#### \n18", None, "18"),  # the number must be on the #### line
    ("#### 3+15", None, "15"),  # an expression is not an answer
    ("#### 20 - 2", None, "2"),
    ("#### 6*3 = 18", None, "18"),
    ("#### 1,00", None, None),
    # version 2: the first piece of a longer numeric form is not the answer; markdown emphasis is read through
    ("#### 1e3", None, "3"),  # scientific notation: not 1 (version 1) and not 1000; lenient: the last number
    ("#### 3 1/2", None, "2"),  # a mixed number: not 3
    ("#### 5:30", None, "30"),  # a time: not 5
    ("#### **18**", "18", "18"),
    ("#### *18*", "18", "18"),
    ("#### __18__", "18", "18"),
    ("**#### 18**", "18", "18"),  # the whole line in bold
    ("#### **18", None, "18"),  # an unclosed marker is not emphasis
    ("#### **18*", None, "18"),
    # version 3: typographic thousands spaces; powers, times and vulgar fractions are no answer; emphasis with blanks,
    # a currency sign before emphasis and code spans are read through
    ("#### 1\u00a0000", "1\u00a0000", "1\u00a0000"),
    ("#### 1\u202f000", "1\u202f000", "1\u202f000"),
    ("#### 1\u2009000\u2009000", "1\u2009000\u2009000", "1\u2009000\u2009000"),
    ("#### 1\u00a00000", None, None),  # not a valid group: no number at all, as "1,0000"
    ("#### 1 000", None, "000"),  # an ASCII space is not a separator: "3 1/2" and lists look the same
    ("#### 18**2", None, "2"),
    ("#### 18 ** 2", None, "2"),
    ("#### ** 18 **", "18", "18"),
    ("#### * 18 *", "18", "18"),
    ("#### $**18**", "18", "18"),
    ("#### `18`", "18", "18"),
    ("#### ` 18 `", "18", "18"),
    ("#### `18", None, "18"),
    ("#### 5h30", None, "30"),
    ("#### 5 : 30", None, "30"),
    ("#### 3 \u00bd", None, "3"),
    ("#### 3\u00bd", None, "3"),
    ("The answer is 18.", None, "18"),
    ("The answer is $18.", None, "$18"),
    ("It costs 1,000 and then 2,5", None, "1,000"),
    ("no digits at all", None, None),
    ("", None, None),
]


@pytest.mark.parametrize(("completion", "strict", "lenient"), EXTRACT_CASES, ids=[c[0][:30] for c in EXTRACT_CASES])
def test_extraction_table(completion: str, strict: str | None, lenient: str | None) -> None:
    """extract_strict reads the number right after the last ####; extract_lenient the last number anywhere."""
    assert extract_strict(completion) == strict, f"strict of {completion!r}: {extract_strict(completion)!r}"
    assert extract_lenient(completion) == lenient, f"lenient of {completion!r}: {extract_lenient(completion)!r}"


# ---- reward -------------------------------------------------------------------------------------------------------

# (id, completion, score (= strict), lenient, format)
REWARD_CASES = [
    ("gold_demonstration", EX.demonstration, 1.0, 1.0, 1.0),
    ("gold_raw_solution", JANET, 1.0, 1.0, 1.0),
    ("bare_answer", "#### 18", 1.0, 1.0, 1.0),
    ("decimal_zero", "#### 18.0", 1.0, 1.0, 1.0),
    ("dollar", "#### $18", 1.0, 1.0, 1.0),
    ("trailing_period", "She makes $18.\n#### 18.", 1.0, 1.0, 1.0),
    ("leading_plus", "#### +18", 1.0, 1.0, 1.0),
    ("no_space", "####18", 1.0, 1.0, 1.0),
    ("units_after", "#### 18 dollars", 1.0, 1.0, 1.0),
    ("crlf", "9*2=18\r\n#### 18\r\n", 1.0, 1.0, 1.0),
    ("wrong_answer", "#### 17", 0.0, 0.0, 1.0),
    ("negative_of_gold", "#### -18", 0.0, 0.0, 1.0),
    ("near_miss", "#### 18.000001", 0.0, 0.0, 1.0),
    # strict vs lenient divergence
    ("lenient_only_no_marker", "9 * 2 = 18, so she makes $18.", 0.0, 1.0, 0.0),
    ("lenient_only_boxed", "The answer is \\boxed{18}", 0.0, 1.0, 0.0),
    ("lenient_only_expression", "#### 9*2 = 18", 0.0, 1.0, 0.0),
    ("strict_only_number_after", "#### 18\nI double-checked with 3 methods.", 1.0, 0.0, 1.0),
    ("strict_only_units_number", "#### 18 dollars for 9 eggs", 1.0, 0.0, 1.0),
    ("revised_right", "#### 17\nWait, 9*2 is 18.\n#### 18", 1.0, 1.0, 1.0),
    ("revised_wrong", "#### 18\nWait, no.\n#### 17", 0.0, 0.0, 1.0),
    ("empty_last_marker", "#### 18\n####", 0.0, 1.0, 0.0),
    ("answer_on_next_line", "####\n18", 0.0, 1.0, 0.0),
    # the prompt's own format text earns nothing
    ("prompt_placeholder", PROMPT_FORMAT, 0.0, 0.0, 0.0),
    ("prompt_instruction_tail", f'in the form "{PROMPT_FORMAT}", where <number> is the number only', 0.0, 0.0, 0.0),
    # hostile
    ("empty", "", 0.0, 0.0, 0.0),
    ("whitespace", " \n\t ", 0.0, 0.0, 0.0),
    ("hashes_only", "#" * 100_000, 0.0, 0.0, 0.0),
    ("garbage_100kB", GARBAGE, 0.0, 0.0, 0.0),
    ("garbage_100kB_then_answer", GARBAGE + "\n#### 18", 1.0, 1.0, 1.0),
    ("answer_then_100kB_garbage", "#### 18\n" + GARBAGE, 0.0, 0.0, 0.0),  # only the tail is scanned
    ("answer_then_short_ramble", "#### 18" + " I am confident." * 200, 1.0, 1.0, 1.0),
    ("digits_100kB", "9" * 100_000, 0.0, 0.0, 0.0),
    ("marker_then_digits_100kB", "#### " + "9" * 100_000, 0.0, 0.0, 0.0),
    ("long_number", "#### " + "1" * 60, 0.0, 0.0, 1.0),
    ("comma_groups_100kB", "1" + ",000" * 25_000 + "0", 0.0, 0.0, 0.0),
    ("markers_100kB", "#### 1 " * 15_000, 0.0, 0.0, 1.0),
    ("newlines_100kB", "\n" * 100_000 + "#### 18", 1.0, 1.0, 1.0),
    ("fullwidth_digits", "#### \uff11\uff18", 0.0, 0.0, 0.0),
    ("non_ascii_around", "\u7b54\u6848 #### 18 \u2713", 1.0, 1.0, 1.0),
    ("null_bytes", "\x00#### 18\x00", 1.0, 1.0, 1.0),
    ("bad_grouping", "#### 1,8", 0.0, 0.0, 0.0),
    ("scientific", "#### 1.8e1", 0.0, 0.0, 0.0),  # no exponent support: strict reads nothing, lenient 1
    # version 2 decisions, each against the gold the version-1 reading matched (gold 18 here; see test_v2_decisions)
    ("bold", "#### **18**", 1.0, 1.0, 1.0),
    ("bold_with_period", "So she makes **#### 18**.", 1.0, 1.0, 1.0),
    # version 3 (gold 18; see test_v3_decisions for the golds version 2 matched wrongly)
    ("bold_spaced", "#### ** 18 **", 1.0, 1.0, 1.0),
    ("currency_then_bold", "#### $**18**", 1.0, 1.0, 1.0),
    ("code_span", "The total is:\n#### `18`", 1.0, 1.0, 1.0),
]


V3_CASES = [  # (completion, gold, scores 1 against it, what version 2 read)
    ("#### 1\u00a0000", "1000", True, "1"),
    ("#### 1\u202f000", "1000", True, "1"),
    ("#### 1\u2009000", "1000", True, "1"),
    ("#### 18**2", "324", False, "18"),
    ("#### 5h30", "330", False, "5"),
    ("#### 5 : 30", "330", False, "5"),
    ("#### 3 \u00bd", "3", False, "3"),
    ("#### ** 18 **", "18", True, None),
    ("#### $**18**", "18", True, None),
    ("#### `18`", "18", True, None),
]


@pytest.mark.parametrize(("completion", "gold", "right", "v2_read"), V3_CASES, ids=[repr(c[0]) for c in V3_CASES])
def test_v3_decisions(completion, gold, right, v2_read) -> None:
    """Version 3 (the independent check of issue 30): each completion scores against the gold it means, not against
    the leading piece version 2 read (``v2_read``); a power, a time or a vulgar fraction is no answer (format 0)."""
    r = reward(Example("v3", "q", gold), completion)
    assert r.score == float(right), (completion, r)
    if v2_read is not None:
        assert reward(Example("v3", "q", v2_read), completion).score == 0.0
    if not right:
        assert r.components["format"] == 0.0, r


@pytest.mark.parametrize(
    ("completion", "gold_v1_matched"), [("#### 1e3", "1"), ("#### 3 1/2", "3"), ("#### 5:30", "5")]
)
def test_v2_leading_pieces_no_longer_score_against_the_gold_they_start_with(completion, gold_v1_matched) -> None:
    """Version 1 read the leading digits and scored 1 against that gold; version 2 reads no answer: strict 0, format
    0 (the last #### is not followed by a number)."""
    r = reward(Example("v2", "q", gold_v1_matched), completion)
    assert r.score == 0.0 and r.components["format"] == 0.0, r


@pytest.mark.parametrize(
    ("completion", "score", "lenient", "fmt"), [c[1:] for c in REWARD_CASES], ids=[c[0] for c in REWARD_CASES]
)
def test_reward_table(completion: str, score: float, lenient: float, fmt: float) -> None:
    """Each completion gets the intended strict score, lenient and format components, never raises, and is fast."""
    t0 = time.perf_counter()
    res = reward(EX, completion)
    elapsed = time.perf_counter() - t0
    got = (res.score, res.components["lenient"], res.components["format"])
    assert got == (score, lenient, fmt), f"(score, lenient, format) = {got}, expected {(score, lenient, fmt)}: {res}"
    assert res.components["strict"] == res.score, f"strict component != score: {res.components}"
    assert set(res.components) == {"strict", "lenient", "format"}, f"components: {res.components}"
    assert isinstance(res.info["reason"], str) and res.info["reason"], f"missing reason: {res.info}"
    assert elapsed < Gsm8k(Gsm8kConfig()).reward_time_bound_s(), f"reward took {elapsed:.3f}s"  # the contract bound


def test_reward_info() -> None:
    """info carries the extracted strict and lenient texts and the gold answer."""
    res = reward(EX, "#### 18 dollars, 2 per egg")
    assert res.info == {"strict": "18", "lenient": "2", "gold": "18", "reason": "ok"}, res.info
    res = reward(EX, "no marker, 17")
    assert res.info["strict"] is None and res.info["lenient"] == "17" and res.info["reason"] == "no '####'", res.info


@pytest.mark.parametrize("gold", ["", "eighteen", "1,00", None, "9" * 60])
def test_unscorable_gold_never_scores(gold) -> None:
    """An example whose gold does not parse scores 0 on everything, even on a completion repeating the gold."""
    ex = Example("bad", "q", gold)
    for completion in ("#### 18", f"#### {gold}", str(gold)):
        res = reward(ex, completion)
        assert res.score == 0.0 and not any(res.components.values()), f"gold {gold!r}, {completion!r}: {res}"
        assert res.info["reason"].startswith("unscorable gold"), res.info


def test_gold_variants_score_one() -> None:
    """Negative, comma-grouped and decimal golds match every equivalent spelling of the number."""
    spellings = {
        "-3": ["-3", "\u22123", "-3.0", "$-3", "-$3"],
        "1000": ["1000", "1,000", "$1,000", "1000.00", "+1,000."],
        "2.5": ["2.5", "2.50", "$2.5"],
    }
    for gold, texts in spellings.items():
        ex = Example("g", "q", gold)
        for text in texts:
            res = reward(ex, f"work\n#### {text}")
            assert res.score == 1.0 and res.components["lenient"] == 1.0, f"gold {gold}, answer {text!r}: {res}"


@settings(max_examples=200, deadline=None)
@given(
    value=st.integers(min_value=-(10**12), max_value=10**12),
    commas=st.booleans(),
    dollar=st.booleans(),
    decimals=st.integers(min_value=0, max_value=3),
    period=st.booleans(),
)
def test_written_numbers_round_trip(value: int, commas: bool, dollar: bool, decimals: int, period: bool) -> None:
    """Any integer written with or without commas, $, zero decimals and a trailing period scores 1 against itself."""
    body = f"{abs(value):,}" if commas else str(abs(value))
    text = ("-" if value < 0 else "") + ("$" if dollar else "") + body + ("." + "0" * decimals if decimals else "")
    text += "." if period else ""
    assert parse_number(text) == value, f"{text!r} parsed as {parse_number(text)}"
    res = reward(Example("h", "q", str(value)), f"steps\n#### {text}")
    assert res.score == 1.0, f"gold {value}, answer {text!r}: {res}"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400))
def test_reward_never_raises(completion: str) -> None:
    """Arbitrary text never raises and yields 0/1 components with score == strict and strict => format."""
    res = reward(EX, completion)
    assert all(v in (0.0, 1.0) for v in res.components.values()), res
    assert res.score == res.components["strict"] and (res.score == 0.0 or res.components["format"] == 1.0), res
    span = answer_span(completion)
    assert (span is None) == (res.components["format"] == 0.0), f"span {span} vs format for {completion!r}"
    starts = segment(completion)
    assert starts[0] == 0 and starts == sorted(set(starts)), f"segment({completion!r}) = {starts}"
    assert all(0 <= s < max(len(completion), 1) for s in starts), f"segment({completion!r}) = {starts}"


# ---- structure hooks ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "span_text"),
    [
        ("9*2=18\n#### 18", "#### 18"),
        ("9*2=18\n####  $18.00 dollars\n", "####  $18.00"),
        ("#### 5\nno, #### 18.", "#### 18"),
        ("#### 18 ####", None),
        ("no answer", None),
        ("", None),
        ("x" * (2 * MAX_SCAN_CHARS) + "\n#### 18\n", "#### 18"),  # offsets index the full completion, not the tail
    ],
)
def test_answer_span(completion: str, span_text: str | None) -> None:
    """answer_span covers the final '#### <number>' in the full completion's coordinates, or is None."""
    span = answer_span(completion)
    got = None if span is None else completion[span[0] : span[1]]
    assert got == span_text, f"answer_span({completion[-40:]!r}) = {span} -> {got!r}, expected {span_text!r}"
    assert Gsm8k(Gsm8kConfig()).answer_span(completion) == span, "the task hook must equal the module function"


def test_segment() -> None:
    """segment starts a step at each non-blank line, each capitalised sentence, and the final ####; 0 always."""
    text = "First, 9 eggs. Then 9*2 = 18.\n\n  She makes $1.50 each. so on\n#### 18"
    starts = segment(text)
    pieces = [text[a:b].strip() for a, b in zip(starts, [*starts[1:], len(text)], strict=True)]
    assert pieces == ["First, 9 eggs.", "Then 9*2 = 18.", "She makes $1.50 each. so on", "#### 18"], pieces
    assert segment("") == [0] and segment("one line") == [0], (segment(""), segment("one line"))
    inline = "So she makes 18. #### 18"
    assert segment(inline) == [0, inline.index("####")], segment(inline)
    assert Gsm8k(Gsm8kConfig()).segment(text) == starts, "the task hook must equal the module function"
    demo_starts = segment(EX.demonstration)
    assert len(demo_starts) == 3, f"the Janet demonstration has 3 lines: {demo_starts}"


def test_segment_is_linear() -> None:
    """segment over adversarial whitespace and punctuation scales linearly: 8x the input takes at most ~8x the time
    (a ratio of the same machine's timings, best of 3, bounded at 24x; a quadratic scan gives 64x), never a speed."""

    def best(text: str) -> float:
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            starts = segment(text)
            times.append(time.perf_counter() - t0)
            assert starts[0] == 0, starts[:3]
        return min(times)

    for unit, n, tail in (("\n", 12_500, ""), (" ", 12_500, "x"), ("A. ", 4_000, ""), (" \n", 6_000, "#### 18")):
        small, large = best(unit * n + tail), best(unit * 8 * n + tail)
        assert large / max(small, 1e-5) < 24, f"segment on {unit!r}: 8x the input took {large / small:.1f}x the time"


# ---- demonstrations, prompts, config ------------------------------------------------------------------------------


def test_demonstration_conversion() -> None:
    """Demonstrations drop <<calc>> annotations and end with '#### <gold>' (commas removed)."""
    assert EX.demonstration == (
        "Janet sells 16 - 3 - 4 = 9 duck eggs a day.\nShe makes 9 * 2 = $18 every day at the farmer\u2019s market.\n"
        "#### 18"
    ), repr(EX.demonstration)
    sol = "It is 1,000+500=<<1000+500=1500>>1,500 cents\n#### 1,500"
    assert gold_answer(sol) == "1500", gold_answer(sol)
    assert demonstration(sol, "1500") == "It is 1,000+500=1,500 cents\n#### 1500", demonstration(sol, "1500")
    for bad in ("no marker 18", "#### ", "#### eighteen", "#### 1,00"):
        assert gold_answer(bad) is None, f"gold_answer({bad!r}) = {gold_answer(bad)!r}"


def test_prompts() -> None:
    """The instruction holds the question and the placeholder format; the plain prompt is the cut question."""
    task = Gsm8k(Gsm8kConfig())
    ex = Example("p", "Tom has 3 apples and buys 4 more. How many apples does he have?", "7")
    inst = task.instruction(ex)
    assert inst.startswith(ex.question) and PROMPT_FORMAT in inst and "step by step" in inst, inst
    assert reward(ex, inst).components["format"] == 0.0, "echoing the instruction must not earn format"
    assert task.plain_prompt(ex) == ex.question + "\n", repr(task.plain_prompt(ex))
    long = Example("l", "word " * 100 + "How many?", "1")
    plain = task.plain_prompt(long)
    assert len(plain) <= task.cfg.plain_prompt_chars + 1 and plain.endswith("...\n"), repr(plain)
    assert task.render_prompt(ex) == task.plain_prompt(ex), "no tokenizer -> plain prompt"


def test_version_and_metadata() -> None:
    """version, description and hub id are set; the reward method is the module-level reward."""
    assert Gsm8k.version == "3" and Gsm8k.description and Gsm8k.hub_dataset == "openai/gsm8k"
    task = Gsm8k(Gsm8kConfig())
    for completion in ("#### 18", "#### 17", "18", ""):
        assert task.reward(EX, completion) == reward(EX, completion), completion


def test_config_validation_and_yaml() -> None:
    """Bad config values fail naming the field; conf/task/gsm8k.yaml composes against Gsm8kConfig."""
    with pytest.raises(ValueError, match="num_val"):
        Gsm8kConfig(num_val=-1)
    with pytest.raises(ValueError, match="plain_prompt_chars"):
        Gsm8kConfig(plain_prompt_chars=3)
    from bench.config import compose

    cfg = compose(["algorithm=grpo", "task=gsm8k"])
    assert cfg.task.name == "gsm8k" and cfg.task.num_eval == 1319, cfg.task  # the whole test set
    assert cfg.rollout.max_new_tokens == 256, cfg.rollout


def test_val_rows_are_seeded_and_order_free() -> None:
    """val_rows picks num_val rows by question hash: the same under reordering, different under another seed."""
    qs = [f"question {i}" for i in range(1000)]
    chosen = val_rows(qs, 50, 0)
    assert len(chosen) == 50, len(chosen)
    reordered = list(reversed(qs))
    assert {reordered[i] for i in val_rows(reordered, 50, 0)} == {qs[i] for i in chosen}, "order changed the choice"
    assert val_rows(qs, 50, 1) != chosen, "split_seed had no effect"


def test_missing_data_raises_with_fix(tmp_path: Path, monkeypatch) -> None:
    """A missing data root raises FileNotFoundError naming the expected path and BENCH_DATA."""
    task = Gsm8k(Gsm8kConfig(data_root=str(tmp_path)))
    with pytest.raises(FileNotFoundError) as err:
        task.load_split("test")
    msg = str(err.value)
    assert str(tmp_path / "gsm8k" / "test.jsonl") in msg and "BENCH_DATA" in msg and "openai/gsm8k" in msg, msg
    monkeypatch.setitem(sys.modules, "datasets", None)  # datasets not installed: no hub fallback
    with pytest.raises(FileNotFoundError, match="BENCH_DATA") as err:
        Gsm8k(Gsm8kConfig(data_root=None)).load_split("train")
    assert "install `datasets` and use the hub dataset openai/gsm8k" in str(err.value), str(err.value)


def test_malformed_rows_fail_loudly(tmp_path: Path) -> None:
    """A row without a parseable '#### <number>' gold raises naming the file and row."""
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "test.jsonl").write_text('{"question": "q", "answer": "x\\n#### 5"}\n{"question": "q2"}\n')
    with pytest.raises(ValueError, match=r"test\.jsonl: row 1"):
        Gsm8k(Gsm8kConfig(data_root=str(tmp_path))).load_split("test")


# ---- real data ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def splits() -> dict[str, list[Example]]:
    root = data_root()
    if root is None:
        pytest.skip("no data root with gsm8k/test.jsonl (BENCH_DATA or ../shared/data)")
    task = Gsm8k(Gsm8kConfig(data_root=str(root)))
    return {s: task.load_split(s) for s in ("train", "val", "test")}


@needs_data
def test_all_test_gold_solutions_score_one(splits) -> None:
    """All 1,319 test golds parse, and both the demonstration and the raw gold solution score strict = lenient = 1."""
    test = splits["test"]
    assert len(test) == 1319, len(test)
    for e in test:
        assert parse_number(e.answer) is not None and "," not in e.answer, f"{e.uid}: gold {e.answer!r}"
        for completion in (e.demonstration, e.data["solution"]):
            res = reward(e, completion)
            assert (res.score, res.components["lenient"], res.components["format"]) == (1.0, 1.0, 1.0), (
                f"{e.uid}: {completion[-60:]!r} scored {res}"
            )
            assert "<<" not in e.demonstration and e.demonstration.endswith(f"\n#### {e.answer}"), e.demonstration


@needs_data
def test_all_train_gold_solutions_score_one(splits) -> None:
    """All 7,473 train golds (train + val) parse and their demonstrations score 1."""
    rows = splits["train"] + splits["val"]
    assert len(rows) == 7473, len(rows)
    failed = [e.uid for e in rows if reward(e, e.demonstration).score != 1.0]
    assert not failed, f"{len(failed)} train demonstrations do not score 1, e.g. {failed[:5]}"


@needs_data
def test_first_test_record(splits) -> None:
    """The first test row is the Janet record of the module docstring, gold 18."""
    e = splits["test"][0]
    assert e.uid == "gsm8k-test-0" and e.answer == "18" and e.question.startswith("Janet\u2019s ducks"), e
    assert e.data["solution"] == JANET, repr(e.data["solution"])


@needs_data
def test_splits_disjoint_and_deterministic(splits) -> None:
    """train (7,273) / val (200) / test (1,319) share no question; a second build gives identical splits."""
    sizes = {s: len(v) for s, v in splits.items()}
    assert sizes == {"train": 7273, "val": 200, "test": 1319}, sizes
    qs = {s: {e.question for e in v} for s, v in splits.items()}
    for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
        assert not qs[a] & qs[b], f"{a} and {b} share {len(qs[a] & qs[b])} questions"
    uids = [e.uid for v in splits.values() for e in v]
    assert len(uids) == len(set(uids)), "duplicate uids"
    again = Gsm8k(Gsm8kConfig(data_root=str(data_root())), seed=99)
    assert [e.uid for e in again.load_split("val")] == [e.uid for e in splits["val"]], "val differs between builds"
    other = Gsm8k(Gsm8kConfig(data_root=str(data_root()), split_seed=1)).load_split("val")
    assert {e.uid for e in other} != {e.uid for e in splits["val"]}, "split_seed had no effect"


@needs_data
def test_every_eval_prompt_renders(splits) -> None:
    """instruction and plain_prompt are non-empty for every val and test example; plain prompts stay short, and
    the instruction itself earns no format reward."""
    task = Gsm8k(Gsm8kConfig(data_root=str(data_root())))
    for e in splits["val"] + splits["test"]:
        inst, plain = task.instruction(e), task.plain_prompt(e)
        assert inst.strip() and plain.strip(), f"{e.uid}: empty prompt"
        assert len(plain) <= task.cfg.plain_prompt_chars + 1, f"{e.uid}: plain prompt {len(plain)} chars"
        res = reward(e, inst)
        assert res.components["format"] == 0.0 and res.score == 0.0, f"{e.uid}: echoed instruction scored {res}"


@needs_data
def test_num_eval_and_demonstrations(splits) -> None:
    """examples() cuts the eval split to num_eval; every train example has a demonstration."""
    task = Gsm8k(Gsm8kConfig(data_root=str(data_root()), num_eval=50))
    assert len(task.eval_examples()) == 50 and task.eval_examples() == splits["test"][:50]
    assert len(task.demonstrations()) == len(splits["train"]), "every train row should have a demonstration"


@pytest.mark.slow
@needs_data
def test_tiny_grpo_run_logs_strict_and_lenient(small, store) -> None:
    """Two GRPO steps of the tiny model on GSM8K run end to end and log reward/strict and reward/lenient."""
    from mlflow.tracking import MlflowClient

    from bench.config import compose
    from bench.run.train import train

    args = ["algorithm=grpo", "task=gsm8k", f"task.data_root={data_root()}", *small, "rollout.max_new_tokens=16"]
    result = train(compose(args))
    metrics = MlflowClient(tracking_uri=store["uri"]).get_run(result.run_id).data.metrics
    for name in ("reward/strict", "reward/lenient", "reward/format"):
        assert name in metrics, f"{name} not logged; got {sorted(metrics)}"
