"""MATH task: box extraction, hostile-input reward table with time limits, worker pool, splits and data loading."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tasks.math as M
from bench.task import Example
from tasks.math import (
    MAX_ANSWER_CHARS,
    MAX_SCAN_CHARS,
    PROMPT_SUFFIX,
    Math,
    MathConfig,
    check_golds,
    extract_answer,
    find_last_box,
    normalise_problem,
    reward,
    segment_starts,
)
from tests.conftest import data_root as conftest_data_root

REPO_ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 1.0
"""Per-call limit used in these tests (the default is 5 s); a legitimate check takes a few ms."""
OVERHEAD_S = 1.5
"""Allowed on top of the limit: killing the stuck worker and the pipe round trip, on a loaded 2-core machine."""


def data_root() -> Path:
    root = conftest_data_root("math")
    if root is None:
        pytest.skip("no data root with math/: set BENCH_DATA to the directory that holds math/ (or ../shared/data)")
    return root


@pytest.fixture
def warm():
    """A started, ready worker pool, so timings measure the call and not a worker's import of sympy."""
    M.pool().warm_up()
    return M.pool()


def ex(gold: str) -> Example:
    return Example(uid=f"t/{gold}", question="q", answer=gold)


HALF = ex("\\frac{1}{2}")
SQRT = ex("\\frac{\\sqrt2}{2}")
SQRT_SLASH = ex("\\sqrt{2}/2")
GARBAGE_100K = "lorem \\box {ipsum} }{ $x^2$ \\fbo 0.5 \\\\ {{ " * 2400
GARBAGE_1M = GARBAGE_100K * 10
assert len(GARBAGE_100K) >= 100_000 and len(GARBAGE_1M) >= 1_000_000


def box(s: str) -> str:
    return "\\boxed{" + s + "}"


