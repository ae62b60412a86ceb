"""Summarization task: ROUGE reward table, multi-reference max, weights, cost bounds, splits, prompts, data loading."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.registry import TASKS
from bench.task import Task
from tasks.summarization import (
    DIALOGSUM_VAL,
    HUB_DATASETS,
    MAX_COMPLETION_CHARS,
    MAX_COMPLETION_TOKENS,
    XSUM_TEST,
    XSUM_VAL,
    Summarization,
    SummarizationConfig,
    chrf,
    clip_completion,
    dialogsum_dev_splits,
    make_example,
    reward,
    rouge_max,
    truncate_words,
    xsum_splits,
)
from tests.conftest import data_root as conftest_data_root

COMPONENTS = {"rouge1", "rouge2", "rougeL", "length_ratio", "chrf"}

DOC = (
    "Prison Link Cymru had 1,099 referrals in 2015-16 and said some ex-offenders were living rough for up to a year "
    "before finding suitable accommodation.\nWorkers at the charity claim investment in housing would be cheaper "
    "than jailing homeless repeat offenders."
)
REF = 'There is a "chronic" need for more housing for prison leavers in Wales, according to a charity.'
EX = make_example("xsum", "t-0", DOC, [REF], "test")

DIALOGUE = "#Person1#: Hello, how are you doing today?\n#Person2#: I've been having trouble breathing lately."
REFS3 = (
    "#Person2# has trouble breathing and the doctor will send #Person2# to a specialist.",
    "The doctor asks #Person2# about the breathing problem.",
    "#Person1# refers #Person2# to a pulmonary specialist for asthma tests.",
)
MULTI = make_example("dialogsum", "t-1", DIALOGUE, REFS3, "test")

GARBAGE = "zq#x9 ~~ ]]{ vv0k |||| ?!? " * 4000  # ~100 kB
assert len(GARBAGE) >= 100_000


def data_root() -> Path | None:
    return conftest_data_root("summarization")


def task_for(corpus: str) -> Summarization:
    root = data_root()
    if root is None:
        pytest.skip("BENCH_DATA is unset or has no summarization/ folder; set BENCH_DATA=../shared/data")
    return Summarization(SummarizationConfig(corpus=corpus, data_root=str(root)))


# ---- reward table -------------------------------------------------------------------------------------------------

REWARD_CASES = [
    # (id, completion, lowest score, highest score)
    ("reference", REF, 1.0, 1.0),
    ("reference_uppercased", REF.upper(), 1.0, 1.0),
    ("reference_no_punctuation", REF.replace('"', "").replace(",", "").replace(".", ""), 1.0, 1.0),
    ("reference_padded_whitespace", "\n\n  " + REF + "  \n", 1.0, 1.0),
    ("reference_in_tags", f"<summary>{REF}</summary>", 0.8, 0.99),
    ("reference_twice", REF + " " + REF, 0.5, 0.8),
    ("reference_words_reversed", " ".join(reversed(REF.split())), 0.3, 0.6),
    ("half_the_reference", " ".join(REF.split()[:8]), 0.3, 0.8),
    ("empty", "", 0.0, 0.0),
    ("whitespace_only", " \n\t " * 50, 0.0, 0.0),
    ("punctuation_only", "!!! ... ??? --- ### *** " * 20, 0.0, 0.0),
    ("non_ascii_only", "监狱慈善机构表示需要更多住房。", 0.0, 0.0),
    ("null_bytes", "\x00" * 1000, 0.0, 0.0),
    ("lone_surrogate_then_reference", "\ud800" + REF, 1.0, 1.0),
    (
        "prompt_instruction_echoed",
        "Summarize the following article in one sentence. Reply with the summary only.",
        0.0,
        0.15,
    ),
    ("document_copied", DOC, 0.0, 0.3),
    ("garbage_100kB", GARBAGE, 0.0, 0.02),
    ("garbage_100kB_then_reference", GARBAGE + REF, 0.0, 0.02),
    ("reference_then_garbage_100kB", REF + " " + GARBAGE, 0.0, 0.2),
    ("one_word_100kB", "a" * 100_000, 0.0, 0.0),
    ("single_letters_10MB", "a " * 5_000_000, 0.0, 0.05),
    ("stopwords_repeated", "the a in of to for " * 300, 0.0, 0.1),
]


@pytest.mark.parametrize(("completion", "lo", "hi"), [c[1:] for c in REWARD_CASES], ids=[c[0] for c in REWARD_CASES])
def test_reward_table(completion: str, lo: float, hi: float) -> None:
    """Hostile completions score in the intended range within [0, 1], never raise, and return within 0.5 s."""
    t0 = time.perf_counter()
    res = reward(EX, completion)
    elapsed = time.perf_counter() - t0
    assert lo <= res.score <= hi, f"score {res.score} not in [{lo}, {hi}]; components={res.components}"
    assert 0.0 <= res.score <= 1.0, f"score out of range: {res.score}"
    assert set(res.components) == COMPONENTS, f"components: {res.components}"
    assert all(0.0 <= res.components[k] <= 1.0 for k in ("rouge1", "rouge2", "rougeL", "chrf")), f"{res.components}"
    assert isinstance(res.info["reason"], str) and res.info["reason"], f"missing reason: {res.info}"
    assert res.info["tokens"] <= MAX_COMPLETION_TOKENS, f"scored {res.info['tokens']} tokens"
    assert elapsed < Task.reward_time_bound_s(None), f"reward took {elapsed:.3f}s"  # the task contract's bound


def test_reward_components_and_info() -> None:
    """The reference has all components 1 and length_ratio 1; an empty completion has all 0 and says why."""
    gold = reward(EX, REF)
    assert gold.components == {"rouge1": 1.0, "rouge2": 1.0, "rougeL": 1.0, "length_ratio": 1.0, "chrf": 1.0}, gold
    assert gold.info["clipped"] is False and gold.info["references"] == 1, gold.info
    empty = reward(EX, "")
    assert empty.components == dict.fromkeys(COMPONENTS, 0.0), empty
    assert "no ROUGE tokens" in empty.info["reason"], empty.info
    twice = reward(EX, REF + " " + REF)
    assert twice.components["length_ratio"] == 2.0 and twice.components["rouge1"] < 1.0, twice.components


def test_one_token_reference() -> None:
    """A one-token reference scores 1 against itself (ROUGE-2 falls back to ROUGE-1 without bigrams)."""
    ex = make_example("xsum", "t-one", "doc", ["Resigned."], "test")
    assert reward(ex, "resigned").score == 1.0, reward(ex, "resigned")
    assert reward(ex, "He resigned").components["rouge2"] == reward(ex, "He resigned").components["rouge1"] < 1.0


def test_stemming_is_on() -> None:
    """use_stemmer=True: inflections of the reference's words match (councils/council, voted/votes)."""
    ex = make_example("xsum", "t-stem", "doc", ["The council votes on housing"], "test")
    res = reward(ex, "the councils voted on housing")
    assert res.score == 1.0, f"stemmed match should score 1: {res}"
    assert res.components["chrf"] < 1.0, f"chrF is character-level and does not stem: {res.components}"


