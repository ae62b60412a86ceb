"""GSM8K: grade-school math word problems with a single numeric answer, solved by step-by-step reasoning.

Dataset and paper: Cobbe et al. 2021, "Training Verifiers to Solve Math Word Problems" (arXiv:2110.14168), data from
https://github.com/openai/grade-school-math (hub dataset ``openai/gsm8k``, config ``main``). One literal record, as
stored in ``<data_root>/gsm8k/test.jsonl``::

    {"question": "Janet\u2019s ducks lay 16 eggs per day. ... How much in dollars does she make every day at the
     farmers' market?",
     "answer": "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\\nShe makes 9 * 2 = $<<9*2=18>>18 every day
     at the farmer\u2019s market.\\n#### 18"}

The gold answer is the number after ``####`` in ``answer`` with commas removed (``"18"``); every one of the 8,792
gold answers is an integer (3 train and 2 test ones negative, 93 written with thousands commas).

Reward in one sentence: 1.0 iff the number written right after the LAST ``####`` of the completion equals the gold
answer as an exact rational number (``18``, ``18.0``, ``$18`` and ``18.`` are all 18), else 0.0.

version = "3"
    1: initial version (strict ``####`` score; strict/lenient/format components; hash-chosen val rows).
    2: strict: ``#### **18**`` (markdown emphasis) is 18; ``#### 1e3``, ``#### 3 1/2``, ``#### 5:30`` are no answer
       (version 1 read 1, 3 and 5).
    3: ``1 000`` with a no-break, narrow no-break or thin space (U+00A0, U+202F, U+2009) between valid 3-digit groups
       is 1000, strict and lenient (version 2 read 1); strict: ``#### 18**2`` (a power), ``#### 5h30``,
       ``#### 5 : 30`` and ``#### 3 ½`` (a vulgar-fraction character, also glued: ``3½``) are no answer (version 2
       read 18, 5, 5 and 3); emphasis with blanks inside (``#### ** 18 **``), a currency sign before it
       (``#### $**18**``) and a code span (``#### `18```) are read through: 18 (version 2: no answer). An ASCII
       space between groups (``#### 1 000``) stays no answer: it cannot be told from ``3 1/2`` or a list.

Answer format (the instructed, "strict" format): reason step by step, then a final line ``#### <number>``, e.g.
``#### 18``. Components, logged side by side as the field notes ask ("a strict GSM8K scorer that demands ``####``
gives 0 to models that do not write it; report strict and lenient accuracy side by side"):

- ``strict`` (= score): the number right after the last ``####`` equals the gold answer;
- ``lenient``: the last number anywhere in the completion equals the gold answer (lm-evaluation-harness's
  "flexible-extract" idea), so a model that answers right without ``####`` is visible;
- ``format``: the last ``####`` is followed by a number. The instruction shows only the placeholder
  ``#### <number>`` (no digits), so echoing the prompt never earns it, and the reward reads the completion only.

Numbers (``parse_number``; one regex, NUMBER_RE, shared by gold, strict and lenient extraction):

- ASCII digits, optional thousands separators in valid 3-digit groups, one kind per number: commas (``1,000``,
  ``1,234,567``) or a no-break, narrow no-break or thin space (``1\u00a0000``; an ASCII space is not one), optional
  decimal part (``18.0``, ``.5``, ``1,000.50``); a run of digits, commas and dots that is not one such number (``1,00``,
  ``1,0000``, ``1.2.3``, a list written without spaces ``3,4,5``) is no number at all, not several;
- an optional sign ``-``, ``+`` or U+2212 ``−`` and an optional currency prefix ``$ € £`` in either order
  (``-$5``, ``$-5``);
- a trailing sentence period is not part of the number (``18.`` is 18); ``%`` and units after the number are
  ignored (``25%`` is 25: GSM8K's percentage questions have golds in percent points, e.g. "What percentage ..." ->
  ``#### 25``);
- a fraction ``3/4`` is two numbers, and scientific notation is not supported (every gold is an integer);
- number strings longer than MAX_NUMBER_CHARS are rejected before conversion;
- comparison is exact (``fractions.Fraction``), never float equality.

Data and splits: train = ``train.jsonl`` minus ``num_val`` (200) rows held out as val, chosen as the rows with the
smallest ``sha256(f"{split_seed}/{question}")`` (no question repeats in train.jsonl, so val and train are disjoint
by question); val keeps file order; test = ``test.jsonl`` (1,319 rows, no question shared with train). A uid names
the source row: ``gsm8k-train-<row>`` (also for val rows) or ``gsm8k-test-<row>``. Demonstrations are the gold
solutions with the ``<<...>>`` calculator annotations removed and the final line rewritten as ``#### <gold>``
(commas removed), i.e. exactly the instructed format. Without a data root, the hub dataset is used when the
``datasets`` package imports; otherwise the standard missing-data error is raised.

Prompts: chat models get ``instruction`` (question + format instruction). ``plain_prompt`` (tokenizers without a
chat template, in practice the tiny character-level model with 256 positions) is the question cut to
``plain_prompt_chars`` characters at a word boundary, plus a newline: GSM8K questions run to 985 characters, which
would leave the tiny model no room to answer. That model cannot solve GSM8K; it only smoke-tests the pipeline.

Structure hooks: ``answer_span`` is the span of the last ``#### <number>`` (from ``####`` to the end of the number);
``segment`` starts a segment at the first non-blank character of each line, at each sentence start after
``. ! ?``, and at the final ``####``.

Deviations from the reference scorer (``grade_school_math/dataset.py``: ``ANS_RE = r"#### (\\-?[0-9\\.\\,]+)"``,
first match, commas stripped, string equality), per docs/field-notes.md "Rewards", each marked
``# NOTE(deviation)`` below: last ``####`` instead of the first match; any horizontal whitespace (or none) after
``####``; numeric instead of string equality; ``$ € £``, ``+`` and ``−`` accepted; commas must form valid groups;
``#### <number>`` directly followed by an arithmetic operator and another number (``#### 3+15``) is not an answer,
nor is the first piece of ``#### 1e3``, ``#### 3 1/2`` or ``#### 5:30``; markdown emphasis ``#### **18**`` is read
through; only the last MAX_SCAN_CHARS characters are searched.
"""