# (id, example, completion, expected score, expected format component)
REWARD_CASES = [
    # equivalent forms
    ("frac", HALF, box("\\frac{1}{2}"), 1.0, 1.0),
    ("decimal", HALF, box("0.5"), 1.0, 1.0),
    ("dfrac_shorthand", HALF, box("\\dfrac12"), 1.0, 1.0),
    ("slash", HALF, box("1/2"), 1.0, 1.0),
    ("in_sentence_with_dollars", HALF, "So the probability is $\\boxed{\\frac12}$.", 1.0, 1.0),
    ("sqrt_slash_vs_frac", SQRT, box("\\sqrt{2}/2"), 1.0, 1.0),
    ("frac_sqrt_vs_slash", SQRT_SLASH, box("\\frac{\\sqrt2}{2}"), 1.0, 1.0),
    ("frac_sqrt_braced", SQRT_SLASH, box("\\frac{\\sqrt{2}}{2}"), 1.0, 1.0),
    ("fbox", HALF, "\\fbox{0.5}", 1.0, 1.0),
    ("space_before_brace", HALF, "\\boxed {0.5}", 1.0, 1.0),
    ("equation_form", HALF, box("x = \\frac12"), 1.0, 1.0),
    # wrong or missing answers
    ("wrong_value", HALF, box("1/3"), 0.0, 1.0),
    ("near_miss", HALF, box("0.5001"), 0.0, 1.0),
    ("text_answer", HALF, box("\\text{one half}"), 0.0, 1.0),
    ("no_box", HALF, "The answer is 1/2.", 0.0, 0.0),
    ("boxed_without_braces", HALF, "\\boxed 0.5", 0.0, 0.0),
    ("empty_box", HALF, box(""), 0.0, 0.0),
    ("blank_box", HALF, box("  \n "), 0.0, 0.0),
    ("echo_prompt_suffix", HALF, PROMPT_SUFFIX, 0.0, 0.0),
    ("empty_completion", HALF, "", 0.0, 0.0),
    # which box counts
    ("last_box_wins", HALF, box("1/3") + " no wait, " + box("1/2"), 1.0, 1.0),
    ("last_box_wrong", HALF, box("1/2") + " no wait, " + box("1/3"), 0.0, 1.0),
    ("fbox_after_boxed", HALF, box("1/3") + " actually \\fbox{1/2}", 1.0, 1.0),
    ("unclosed_last_box_falls_back", HALF, box("1/2") + " hmm \\boxed{\\frac{1}{3}", 1.0, 1.0),
    ("nested_box_inner", HALF, box(box("0.5")), 1.0, 1.0),
    ("escaped_braces_literal", HALF, box("\\{0.5\\}"), 1.0, 1.0),
    ("answer_in_text_macro", HALF, "\\text{final: \\boxed{0.5}}", 1.0, 1.0),
    # unbalanced braces
    ("unbalanced_open", HALF, "\\boxed{\\frac{1}{2}", 0.0, 0.0),
    ("only_opening_braces", HALF, "\\boxed{" + "{" * 5000, 0.0, 0.0),
    ("stray_closers_after", HALF, box("0.5") + "}}}}", 1.0, 1.0),
    ("stray_openers_before", HALF, "{{{{" + box("0.5"), 1.0, 1.0),
    ("closer_before_open", HALF, "}\\boxed{", 0.0, 0.0),
    # size and depth
    ("garbage_100kB", HALF, GARBAGE_100K, 0.0, 0.0),
    ("garbage_1MB", HALF, GARBAGE_1M, 0.0, 0.0),
    ("garbage_1MB_then_answer", HALF, GARBAGE_1M + box("0.5"), 1.0, 1.0),
    ("answer_then_1MB_garbage", HALF, box("0.5") + GARBAGE_1M, 0.0, 0.0),  # only the tail is searched
    ("box_around_1MB", HALF, box(GARBAGE_1M), 0.0, 0.0),  # its opening lies before the scanned tail
    ("braces_10k_deep", HALF, box("{" * 10_000 + "0.5" + "}" * 10_000), 0.0, 1.0),
    ("fracs_10k_deep", HALF, box("\\frac{1}{" * 10_000 + "2" + "}" * 10_000), 0.0, 0.0),  # box opens before the tail
    ("answer_too_long", HALF, box("1+" * (MAX_ANSWER_CHARS // 2) + "1"), 0.0, 1.0),
    # odd characters
    ("fullwidth_digits", HALF, box("０.５"), 0.0, 1.0),
    ("lone_surrogate", HALF, box("0.5\ud800"), 0.0, 1.0),
    ("null_byte", HALF, box("0.5\x00"), 0.0, 1.0),
    ("non_ascii_outside", HALF, "答案：" + box("\\frac{1}{2}") + " ✓", 1.0, 1.0),
]


@pytest.mark.parametrize(
    ("example", "completion", "score", "fmt"), [c[1:] for c in REWARD_CASES], ids=[c[0] for c in REWARD_CASES]
)
def test_reward_table(warm, example: Example, completion: str, score: float, fmt: float) -> None:
    """Hostile and equivalent-form completions get the intended score and format, never raise, and return fast."""
    t0 = time.perf_counter()
    res = reward(example, completion, TIMEOUT_S)
    elapsed = time.perf_counter() - t0
    assert res.score == score, f"score {res.score} != {score}; info={res.info}"
    assert res.components == {"format": fmt, "correct": score}, f"components {res.components}; info={res.info}"
    assert isinstance(res.info["reason"], str) and res.info["reason"], f"missing reason: {res.info}"
    assert res.info["reason"] != "timeout", f"a benign case timed out: {res.info}"
    assert elapsed < TIMEOUT_S + OVERHEAD_S, f"reward took {elapsed:.3f}s"


PATHOLOGICAL = [
    ("power_tower_9", box("9^{9^{9^{9}}}")),
    ("power_tower_10", box("10^{10^{10^{10}}}")),
    ("factorial_of_googol", box("(10^{100})!")),
    ("fracs_40_deep", box("\\frac{1}{" * 40 + "3" + "}" * 40)),
    ("braces_200_deep", box("{" * 200 + "0.5" + "}" * 200)),
]


@pytest.mark.parametrize("completion", [c[1] for c in PATHOLOGICAL], ids=[c[0] for c in PATHOLOGICAL])
def test_pathological_latex_is_cut_off(warm, completion: str) -> None:
    """LaTeX that math-verify cannot finish (huge powers, deep nesting under the length cap) scores 0 within the
    time limit plus a small overhead; the stuck worker is killed and replaced, and the pool stays within its size."""
    before = set(warm.pids())
    t0 = time.perf_counter()
    res = reward(HALF, completion, TIMEOUT_S)
    elapsed = time.perf_counter() - t0
    assert res.score == 0.0 and res.components["format"] == 1.0, f"{res}"
    assert res.info["reason"] in ("timeout", "crashed", "wrong", "unparseable") or res.info["reason"].startswith(
        "error"
    ), f"unexpected reason: {res.info}"
    assert elapsed < TIMEOUT_S + OVERHEAD_S, f"reward took {elapsed:.3f}s with a {TIMEOUT_S}s limit"
    after = warm.pids()
    assert len(after) <= warm.max_workers, f"{len(after)} live workers > max_workers={warm.max_workers}"
    if res.info["reason"] == "timeout":
        killed = before - set(after)
        assert killed, f"a timed-out worker is still alive: before {sorted(before)}, after {after}"
        assert not any(_alive(pid) for pid in killed), f"killed worker(s) {killed} still running"
    # the pool recovers: the next legitimate answer is scored normally
    assert reward(HALF, box("0.5"), 30.0).score == 1.0, "pool did not recover after a pathological answer"


def _alive(pid: int) -> bool:
    """True for a running process (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_reward_from_non_main_thread(warm) -> None:
    """reward() works from a threading.Thread (no signal.alarm anywhere): right, wrong and time-limited answers."""
    cases = [(box("0.5"), 1.0), (box("1/3"), 0.0), (box("9^{9^{9^{9}}}"), 0.0)]
    out: dict[int, tuple[float, float, str]] = {}
    errors: list[BaseException] = []

    def run(i: int, completion: str) -> None:
        try:
            t0 = time.perf_counter()
            res = reward(HALF, completion, TIMEOUT_S)
            out[i] = (res.score, time.perf_counter() - t0, res.info["reason"])
        except BaseException as e:  # surfaced below; a thread's exception is otherwise lost
            errors.append(e)

    for i, (completion, _) in enumerate(cases):
        t = threading.Thread(target=run, args=(i, completion))
        t.start()
        t.join(timeout=60)
        assert not t.is_alive(), f"thread {i} did not finish"
    assert not errors, f"reward raised in a thread: {errors!r}"
    for i, (completion, want) in enumerate(cases):
        score, elapsed, reason = out[i]
        assert score == want, f"{completion!r}: score {score} != {want} ({reason})"
        assert elapsed < TIMEOUT_S + OVERHEAD_S, f"{completion!r}: {elapsed:.3f}s in a thread"


def test_concurrent_threads_get_their_own_results(warm) -> None:
    """Many threads sharing the pool each get the result for their own completion."""
    gold_of = {0: HALF, 1: SQRT, 2: ex("7")}
    completions = {0: box("0.5"), 1: box("\\sqrt{2}/2"), 2: box("7")}
    results: list[tuple[int, int, float]] = []
    lock = threading.Lock()

    def run(k: int) -> None:
        for j in range(3):
            # thread k scores its own gold against every completion: exactly j == k is correct
            score = reward(gold_of[k], completions[j], 30.0).score
            with lock:
                results.append((k, j, score))

    threads = [threading.Thread(target=run, args=(k % 3,)) for k in range(9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(results) == 27, f"only {len(results)} of 27 results"
    bad = [(k, j, s) for k, j, s in results if s != float(k == j)]
    assert not bad, f"wrong (gold, completion, score) results: {bad}"


def test_unscorable_gold_never_rewarded(warm) -> None:
    """A gold without a sympy parse is unscorable: flagged at load -> 0 without a worker call; unflagged -> 0 too."""
    flagged = Example(uid="u", question="q", answer="0.5", data={"scorable": False})
    res = reward(flagged, box("0.5"))
    assert res.score == 0.0 and res.info["reason"] == "unscorable", f"{res}"
    for gold in ("", "{17}."):
        res = reward(ex(gold), box(gold or "0"), 30.0)
        assert res.score == 0.0 and res.info["reason"] == "unscorable", f"gold {gold!r}: {res}"
    assert check_golds(["", "{17}.", "\\frac{1}{2}", "\\text{(E)}"]) == {
        "": False,
        "{17}.": False,
        "\\frac{1}{2}": True,
        "\\text{(E)}": True,
    }, "check_golds disagrees with the unscorable definition"


def test_pool_shuts_down_at_exit() -> None:
    """A fresh interpreter that scored answers and timed out once leaves no worker process behind at exit."""
    script = (
        "import json, tasks.math as M\n"
        "from bench.task import Example\n"
        "e = Example('x', 'q', '\\\\frac{1}{2}')\n"
        "a = M.reward(e, '\\\\boxed{0.5}', 30.0).score\n"
        "b = M.reward(e, '\\\\boxed{9^{9^{9^{9}}}}', 1.0).info['reason']\n"
        "print(json.dumps({'a': a, 'b': b, 'pids': M.pool().pids()}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=180, check=False
    )
    assert proc.returncode == 0, f"rc {proc.returncode}: {proc.stderr[-2000:]}"
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["a"] == 1.0 and out["b"] == "timeout", f"{out}"
    assert out["pids"], "expected live workers before exit"
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in out["pids"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in out["pids"]), f"workers {out['pids']} outlived their interpreter"


def test_pool_shutdown_and_restart() -> None:
    """shutdown() stops every worker; the next call starts a new pool with the configured size."""
    M.configure_pool(2, 4096)
    M.pool().warm_up()
    pids = M.pool().pids()
    assert len(pids) == 2, f"expected 2 workers, got {pids}"
    M.shutdown()
    assert not any(_alive(p) for p in pids), f"workers {pids} survived shutdown()"
    assert reward(HALF, box("0.5"), 30.0).score == 1.0, "no new pool after shutdown"
    assert M.pool().max_workers == 2 and len(M.pool().pids()) <= 2, f"pool {M.pool().pids()}"


# ---- extraction, spans and segments (no worker) ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "content"),
    [
        ("\\boxed{42}", "42"),
        ("a \\boxed{\\frac{1}{2}} b", "\\frac{1}{2}"),
        ("\\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("\\boxed{a\\\\{b}}", "a\\\\{b}"),  # ``\\`` is a line break, so the following brace opens a group
        ("\\fbox{3}", "3"),
        ("\\boxed{1} \\boxed{2", "1"),
        ("\\boxed{\\boxed{5}}", "5"),
        ("no box here", None),
        ("\\boxed{", None),
        ("\\boxed x", None),
    ],
)
def test_extract_answer(text: str, content: str | None) -> None:
    """The last complete box's content, with balanced (unescaped) braces."""
    assert extract_answer(text) == content, f"extract_answer({text!r}) = {extract_answer(text)!r}"


def test_math500_solutions_extract_the_stored_answer() -> None:
    """On every MATH-500 solution the extractor returns exactly the stored answer field."""
    rows = [json.loads(line) for line in (data_root() / "math" / "math500_test.jsonl").open()]
    bad = [(r["unique_id"], extract_answer(r["solution"]), r["answer"]) for r in rows]
    bad = [b for b in bad if b[1] != b[2]]
    assert len(rows) == 500 and not bad, f"{len(bad)} mismatches, e.g. {bad[:3]}"


def test_answer_span() -> None:
    """answer_span is the whole last box in completion coordinates, also after a long prefix; None without one."""
    task = Math(MathConfig())
    text = "Work... \\boxed{1} so finally $\\boxed{\\frac{1}{2}}$."
    start, end = task.answer_span(text)
    assert text[start:end] == "\\boxed{\\frac{1}{2}}", f"span {start, end} -> {text[start:end]!r}"
    long = "x" * (3 * MAX_SCAN_CHARS) + text
    start, end = task.answer_span(long)
    assert long[start:end] == "\\boxed{\\frac{1}{2}}", f"span {start, end} -> {long[start:end]!r}"
    assert task.answer_span("no answer") is None and task.answer_span("\\boxed{") is None, "span without a box"


def test_segment_example() -> None:
    """Segments start at 0 and after line breaks, sentence ends and LaTeX row breaks, each at visible text."""
    text = "First, note x=1. Then y=2.\n\\begin{align}a &= b \\\\\n c &= d\\end{align}\nSo \\boxed{3}."
    starts = Math(MathConfig()).segment(text)
    pieces = [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)], strict=True)]
    assert pieces == [
        "First, note x=1. ",
        "Then y=2.\n",
        "\\begin{align}a &= b \\\\\n ",
        "c &= d\\end{align}\n",
        "So \\boxed{3}.",
    ], f"pieces {pieces}"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["\\boxed", "\\fbox", "{", "}", "\\{", "\\", "1", " ", "\n", ". ", "x"])).map("".join))