def test_reward_is_deterministic_and_pure() -> None:
    """Two calls give identical results and do not modify the example."""
    before = (EX.answer, EX.question, dict(EX.data))
    assert reward(EX, REF[:40]) == reward(EX, REF[:40]), "reward is not deterministic"
    assert (EX.answer, EX.question, dict(EX.data)) == before, "reward modified the example"


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=3000))
def test_reward_never_raises(completion: str) -> None:
    """Arbitrary unicode text scores in [0, 1] against one and three references without raising."""
    for ex in (EX, MULTI):
        res = reward(ex, completion)
        assert 0.0 <= res.score <= 1.0, f"score {res.score} for {completion[:80]!r}"


@settings(max_examples=100, deadline=None)
@given(st.lists(st.from_regex(r"[A-Za-z0-9]{1,12}", fullmatch=True), min_size=1, max_size=40))
def test_any_reference_scores_one(words: list[str]) -> None:
    """Any reference with ROUGE tokens scores exactly 1.0 against itself."""
    text = " ".join(words) + "."
    ex = make_example("xsum", "t-prop", "doc", [text], "test")
    assert reward(ex, text).score == 1.0, f"{text!r} does not score 1 against itself"


# ---- multiple references, weights ---------------------------------------------------------------------------------


def test_multi_reference_max() -> None:
    """Each of three references scores 1; every ROUGE component is the max over single-reference scores."""
    for ref in REFS3:
        assert reward(MULTI, ref).score == 1.0, f"reference {ref!r} scored {reward(MULTI, ref)}"
    completion = "The doctor will send #Person2# to a specialist for breathing tests."
    multi = reward(MULTI, completion)
    singles = [
        reward(make_example("dialogsum", f"s{i}", DIALOGUE, [r], "test"), completion) for i, r in enumerate(REFS3)
    ]
    for k in ("rouge1", "rouge2", "rougeL", "chrf"):
        best = max(s.components[k] for s in singles)
        assert multi.components[k] == best, f"{k}: multi {multi.components[k]} != max of singles {best}"
    assert multi.score >= max(s.score for s in singles), f"{multi.score} < {[s.score for s in singles]}"
    assert multi.info["references"] == 3, multi.info