from __future__ import annotations

import hashlib
import re
from collections import deque
from dataclasses import dataclass
from fractions import Fraction

from bench.task import Example, RewardResult, Split, Task, TaskConfig, read_jsonl

# ---- numbers ------------------------------------------------------------------------------------------------------

# NOTE(deviation): only the tail is searched (the reference regex scans everything); bounds the reward's cost.
MAX_SCAN_CHARS = 16_384
"""Only this tail of a completion is searched (about 4k tokens of text, far beyond a GSM8K solution, whose gold
solutions are at most 1,137 characters); every search below is linear in it, so a 100 kB completion costs the same
as a 16 kB one."""
MAX_NUMBER_CHARS = 40
"""A number string longer than this (sign, currency, commas and digits) is rejected before conversion; gold answers
have at most 9 characters."""
ANSWER_MARK = "####"
PROMPT_FORMAT = "#### <number>"
"""The format line shown in the instruction: a placeholder without digits, so echoing it earns nothing."""

# NOTE(deviation): the reference reads r"\-?[0-9\.\,]+" and strips every comma; here "+", U+2212 and "$ € £" are
# accepted and commas must form valid thousands groups (the reference reads "3,4" as 34).
# Sign and currency in either order, then digits with valid thousands groups or plain digits, then a decimal part;
# or a bare decimal part (".5"). ASCII digits only: str.isdigit / \d would accept fullwidth and Arabic-Indic digits.
_NUMBER_BODY = (
    r"(?P<pre>[-+\u2212][$\u20ac\u00a3]?|[$\u20ac\u00a3][-+\u2212]?)?"
    r"(?P<digits>(?:[0-9]{1,3}(?P<sep>[,\u00a0\u202f\u2009])[0-9]{3}(?:(?P=sep)[0-9]{3})*|[0-9]+)(?:\.[0-9]+)?"
    r"|\.[0-9]+)"
)
# Not glued to a preceding digit, dot or "digit," nor followed by a digit group: a run such as "1.2.3", "1,0000" or
# "1,2,3" is not a number at all (no piece of it is read), while "18." ends a sentence and "18," a clause. Starting
# only at the beginning of a digit/comma run also keeps the scan linear: a match may start inside a run like
# "0,000,000,...0" only there, not after each comma (which made 100 kB of comma groups quadratic).
NUMBER_RE = re.compile(
    r"(?<![0-9.])(?<![0-9][,\u00a0\u202f\u2009])" + _NUMBER_BODY + r"(?![0-9]|[.,\u00a0\u202f\u2009][0-9])"
)
_FULL_NUMBER_RE = re.compile(r"\s*" + _NUMBER_BODY + r"(?![0-9]|[.,][0-9])\s*%?\.?\s*")
# After the last "####": horizontal whitespace, the number, and no "<op> <number>" right after it ("#### 3+15").
# NOTE(deviation): "#### 3+15" or "#### 20 - 2" is an expression, not an answer (the reference reads 3 and 20).
_NOT_AN_EXPRESSION = r"(?![ \t]*(?:\*\*[ \t]*[0-9]|[-+*/^=\u00d7\u00f7\u2212\u2013][ \t]*[0-9.$]))"
# NOTE(deviation): nor is the first piece of a longer numeric form read as the answer (the reference reads the leading
# digits): scientific notation "#### 1e3" (not 1, and not 1000: no gold is written so), a mixed number "#### 3 1/2"
# or "#### 3 ½" (not 3), a time or ratio "#### 5:30", "#### 5 : 30", "#### 5h30" (not 5), digits after a blank
# ("#### 1 000": not 1). All score strict 0: every GSM8K gold is a plain integer.
_VULGAR_FRACTIONS = "\u00bc-\u00be\u2150-\u215e"
_NOT_A_PIECE = (
    r"(?![eE][-+]?[0-9]|[ \t]*:[ \t]*[0-9]|[hH][0-9]|[ \t\u00a0\u202f\u2009]+[0-9]"
    rf"|[ \t\u00a0]*[{_VULGAR_FRACTIONS}])"
)
# Markdown emphasis or a code span around the number ("#### **18**", "#### *18*", "#### __18__", "#### `18`", with
# blanks inside: "#### ** 18 **"; a currency sign before it: "#### $**18**") is read through: a common habit of chat
# models, with the same closing marker required (the opening one alone is not emphasis).
_AFTER_MARK_RE = re.compile(
    r"[ \t\u00a0]*(?:[$\u20ac\u00a3](?=\*|_|`))?(?P<em>\*\*|\*|__|`)?(?(em)[ \t]*)(?P<num>"
    + _NUMBER_BODY
    + r")(?![0-9]|[.,][0-9])"
    + _NOT_A_PIECE
    + r"(?(em)[ \t]*(?P=em))"
    + _NOT_AN_EXPRESSION
)
_ANNOTATION_RE = re.compile(r"<<[^<>]*>>")
"""GSM8K calculator annotations, e.g. ``<<16-3-4=9>>``: none of the 8,792 solutions nests ``<`` or ``>`` in one."""
_LINE_START_RE = re.compile(r"(?m)^[ \t]*(?=\S)")
_SENTENCE_START_RE = re.compile(r"(?<=[.!?])[ \t]+(?=[A-Z])")