def test_extraction_and_segments_invariants(text: str) -> None:
    """On any text: the span holds a box whose content has balanced braces; segments are sorted, unique, in range."""
    found = find_last_box(text)
    if found is not None:
        content, start, end = found
        piece = text[start:end]
        assert piece.startswith(("\\boxed", "\\fbox")) and piece.endswith("{" + content + "}"), f"{found} in {text!r}"
        assert extract_answer(piece) == content, f"re-extraction of {piece!r} differs"
    starts = segment_starts(text)
    assert starts[0] == 0 and starts == sorted(set(starts)), f"segments {starts}"
    assert all(s < len(text) for s in starts[1:]), f"segment start out of range: {starts} for len {len(text)}"


def test_extraction_is_linear_on_hostile_text() -> None:
    """Extraction and segmentation of 1 MB of box openers, braces and breaks take well under a second each."""
    for text in ("\\boxed{" * 150_000, "{" * 1_000_000, "}" * 1_000_000, ". \n\\\\" * 200_000, GARBAGE_1M):
        t0 = time.perf_counter()
        find_last_box(text)
        segment_starts(text)
        elapsed = time.perf_counter() - t0
        assert elapsed < 2.0, f"{elapsed:.2f}s on {text[:20]!r}..."


# ---- task, config, prompts ---------------------------------------------------------------------------------------