@pytest.mark.parametrize(
    ("weights", "expected"),
    [
        ({"rouge1": 1.0, "rouge2": 0.0, "rougeL": 0.0}, lambda c: c["rouge1"]),
        ({"rouge1": 0.0, "rouge2": 1.0, "rougeL": 0.0}, lambda c: c["rouge2"]),
        ({"rouge1": 0.0, "rouge2": 0.0, "rougeL": 5.0}, lambda c: c["rougeL"]),
        ({"rouge1": 1.0, "rouge2": 1.0, "rougeL": 1.0}, lambda c: (c["rouge1"] + c["rouge2"] + c["rougeL"]) / 3),
        ({"rouge1": 3.0, "rouge2": 1.0, "rougeL": 0.0}, lambda c: (3 * c["rouge1"] + c["rouge2"]) / 4),
    ],
)
def test_mix_weights(weights, expected) -> None:
    """The score is the weighted mean of the ROUGE F1 components; the task passes its config weights through."""
    completion = " ".join(reversed(REF.split()[:10]))  # distinct rouge1 / rouge2 / rougeL values
    res = reward(EX, completion, weights=weights)
    c = res.components
    assert len({c["rouge1"], c["rouge2"], c["rougeL"]}) == 3, f"test completion needs distinct components: {c}"
    assert res.score == pytest.approx(expected(c), abs=1e-12), f"weights {weights}: {res.score} vs {expected(c)}"
    cfg = SummarizationConfig(
        rouge1_weight=weights["rouge1"], rouge2_weight=weights["rouge2"], rougeL_weight=weights["rougeL"]
    )
    assert Summarization(cfg).reward(EX, completion) == res, "Summarization.reward ignores its config weights"
    assert reward(EX, REF, weights=weights).score == 1.0, f"reference must score 1 under weights {weights}"


def test_correct_threshold() -> None:
    """is_correct compares the score with correct_threshold (default 0.5)."""
    task = Summarization(SummarizationConfig())
    assert task.cfg.correct_threshold == 0.5, task.cfg
    assert task.is_correct(reward(EX, REF)) and not task.is_correct(reward(EX, "housing")), "threshold 0.5"
    strict = Summarization(SummarizationConfig(correct_threshold=1.0))
    assert not strict.is_correct(reward(EX, REF[:-20])), "a partial summary is not correct at threshold 1.0"


def test_config_validation() -> None:
    """Bad configs fail at construction, naming the field."""
    with pytest.raises(ValueError, match="corpus"):
        SummarizationConfig(corpus="cnndm")
    with pytest.raises(ValueError, match="weight"):
        SummarizationConfig(rouge2_weight=-1.0)
    with pytest.raises(ValueError, match="weight"):
        SummarizationConfig(rouge1_weight=0.0, rouge2_weight=0.0, rougeL_weight=0.0)
    with pytest.raises(ValueError, match="correct_threshold"):
        SummarizationConfig(correct_threshold=1.5)
    with pytest.raises(ValueError, match="plain_prompt_chars"):
        SummarizationConfig(plain_prompt_chars=0)


# ---- cost bounds --------------------------------------------------------------------------------------------------