def _to_fraction(pre: str | None, digits: str) -> Fraction | None:
    """Exact value of a matched number; None when the string is absurdly long."""
    if len(digits) + len(pre or "") > MAX_NUMBER_CHARS:
        return None
    value = Fraction(re.sub("[,\u00a0\u202f\u2009]", "", digits))  # Fraction parses "18.0", ".5", "1000.50" exactly
    return -value if pre and ("-" in pre or "\u2212" in pre) else value


def parse_number(text: str) -> Fraction | None:
    """The exact value of a string that is one number (see the module docstring), or None.

    ``" $1,000.50 "`` -> 2001/2, ``"-3"`` -> -3, ``"18."`` -> 18, ``"25%"`` -> 25, ``"1,00"`` -> None.
    """
    if not isinstance(text, str) or len(text) > 4 * MAX_NUMBER_CHARS:
        return None
    m = _FULL_NUMBER_RE.fullmatch(text)
    return None if m is None else _to_fraction(m["pre"], m["digits"])


def numbers_equal(a: str, b: str) -> bool:
    """True iff both strings parse as numbers with the same exact value (``"18.0"``, ``"$18"``, ``"18"``)."""
    x, y = parse_number(a), parse_number(b)
    return x is not None and y is not None and x == y


def _strict_match(completion: str) -> tuple[int, re.Match | None] | None:
    """(offset of the last ``####`` in the completion, the match of the number after it or None), or None without
    any ``####``. The match's offsets are relative to the completion's tail; see ``answer_span``."""
    tail = completion[-MAX_SCAN_CHARS:]
    # NOTE(deviation): the LAST "####" (the reference takes the first regex match): a model that revises its answer is
    # scored on its final one, and only one answer per completion counts either way.
    pos = tail.rfind(ANSWER_MARK)
    if pos < 0:
        return None
    # NOTE(deviation): "#### $18", "####18" and "#### 18.0" are read as 18; the reference needs exactly one space and
    # compares strings, so it gives these 0 (field notes: "18.0 = 18 = $18").
    return len(completion) - len(tail) + pos, _AFTER_MARK_RE.match(tail, pos + len(ANSWER_MARK))