def test_version_and_metadata() -> None:
    """The task declares a version, a description and the MATH-500 hub id."""
    assert Math.version == "1" and Math.description, f"version {Math.version!r}"
    assert Math.hub_dataset == "HuggingFaceH4/MATH-500", Math.hub_dataset
    assert MathConfig().name == "math", MathConfig().name


def test_config_validation() -> None:
    """Bad configs fail at construction, naming the field."""
    for field, value in (("val_size", 0), ("verify_timeout_s", 0), ("verify_workers", 0), ("plain_prompt_chars", 0)):
        with pytest.raises(ValueError, match=field):
            MathConfig(**{field: value})


def test_task_reward_uses_config_timeout(warm) -> None:
    """Math.reward is the module reward with cfg.verify_timeout_s."""
    task = Math(MathConfig(verify_timeout_s=TIMEOUT_S))
    for completion in (box("0.5"), box("2"), "junk"):
        assert task.reward(HALF, completion) == reward(HALF, completion), f"mismatch on {completion!r}"
    t0 = time.perf_counter()
    res = task.reward(HALF, box("9^{9^{9^{9}}}"))
    assert res.info["reason"] == "timeout" and time.perf_counter() - t0 < TIMEOUT_S + OVERHEAD_S, f"{res}"


def test_prompts() -> None:
    """The chat instruction is the problem plus the boxed-answer request; the plain prompt is short and one line."""
    task = Math(MathConfig(plain_prompt_chars=40))
    e = Example(uid="p", question="Compute  $1+1$.\nThen   add 2 to the result, and so on for a while.", answer="4")
    assert task.instruction(e) == e.question + "\n\n" + PROMPT_SUFFIX, task.instruction(e)
    assert task.plain_prompt(e) == "Compute $1+1$. Then add 2 to the result,\n", repr(task.plain_prompt(e))
    assert task.render_prompt(e) == task.plain_prompt(e), "no tokenizer -> plain prompt"