def test_truncation_bound() -> None:
    """Only the first MAX_COMPLETION_CHARS chars / MAX_COMPLETION_TOKENS tokens count; below the bounds scores equal
    rouge_score's on the raw text."""
    filler = "lorem ipsum " * (MAX_COMPLETION_CHARS // 12 + 1)
    late = reward(EX, filler + REF)
    assert late.components["rouge2"] == 0.0 and late.info["clipped"], f"text past the bound was scored: {late}"
    head = (filler + REF)[:MAX_COMPLETION_CHARS]
    assert reward(EX, filler + REF).components == reward(EX, head).components, "scores depend on text past the bound"
    many = "a1 " * 600  # 1800 chars, 600 tokens
    text, n, cut = clip_completion(many)
    assert n == MAX_COMPLETION_TOKENS and cut and len(text.split()) == MAX_COMPLETION_TOKENS, (n, cut)
    short = 'The council\'s new housing plan, costing £3m, was "approved" on Tuesday!'
    assert rouge_max([REF], clip_completion(short)[0]) == rouge_max([REF], short), "clipping changed a short text"
    t0 = time.perf_counter()
    reward(MULTI, "word " * 2_000_000)
    assert time.perf_counter() - t0 < 0.5, "a 10 MB completion is not bounded in time"


@pytest.mark.parametrize(
    "reference,hypothesis",
    [("Hello world, this is a summary.", "This is the summary of the world."),
     ("A man was arrested after a fire at a house in Leeds.", "Police arrested a man after a house fire in Leeds."),
     ("the cat sat on the mat today", "a cat sat on a mat")],
)  # fmt: skip
def test_chrf_matches_torchmetrics(reference, hypothesis):
    """The peer check the design names: torchmetrics' chrF (character orders only) gives the same sentence score. Its
    eps smoothing of orders with no match moves the third pair by 2e-4; the others agree to 1e-6. (It is not used
    in the reward: 4 ms a call against 0.07 ms here, and the held-out metrics need per-problem values it does not
    keep: docs/development.md.)"""
    from torchmetrics.functional.text import chrf_score

    theirs = float(chrf_score([hypothesis], [[reference]], n_word_order=0))
    assert chrf(reference, hypothesis) == pytest.approx(theirs, abs=1e-6 if "cat" not in reference else 3e-4)


def test_chrf_matches_sacrebleu() -> None:
    """chrF reproduces sacrebleu's documented sentence score (61.576 for the Obama/Netanyahu example) and is 1 on
    identical strings."""
    hyp = "The relationship between Obama and Netanyahu is not exactly friendly."
    ref = "The ties between Obama and Netanyahu are not particularly friendly."
    assert chrf(ref, hyp) == pytest.approx(0.61576379378113785, abs=1e-9), chrf(ref, hyp)
    assert chrf(ref, ref) == 1.0 and chrf(ref, "") == 0.0 and chrf("", hyp) == 0.0, "chrF edge cases"


# ---- structure hooks ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "starts"),
    [
        ("", [0]),
        ("One sentence only", [0]),
        ("First one. Second one! Third?", [0, 11, 23]),
        ('He said "stop." Then left.', [0, 16]),
        ("Line one\nLine two\n\n  Line three", [0, 9, 21]),
        ("Ends with a period. ", [0]),
        ("Mr. Smith arrived.", [0, 4]),
        ("....!!!???", [0]),
    ],
)
def test_segment(completion: str, starts: list[int]) -> None:
    """segment() gives sentence starts: 0, then the first character after each sentence end or newline."""
    task = Summarization(SummarizationConfig())
    assert task.segment(completion) == starts, f"{completion!r}: {task.segment(completion)}"


def test_answer_span_and_segment_bounds() -> None:
    """answer_span is the whole scored prefix (None when blank); segment is linear-time on 100 kB inputs."""
    task = Summarization(SummarizationConfig())
    assert task.answer_span(REF) == (0, len(REF)), task.answer_span(REF)
    assert task.answer_span("  \n") is None and task.answer_span("") is None, "blank completions have no span"
    assert task.answer_span(GARBAGE) == (0, MAX_COMPLETION_CHARS), task.answer_span(GARBAGE)
    for hostile in (GARBAGE, " " * 100_000 + "x", ".'" * 50_000, "\n" * 100_000 + "x", "." * 50_000 + "'" * 50_000):
        t0 = time.perf_counter()
        starts = task.segment(hostile)
        assert time.perf_counter() - t0 < 0.5, f"segment too slow on {hostile[:20]!r}"
        assert starts[0] == 0 and starts == sorted(set(starts)) and starts[-1] < len(hostile), starts[:5]


# ---- prompts ------------------------------------------------------------------------------------------------------