def extract_strict(completion: str) -> str | None:
    """The number text right after the last ``####`` (the instructed format), or None."""
    found = _strict_match(completion)
    return None if found is None or found[1] is None else found[1]["num"]


def extract_lenient(completion: str) -> str | None:
    """The text of the last number anywhere in the completion's tail, or None."""
    last = deque(NUMBER_RE.finditer(completion[-MAX_SCAN_CHARS:]), maxlen=1)
    return last[0].group(0) if last else None


def answer_span(completion: str) -> tuple[int, int] | None:
    """[start, end) of the final ``#### <number>``: from the last ``####`` to the end of the number; None if the
    last ``####`` is not followed by a number."""
    found = _strict_match(completion)
    if found is None or found[1] is None:
        return None
    start, m = found
    return start, start + m.end("num") - m.pos + len(ANSWER_MARK)


def segment(completion: str) -> list[int]:
    """Sorted offsets where steps start: 0, the first non-blank character of each line, each sentence start after
    ``. ! ?`` + whitespace + capital letter, and the final ``####``. Linear time."""
    starts = {0}
    starts.update(m.end() for m in _LINE_START_RE.finditer(completion))
    starts.update(m.end() for m in _SENTENCE_START_RE.finditer(completion))
    span = answer_span(completion)
    if span is not None:
        starts.add(span[0])
    return sorted(starts)


def demonstration(solution: str, gold: str) -> str:
    """A gold solution in the instructed format: calculator annotations removed, final line ``#### <gold>``."""
    body = solution.rsplit(ANSWER_MARK, 1)[0].rstrip()
    return f"{_ANNOTATION_RE.sub('', body)}\n{ANSWER_MARK} {gold}"


def gold_answer(solution: str) -> str | None:
    """The canonical gold answer of a GSM8K solution: the number after its last ``####``, commas removed (the
    reference's normalisation); None when absent or not a number."""
    if ANSWER_MARK not in solution:
        return None
    raw = solution.rsplit(ANSWER_MARK, 1)[1].strip()
    return raw.replace(",", "") if parse_number(raw) is not None else None


# ---- reward -------------------------------------------------------------------------------------------------------


def reward(example: Example, completion: str) -> RewardResult:
    """1.0 iff the number after the last ``####`` equals the gold answer exactly.

    Components: ``strict`` (= score), ``lenient`` (the last number anywhere equals the gold), ``format`` (the last
    ``####`` is followed by a number). info: ``strict`` and ``lenient`` (the extracted number texts or None),
    ``gold`` and ``reason``. Never raises on model output; cost is bounded by MAX_SCAN_CHARS.
    """
    gold = parse_number(str(example.answer))
    strict_text, lenient_text = extract_strict(completion), extract_lenient(completion)

    def result(reason: str, strict: float = 0.0, lenient: float = 0.0, fmt: float = 0.0) -> RewardResult:
        return RewardResult(
            score=strict,
            components={"strict": strict, "lenient": lenient, "format": fmt},
            info={"strict": strict_text, "lenient": lenient_text, "gold": example.answer, "reason": reason},
        )

    if gold is None:  # field notes: an unparseable gold must never score 1
        return result(f"unscorable gold answer {str(example.answer)[:40]!r}")
    strict_value = None if strict_text is None else parse_number(strict_text)
    lenient_value = None if lenient_text is None else parse_number(lenient_text)
    lenient = float(lenient_value == gold)
    if strict_text is None:
        why = "no '####'" if ANSWER_MARK not in completion[-MAX_SCAN_CHARS:] else "last '####' not followed by a number"
        return result(why, lenient=lenient)
    if strict_value is None:
        return result(f"number longer than {MAX_NUMBER_CHARS} chars", lenient=lenient, fmt=1.0)
    strict = float(strict_value == gold)
    reason = "ok" if strict else f"{strict_text} != {example.answer}"
    return result(reason, strict=strict, lenient=lenient, fmt=1.0)