# ---- data ----------------------------------------------------------------------------------------------------------


def _write_fake_root(tmp_path: Path) -> Path:
    """A tiny data root: 2 MATH-500 rows; 6 train rows with an overlap, a duplicate and an unscorable gold."""
    d = tmp_path / "math"
    d.mkdir()
    test = [
        {"problem": "What is $1+1$?", "solution": "$\\boxed{2}$", "answer": "2", "subject": "Algebra", "level": 1,
         "unique_id": "test/algebra/1.json"},
        {"problem": "Halve 1.", "solution": "$\\boxed{\\frac12}$", "answer": "\\frac12", "subject": "Algebra",
         "level": 2, "unique_id": "test/algebra/2.json"},
    ]  # fmt: skip
    train = [
        {"problem": "What  is\n$1+1$?", "answer": "2", "level": "Level 1", "type": "Algebra"},  # = a test problem
        {"problem": "What is $2+2$?", "answer": "4", "level": "Level 1", "type": "Algebra"},
        {"problem": "What is $2+2$? ", "answer": "4", "level": "Level 1", "type": "Algebra"},  # duplicate
        {"problem": "What is $3+3$?", "answer": "6", "level": "Level ?", "type": "Algebra"},
        {"problem": "Pick one.", "answer": "", "level": "Level 2", "type": "Algebra"},  # unscorable gold
        {"problem": "What is $4+4$?", "answer": "8", "level": "Level 3", "type": "Prealgebra"},
    ]
    (d / "math500_test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in test))
    (d / "math_train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    return tmp_path


def test_fake_root_splits(tmp_path: Path) -> None:
    """Overlap with MATH-500 and duplicates leave train, val is val_size hash-chosen problems, unscorable golds are
    dropped and counted, and there are no demonstrations (SFT gets the base class's clear error)."""
    task = Math(MathConfig(data_root=str(_write_fake_root(tmp_path)), val_size=1))
    test, val, train = task.load_split("test"), task.load_split("val"), task.load_split("train")
    assert [e.uid for e in test] == ["math500/test/algebra/1", "math500/test/algebra/2"], [e.uid for e in test]
    assert task.overlap_removed == 1 and task.duplicates_removed == 1, (task.overlap_removed, task.duplicates_removed)
    raw = task._split_train()
    assert len(raw["val"]) == 1 and len(raw["train"]) == 3, {k: [e.uid for e in v] for k, v in raw.items()}
    assert task.num_unscorable == 1 and [*task.unscorable["train"], *task.unscorable["val"]] == ["math_train/4"], (
        task.unscorable
    )
    kept = [e.question for e in val + train]
    assert "Pick one." not in kept and "What  is\n$1+1$?" not in kept, kept
    assert all(e.data["scorable"] for e in test + val + train), "a kept example is not scorable"
    assert {e.data["level"] for e in val + train} <= {1, 3, None}, [e.data for e in val + train]
    assert all(e.demonstration is None for e in test + val + train), "no split may carry a demonstration"
    with pytest.raises(ValueError, match="no demonstrations"):
        task.demonstrations()
    again = Math(MathConfig(data_root=str(tmp_path), val_size=1))
    assert [e.uid for e in again.load_split("val")] == [e.uid for e in val], "val choice is not stable"


def test_missing_data_root_raises_with_fix(tmp_path: Path, monkeypatch) -> None:
    """A data root without math/ (or no root and no `datasets`) raises FileNotFoundError naming the path and
    BENCH_DATA."""
    task = Math(MathConfig(data_root=str(tmp_path)))
    with pytest.raises(FileNotFoundError) as err:
        task.load_split("test")
    msg = str(err.value)
    assert str(tmp_path / "math" / "math500_test.jsonl") in msg and "BENCH_DATA" in msg, msg
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError, whatever is installed
    with pytest.raises(FileNotFoundError, match="BENCH_DATA") as err:
        Math(MathConfig(data_root=None)).load_split("train")
    assert "HuggingFaceH4/MATH-500" in str(err.value), str(err.value)


@pytest.fixture(scope="module")
def real_task() -> Math:
    return Math(MathConfig(data_root=str(data_root())))


def test_math500_split(real_task: Math) -> None:
    """test = the 500 MATH-500 problems, all scorable, unique uids, first record as in the module docstring."""
    test = real_task.load_split("test")
    assert len(test) == 500 and real_task.unscorable["test"] == [], (len(test), real_task.unscorable["test"])
    assert len({e.uid for e in test}) == 500, "duplicate uids in test"
    first = test[0]
    assert first.uid == "math500/test/precalculus/807" and first.answer == "\\left( 3, \\frac{\\pi}{2} \\right)", first
    assert first.data["level"] == 2 and first.data["subject"] == "Precalculus", first.data


def test_all_math500_gold_solutions_score_one(real_task: Math) -> None:
    """Every MATH-500 gold solution scores 1 through the full extraction + worker verification path."""
    M.pool().warm_up()
    t0 = time.perf_counter()
    failed = []
    for e in real_task.load_split("test"):
        res = real_task.reward(e, e.data["solution"])
        if res.score != 1.0:
            failed.append((e.uid, e.answer, res.info))
    elapsed = time.perf_counter() - t0
    assert not failed, f"{len(failed)} gold solutions failed, e.g. {failed[:3]}"
    print(f"500 MATH-500 solutions scored in {elapsed:.1f}s")


def test_train_val_disjoint_from_math500(real_task: Math) -> None:
    """Train and val never contain a MATH-500 problem and share none with each other; val has val_size problems."""
    test_keys = {normalise_problem(e.question) for e in real_task.load_split("test")}
    raw = real_task._split_train()
    train_keys = [normalise_problem(e.question) for e in raw["train"]]
    val_keys = [normalise_problem(e.question) for e in raw["val"]]
    assert len(val_keys) == real_task.cfg.val_size, len(val_keys)
    assert not test_keys & set(train_keys) and not test_keys & set(val_keys), "train/val contain MATH-500 problems"
    assert not set(train_keys) & set(val_keys), "train and val overlap"
    assert len(set(train_keys)) == len(train_keys), "duplicate train problems"
    assert real_task.overlap_removed == 0 and real_task.duplicates_removed == 1, (
        real_task.overlap_removed,
        real_task.duplicates_removed,
    )
    assert len(raw["train"]) + len(raw["val"]) == 7499, len(raw["train"]) + len(raw["val"])


def test_eval_prompts_render(real_task: Math) -> None:
    """instruction and plain_prompt are non-empty for every eval example; plain prompts fit the tiny model."""
    limit = real_task.cfg.plain_prompt_chars + 1
    for e in real_task.load_split("test") + real_task.load_split("val"):
        instr, plain = real_task.instruction(e), real_task.plain_prompt(e)
        assert instr.strip() and PROMPT_SUFFIX in instr, f"{e.uid}: instruction {instr[:80]!r}"
        assert plain.strip() and len(plain) <= limit and plain.count("\n") == 1, f"{e.uid}: plain {plain!r}"
    assert len(real_task.eval_examples()) == real_task.cfg.num_eval, len(real_task.eval_examples())


@pytest.mark.slow
def test_full_train_split(real_task: Math) -> None:
    """The loaded train split: every gold checked; 11 unscorable train/val golds dropped and counted (stored data)."""
    train, val = real_task.load_split("train"), real_task.load_split("val")
    dropped = real_task.unscorable["train"] + real_task.unscorable["val"]
    assert len(train) + len(val) + len(dropped) == 7499, (len(train), len(val), len(dropped))
    assert len(dropped) == 11, f"expected 11 unscorable golds in the stored data, got {len(dropped)}: {dropped}"
    assert all(e.data["scorable"] and e.demonstration is None for e in train), "unscorable or demo in train"
    with pytest.raises(ValueError, match="no demonstrations"):
        real_task.demonstrations()