def test_prompts() -> None:
    """Exact prompts for both corpora; the plain prompt is short and the chat text is cut at a word boundary."""
    xsum = Summarization(SummarizationConfig(max_document_chars=60))
    assert xsum.instruction(EX) == (
        "Summarize the following article in one sentence. Reply with the summary only.\n\n"
        "Article:\nPrison Link Cymru had 1,099 referrals in 2015-16 and said"
    ), xsum.instruction(EX)
    assert xsum.plain_prompt(EX) == "summarize: " + " ".join(DOC.split())[:96].rstrip() + "\n", xsum.plain_prompt(EX)
    assert xsum.render_prompt(EX) == xsum.plain_prompt(EX), "no tokenizer -> plain prompt"
    dialog = Summarization(SummarizationConfig(corpus="dialogsum"))
    text = dialog.instruction(MULTI)
    assert text.startswith("Summarize the dialogue") and "#Person1#" in text and text.endswith(DIALOGUE), text
    assert dialog.plain_prompt(MULTI).startswith("summarize: #Person1#: Hello, how are you doing today? #Person2#:")


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [("short", 10, "short"), ("one two three", 9, "one two"), ("one two three", 7, "one two"), ("abcdefgh", 4, "abcd")],
)
def test_truncate_words(text: str, limit: int, expected: str) -> None:
    """truncate_words cuts at the last word boundary within the limit, or hard-cuts one long word."""
    assert truncate_words(text, limit) == expected, f"{text!r}, {limit}: {truncate_words(text, limit)!r}"


# ---- splits (pure) ------------------------------------------------------------------------------------------------


def test_hash_splits_are_fixed_and_disjoint() -> None:
    """Hash-ordered splits have exact sizes, do not depend on row order, and reject duplicate ids."""
    ids = [str(10_000_000 + 37 * i) for i in range(1000)]
    where = xsum_splits(ids)
    sizes = {s: sum(v == s for v in where.values()) for s in ("train", "val", "test")}
    assert sizes == {"train": 1000 - XSUM_TEST - XSUM_VAL, "val": XSUM_VAL, "test": XSUM_TEST}, sizes
    assert xsum_splits(list(reversed(ids))) == where, "split depends on row order"
    dev = dialogsum_dev_splits([f"dev_{i}" for i in range(500)])
    assert sum(v == "val" for v in dev.values()) == DIALOGSUM_VAL and set(dev.values()) == {"train", "val"}, dev
    with pytest.raises(ValueError, match="duplicate"):
        xsum_splits(["1", "2", "1"])


# ---- data ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("corpus", ["xsum", "dialogsum"])
def test_references_score_one(corpus: str) -> None:
    """Every reference of every val and test example scores exactly 1.0; so does every train demonstration."""
    task = task_for(corpus)
    for split in ("val", "test"):
        for e in task.load_split(split):
            for ref in e.answer:
                res = task.reward(e, ref)
                assert res.score == 1.0, f"{corpus} {split} {e.uid}: reference {ref[:60]!r} scored {res}"
    for e in task.load_split("train"):
        assert task.reward(e, e.demonstration).score == 1.0, f"{corpus} train {e.uid}: demonstration < 1"
    assert task.unscorable == [], f"unscorable references in the shipped data: {task.unscorable}"


def test_xsum_splits_on_data() -> None:
    """xsum: 700/100/200 rows, pairwise disjoint by id and document, covering all 1000 rows, one reference each."""
    task = task_for("xsum")
    splits = {s: task.load_split(s) for s in ("train", "val", "test")}
    assert {s: len(v) for s, v in splits.items()} == {"train": 700, "val": 100, "test": 200}, "split sizes"
    ids = {s: {e.data["id"] for e in v} for s, v in splits.items()}
    docs = {s: {e.question for e in v} for s, v in splits.items()}
    for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
        assert not ids[a] & ids[b], f"{a}/{b} share ids {sorted(ids[a] & ids[b])[:3]}"
        assert not docs[a] & docs[b], f"{a}/{b} share {len(docs[a] & docs[b])} documents"
    assert len(ids["train"] | ids["val"] | ids["test"]) == 1000, "splits must cover all 1000 rows"
    first = splits["test"][0]
    assert first.uid == f"xsum-{first.data['id']}" and len(first.answer) == 1 and first.demonstration == first.answer[0]
    assert task.hub_dataset == HUB_DATASETS["xsum"] == "EdinburghNLP/xsum", task.hub_dataset