# ---- DataModule ---------------------------------------------------------------------------------------------------


def val_rows(questions: list[str], num_val: int, split_seed: int) -> set[int]:
    """Indices of the ``num_val`` questions with the smallest ``sha256(f"{split_seed}/{question}")``: a fixed,
    order-independent choice (hashlib, not hash(), which is salted per process)."""
    keys = [hashlib.sha256(f"{split_seed}/{q}".encode()).digest() for q in questions]
    return set(sorted(range(len(questions)), key=keys.__getitem__)[:num_val])


@dataclass
class Gsm8kConfig(TaskConfig):
    name: str = "gsm8k"
    """Registry name of the task."""
    num_val: int = 200
    """Rows of train.jsonl held out as the val split (the rest is train)."""
    split_seed: int = 0
    """Seed of the hash that picks the val rows; independent of the run seed, so all runs share the split."""
    plain_prompt_chars: int = 96
    """plain_prompt cuts the question to at most this many characters (the tiny model has 256 positions)."""

    def __post_init__(self) -> None:
        if self.num_val < 0:
            raise ValueError(f"num_val must be >= 0, got {self.num_val}")
        if self.plain_prompt_chars < 8:
            raise ValueError(f"plain_prompt_chars must be >= 8, got {self.plain_prompt_chars}")


class Gsm8k(Task):
    scan = ("tail", MAX_SCAN_CHARS)  # the reward reads no more (Task.scan)
    Config = Gsm8kConfig
    version = "3"
    description = "Grade-school math word problems; final line '#### <number>' (GSM8K, Cobbe et al. 2021)."
    verified_component = "format"
    hub_dataset = "openai/gsm8k"

    cfg: Gsm8kConfig

    def __init__(self, cfg: Gsm8kConfig, tokenizer=None, **kwargs) -> None:
        super().__init__(cfg, tokenizer, **kwargs)
        self._rows: dict[str, list[Example]] = {}

    def _read(self, part: str) -> list[Example]:
        """All rows of ``train`` or ``test`` as Examples, from the data root or (no root, ``datasets`` installed)
        the hub. Malformed rows fail loudly with file and line."""
        if part in self._rows:
            return self._rows[part]
        if self.use_hub():
            where = f"{self.hub_dataset}[main/{part}]"
            records = list(self.load_hub(("gsm8k", f"{part}.jsonl"), "main", split=part))
        else:
            path = self.data_file("gsm8k", f"{part}.jsonl")
            where = str(path)
            records = read_jsonl(path)
        examples = []
        for i, rec in enumerate(records):
            question, solution = rec.get("question"), rec.get("answer")
            gold = gold_answer(solution) if isinstance(solution, str) else None
            if not isinstance(question, str) or not question.strip() or gold is None:
                raise ValueError(f"{where}: row {i}: expected a question and an answer ending in '#### <number>'")
            examples.append(
                Example(
                    uid=f"gsm8k-{part}-{i}",
                    question=question,
                    answer=gold,
                    demonstration=demonstration(solution, gold),
                    data={"solution": solution, "source": part, "row": i},
                )
            )
        self._rows[part] = examples
        return examples

    def load_split(self, split: Split) -> list[Example]:
        if split == "test":
            return list(self._read("test"))
        rows = self._read("train")
        if self.cfg.num_val >= len(rows):
            raise ValueError(f"num_val={self.cfg.num_val} leaves no train rows out of {len(rows)}")
        held = val_rows([e.question for e in rows], self.cfg.num_val, self.cfg.split_seed)
        return [e for i, e in enumerate(rows) if (i in held) == (split == "val")]

    def instruction(self, example: Example) -> str:
        return (
            f"{example.question}\n\nSolve the problem step by step. Then write the final answer on the last line in "
            f'the form "{PROMPT_FORMAT}", where <number> is the number only, without units.'
        )

    def plain_prompt(self, example: Example) -> str:
        q, n = " ".join(example.question.split()), self.cfg.plain_prompt_chars
        if len(q) > n:
            cut = q.rfind(" ", 0, n - 2)
            q = q[: cut if cut > 0 else n - 3].rstrip() + "..."
        return q + "\n"

    def reward(self, example: Example, completion: str) -> RewardResult:
        return reward(example, completion)

    def answer_span(self, completion: str) -> tuple[int, int] | None:
        return answer_span(completion)

    def segment(self, completion: str) -> list[int] | None:
        return segment(completion)