def test_dialogsum_splits_on_data() -> None:
    """dialogsum: train 450 / val 50 from dev (disjoint), test = the 500 three-reference rows, no shared dialogue."""
    task = task_for("dialogsum")
    train, val, test = (task.load_split(s) for s in ("train", "val", "test"))
    assert (len(train), len(val), len(test)) == (450, 50, 500), (len(train), len(val), len(test))
    assert all(len(e.answer) == 1 for e in train + val) and all(len(e.answer) == 3 for e in test), "reference counts"
    assert not {e.uid for e in train} & {e.uid for e in val}, "train/val share fnames"
    held = {e.question for e in val} | {e.question for e in test}
    assert not {e.question for e in train} & held, "a training dialogue is in val or test"
    assert not {e.question for e in val} & {e.question for e in test}, "val and test share a dialogue"
    assert test[0].uid == "dialogsum-test_0" and test[0].answer[2].startswith("Ms. Dawson takes a dictation"), test[0]
    assert task.hub_dataset == "knkarthick/dialogsum", task.hub_dataset


@pytest.mark.parametrize("corpus", ["xsum", "dialogsum"])
def test_every_prompt_renders(corpus: str) -> None:
    """instruction and plain_prompt are non-empty for all eval examples; plain prompts fit the tiny model's budget."""
    from bench.engine.policy import char_tokenizer

    task = task_for(corpus)
    tok = char_tokenizer()
    budget = len("summarize: ") + task.cfg.plain_prompt_chars + 1
    for e in task.eval_examples():
        inst, plain = task.instruction(e), task.plain_prompt(e)
        assert inst.strip() and plain.strip(), f"{e.uid}: empty prompt"
        assert len(inst) <= task.cfg.max_document_chars + 400, f"{e.uid}: instruction {len(inst)} chars"
        assert len(plain) <= budget and len(tok(plain).input_ids) <= budget + 1, f"{e.uid}: plain prompt {plain!r}"
    assert len(task.eval_examples()) == task.cfg.num_eval, "eval set should be num_eval long"


def test_missing_data_root_raises(tmp_path: Path, monkeypatch) -> None:
    """A missing data file raises FileNotFoundError naming the path and BENCH_DATA (and the hub id when unset)."""
    task = Summarization(SummarizationConfig(corpus="dialogsum", data_root=str(tmp_path)))
    with pytest.raises(FileNotFoundError) as err:
        task.load_split("test")
    expected = str(tmp_path / "summarization" / "dialogsum" / "dialogsum_dev.jsonl")
    assert expected in str(err.value) and "BENCH_DATA" in str(err.value), str(err.value)
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError: no hub fallback
    unset = Summarization(SummarizationConfig(corpus="xsum", data_root=None))
    with pytest.raises(FileNotFoundError, match="BENCH_DATA") as err:
        unset.load_split("val")
    assert "EdinburghNLP/xsum" in str(err.value) and "xsum_test_1000.jsonl" in str(err.value), str(err.value)


def test_malformed_rows_fail_loudly(tmp_path: Path) -> None:
    """A row without a summary raises ValueError naming file and line; a well-formed fake file loads."""
    folder = tmp_path / "summarization" / "xsum"
    folder.mkdir(parents=True)
    rows = [{"document": f"Doc {i} text.", "summary": f"Summary number {i}.", "id": str(i)} for i in range(400)]
    (folder / "xsum_test_1000.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    task = Summarization(SummarizationConfig(data_root=str(tmp_path)))
    assert len(task.load_split("test")) == XSUM_TEST and len(task.load_split("train")) == 400 - XSUM_TEST - XSUM_VAL
    rows[5] = {"document": "x", "id": "5"}
    (folder / "xsum_test_1000.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(ValueError, match=r"xsum_test_1000\.jsonl:6"):
        Summarization(SummarizationConfig(data_root=str(tmp_path))).load_split("test")


def test_registry_and_version() -> None:
    """tasks/summarization.py registers as 'summarization' with a version and a per-corpus hub id."""
    cls = TASKS.get("summarization")
    assert cls is Summarization and cls.version == "1" and cls.description, (cls, cls.version)
    assert isinstance(cls.hub_dataset, str), "class-level hub_dataset must be a plain string"
    assert Summarization(SummarizationConfig(corpus="dialogsum")).hub_dataset == "knkarthick/dialogsum"
