"""Summarization: XSum news articles (one-sentence summaries) or DialogSum dialogues, scored by ROUGE.

Datasets: XSum (Narayan et al. 2018, "Don't Give Me the Details, Just the Summary!", EMNLP; hub
``EdinburghNLP/xsum``) and DialogSum (Chen et al. 2021, "DialogSum: A Real-Life Scenario Dialogue Summarization
Dataset", Findings of ACL; hub ``knkarthick/dialogsum``). ``task.corpus`` picks one. One literal record (shortened) of
``<data_root>/summarization/dialogsum/dialogsum_dev.jsonl``::

    {"fname": "dev_0", "dialogue": "#Person1#: Hello, how are you doing today?\\n#Person2#: I ' Ve been having
     trouble breathing lately.\\n...", "summary": "#Person2# has trouble breathing. The doctor asks #Person2# about it
     and will send #Person2# to a pulmonary specialist.", "topic": "see a doctor"}

``xsum/xsum_test_1000.jsonl`` rows are ``{"document", "summary", "id"}``; ``dialogsum/dialogsum_test.jsonl`` rows
carry three references ``summary1..3`` (and ``topic1..3``) instead of ``summary``.

Reward in one sentence: the weighted mean of ROUGE-1, ROUGE-2 and ROUGE-L F1 (``rouge_score`` with the Porter
stemmer, each the maximum over the references) between the first MAX_COMPLETION_CHARS / MAX_COMPLETION_TOKENS of the
completion and the reference summaries; a reference scores exactly 1.0, an empty completion 0.0.

ROUGE is a dense similarity reward, not correctness (docs/field-notes.md, "Rewards"). Therefore:

* ``correct_threshold`` defaults to 0.5: "correct" (eval/accuracy, pass@1) means a ROUGE mix of at least 0.5, about
  human agreement. For scale, with the default weights: each DialogSum test reference scored against the other two
  gets 0.49 on average and >= 0.5 in 42% of cases; the XSum lead-1 baseline (the article's first sentence) gets 0.11
  on our xsum test split and never 0.5; fine-tuned PEGASUS-large reports R1/R2/RL 47.2/24.6/39.3 on XSum (mix 0.37).
  Read eval/reward_mean first; accuracy is a coarse secondary view.
* The held-out metric is ``chrf``: character n-gram F-score (chrF2, Popovic 2015, sacrebleu's defaults: orders 1-6,
  beta 2, whitespace removed, case-sensitive, max over references), logged as ``reward/chrf`` and ``eval/chrf`` and
  never part of the score. ROUGE rising while chrF stalls is a sign of reward hacking (e.g. stem-matching word salad).

version = "1"
    1: initial version (hash-assigned splits of the offline subsets; ROUGE 1/2/L mix reward; chrF held-out metric).

Answer format: the completion is the summary, plain text, nothing else. Only its first MAX_COMPLETION_CHARS characters
and, of those, the first MAX_COMPLETION_TOKENS ROUGE tokens are scored, so a long ramble after the summary costs
precision and cannot cost time.

Data and splits (no training split exists offline, see data/README.md; the splits are fixed, not seed-dependent):

* xsum: the 1000 rows of ``xsum_test_1000.jsonl`` (all from the official XSum *test* split) are ordered by
  ``sha256("xsum:" + id)``: the first 200 are test, the next 100 val, the other 700 train. Each id lands in exactly
  one split (disjoint by construction). One reference each.
* dialogsum: ``dialogsum_dev.jsonl`` ordered by ``sha256("dialogsum:" + fname)``: the first 50 are val, the other
  450 train (one reference each); test = ``dialogsum_test.jsonl`` (500 rows, three references). The dev and test
  files share no dialogue.
* Online fallback: when ``task.data_root`` is unset and the ``datasets`` package imports, the hub dataset's own
  train / validation / test splits are used instead (rows sharing a text are grouped into one multi-reference
  example). Those eval sets differ from the offline ones: never compare numbers across the two modes.

Demonstrations (SFT): the first reference summary.

Prompts: the chat ``instruction`` asks for a one-sentence summary (xsum) or a short third-person summary that names
the speakers as the dialogue does, e.g. ``#Person1#`` (dialogsum, as its references do), followed by the text cut at
a word boundary to ``max_document_chars``. ``plain_prompt`` (tokenizers without a chat template: in practice the
tiny character-level model, one token per character and 256 positions) is ``"summarize: " + the first
plain_prompt_chars characters of the whitespace-collapsed text + "\\n"``: at most 108 characters by default, which
leaves 148 positions for the summary.

Deviations from the reference scorer (``rouge_score.RougeScorer(..., use_stemmer=True).score_multi``):
``# NOTE(deviation)`` the completion is cut to MAX_COMPLETION_CHARS characters and MAX_COMPLETION_TOKENS tokens before
scoring (identical scores below those bounds); the three F1 values are combined into one weighted mean; for a
one-token reference (no bigrams) ROUGE-1 stands in for ROUGE-2, else the reference itself would score 2/3 (no
reference in the shipped files is that short).
``rouge_score`` keeps only ASCII letters and digits, so non-Latin text scores 0.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rouge_score import rouge_scorer, tokenizers

from bench.task import Example, RewardResult, Split, Task, TaskConfig, read_jsonl

# ---- scoring ------------------------------------------------------------------------------------------------------

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")
DEFAULT_WEIGHTS: Mapping[str, float] = {"rouge1": 1.0, "rouge2": 1.0, "rougeL": 1.0}
"""Equal weights: the mean of R-1, R-2 and R-L F1, the single number usually quoted for XSum and RL4LMs' combined
ROUGE reward. ROUGE-2 keeps word-salad (right words, wrong order) from scoring well; ROUGE-L rewards order."""
MAX_COMPLETION_CHARS = 2000
"""Only this prefix is scored: about 5x the longest reference (467 chars), so no real summary is cut."""
MAX_COMPLETION_TOKENS = 400
"""Of that prefix, at most this many ROUGE tokens: bounds the O(n*m) LCS of ROUGE-L (2000 chars can hold 1000)."""
CHRF_ORDER, CHRF_BETA = 6, 2.0
"""sacrebleu's CHRF defaults (char_order=6, beta=2)."""

HUB_DATASETS = {"xsum": "EdinburghNLP/xsum", "dialogsum": "knkarthick/dialogsum"}
LOCAL_FILES = {
    "xsum": ("summarization", "xsum", "xsum_test_1000.jsonl"),
    "dialogsum": ("summarization", "dialogsum", "dialogsum_dev.jsonl"),
}
"""The data-root file each corpus needs first (named in the missing-data error)."""

# rouge_score's scorer is stateless after construction (its Porter stemmer keeps no per-call state), so one module
# instance serves every call.
_SCORER = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
# rouge_score's own tokenizer without stemming: lowercase, split on non-[a-z0-9]. Its tokens re-tokenize to
# themselves, so joining them with spaces and scoring gives the same ROUGE as scoring the raw text.
_TOKENIZER = tokenizers.DefaultTokenizer(use_stemmer=False)
_WHITESPACE = re.compile(r"\s+")
# A sentence ends at . ! or ? (optionally followed by closing quotes/brackets) plus whitespace, or at a newline. Both
# alternatives match in linear time (no nested or adjacent unbounded whitespace quantifiers).
_SENTENCE_BREAK = re.compile(r"[.!?][\"'\u201d\u2019)\]]*\s+|\n\s*")


def clip_completion(completion: str) -> tuple[str, int, bool]:
    """The scored part of a completion as space-joined ROUGE tokens, its token count, and whether it was cut."""
    tokens = _TOKENIZER.tokenize(completion[:MAX_COMPLETION_CHARS])
    cut = len(completion) > MAX_COMPLETION_CHARS or len(tokens) > MAX_COMPLETION_TOKENS
    tokens = tokens[:MAX_COMPLETION_TOKENS]
    return " ".join(tokens), len(tokens), cut


def rouge_max(references: Sequence[str], prediction: str) -> dict[str, float]:
    """ROUGE-1/2/L F1 of ``prediction``, each the maximum over ``references`` (the rule of rouge_score's
    ``score_multi``: per ROUGE type, the reference with the highest F1)."""
    best = dict.fromkeys(ROUGE_TYPES, 0.0)
    for ref in references:
        scores = _SCORER.score(ref, prediction)
        f1 = {k: float(scores[k].fmeasure) for k in ROUGE_TYPES}
        if len(_TOKENIZER.tokenize(ref)) < 2:
            # NOTE(deviation): a one-token reference has no bigrams, so rouge_score gives ROUGE-2 = 0 even to the
            # reference itself (score 2/3); ROUGE-1 stands in for ROUGE-2 there, so the reference scores 1.
            f1["rouge2"] = f1["rouge1"]
        best = {k: max(best[k], f1[k]) for k in ROUGE_TYPES}
    return best


def _char_ngrams(text: str, n: int) -> Counter:
    return Counter(text[i : i + n] for i in range(len(text) - n + 1))


def chrf(reference: str, hypothesis: str) -> float:
    """Sentence chrF in [0, 1] as sacrebleu computes it without eps smoothing: whitespace removed, precision and
    recall averaged over the orders 1..CHRF_ORDER where both strings have n-grams, then F-beta. Hand-written, not
    torchmetrics' chrf_score (the same score, tested): that costs ~4 ms a call against ~0.07 ms, on every held-out
    completion, and keeps no per-problem values (docs/development.md)."""
    hyp, ref = _WHITESPACE.sub("", hypothesis), _WHITESPACE.sub("", reference)
    prec = rec = 0.0
    orders = 0
    for n in range(1, CHRF_ORDER + 1):
        h, r = _char_ngrams(hyp, n), _char_ngrams(ref, n)
        if h and r:
            common = sum((h & r).values())
            prec += common / sum(h.values())
            rec += common / sum(r.values())
            orders += 1
    if not orders or prec + rec == 0:
        return 0.0
    prec, rec = prec / orders, rec / orders
    b2 = CHRF_BETA**2
    return (1 + b2) * prec * rec / (b2 * prec + rec)


def mix(components: Mapping[str, float], weights: Mapping[str, float]) -> float:
    """Weighted mean of the ROUGE F1 components, clipped to [0, 1]; all components 1 gives exactly 1."""
    total = sum(weights.get(k, 0.0) for k in ROUGE_TYPES)
    if not total > 0:
        raise ValueError(f"ROUGE weights must be >= 0 with a positive sum, got {dict(weights)}")
    value = sum(weights.get(k, 0.0) * components[k] for k in ROUGE_TYPES) / total
    return min(1.0, max(0.0, value))


def reward(example: Example, completion: str, *, weights: Mapping[str, float] = DEFAULT_WEIGHTS) -> RewardResult:
    """Weighted mean of ROUGE-1/2/L F1 (each max over ``example.answer``, the references) of the clipped completion.

    Components: ``rouge1``, ``rouge2``, ``rougeL`` (F1, max over references), ``length_ratio`` (scored tokens over
    the mean reference length in tokens; 1 means as long as the references) and ``chrf`` (held-out metric, not in the
    score). Never raises on model output; cost is bounded by MAX_COMPLETION_CHARS and MAX_COMPLETION_TOKENS.
    """
    references = list(example.answer)
    prediction, n_tokens, cut = clip_completion(completion)
    ref_tokens = sum(len(_TOKENIZER.tokenize(r)) for r in references) / max(len(references), 1)
    if n_tokens == 0:
        components = dict.fromkeys(ROUGE_TYPES, 0.0)
        held_out = 0.0
    else:
        components = rouge_max(references, prediction)
        head = completion[:MAX_COMPLETION_CHARS]
        held_out = max(chrf(r, head) for r in references)
    score = mix(components, weights)
    components.update(length_ratio=n_tokens / ref_tokens if ref_tokens else 0.0, chrf=held_out)
    reason = "no ROUGE tokens (empty, or no ASCII letters/digits)" if n_tokens == 0 else "ok"
    return RewardResult(
        score=score,
        components=components,
        info={"reason": reason, "tokens": n_tokens, "clipped": cut, "references": len(references)},
    )


# ---- data ---------------------------------------------------------------------------------------------------------


XSUM_TEST, XSUM_VAL = 200, 100
"""Sizes of the xsum test and val splits cut from the 1000 offline rows; the remaining 700 are train."""
DIALOGSUM_VAL = 50
"""Size of the dialogsum val split cut from the 500 dev rows; the remaining 450 are train."""


def hash_order(corpus: str, keys: Sequence[str]) -> list[str]:
    """``keys`` sorted by ``sha256(corpus + ":" + key)`` (hashlib, not the per-process salted hash()): a fixed
    pseudo-random order that needs no seed and does not depend on the file's row order."""
    if len(set(keys)) != len(keys):
        dupes = sorted(k for k, c in Counter(keys).items() if c > 1)
        raise ValueError(f"{corpus}: duplicate ids {dupes[:5]}")
    return sorted(keys, key=lambda k: hashlib.sha256(f"{corpus}:{k}".encode()).hexdigest())


def xsum_splits(ids: Sequence[str]) -> dict[str, Split]:
    """id -> split: the first XSUM_TEST ids in hash order are test, the next XSUM_VAL val, the rest train."""
    order = hash_order("xsum", ids)
    return {k: "test" if i < XSUM_TEST else "val" if i < XSUM_TEST + XSUM_VAL else "train" for i, k in enumerate(order)}


def dialogsum_dev_splits(fnames: Sequence[str]) -> dict[str, Split]:
    """fname -> split for the dev file: the first DIALOGSUM_VAL in hash order are val, the rest train."""
    return {k: "val" if i < DIALOGSUM_VAL else "train" for i, k in enumerate(hash_order("dialogsum", fnames))}


def make_example(corpus: str, key: str, text: str, references: Sequence[str], source: str, **extra) -> Example:
    refs = tuple(r.strip() for r in references)
    return Example(
        uid=f"{corpus}-{key}",
        question=text,
        answer=refs,
        demonstration=refs[0],
        data={"corpus": corpus, "id": key, "source": source, "num_references": len(refs), **extra},
    )


def scorable(example: Example) -> bool:
    """Every reference has ROUGE tokens, so it can score 1 against itself (an empty one would score 0 forever)."""
    return all(_TOKENIZER.tokenize(r) for r in example.answer)


def truncate_words(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters at a word boundary (hard cut when the first word is longer)."""
    if len(text) <= limit:
        return text
    cut = text[:limit]
    if not text[limit].isspace():
        space = max(cut.rfind(" "), cut.rfind("\n"))
        cut = cut[:space] if space > 0 else cut
    return cut.rstrip()


# ---- DataModule ---------------------------------------------------------------------------------------------------


@dataclass
class SummarizationConfig(TaskConfig):
    name: str = "summarization"
    """Registry name of the task."""
    corpus: str = "xsum"
    """Which corpus: "xsum" (news, one-sentence summaries) or "dialogsum" (dialogues; test has 3 references)."""
    correct_threshold: float = 0.5
    """A completion counts as correct (accuracy, pass@1) when its ROUGE mix is >= this; see the module docstring."""
    rouge1_weight: float = 1.0
    """Weight of ROUGE-1 F1 in the score (the score is the weighted mean; weights need not sum to 1)."""
    rouge2_weight: float = 1.0
    """Weight of ROUGE-2 F1 in the score."""
    rougeL_weight: float = 1.0
    """Weight of ROUGE-L F1 in the score. E.g. rouge1_weight=0, rouge2_weight=0 for a ROUGE-L-only reward."""
    max_document_chars: int = 4000
    """The chat instruction shows at most this many characters of the text, cut at a word boundary (XSum articles
    run to 4.5k characters, median 1.7k; DialogSum dialogues to 2.6k)."""
    plain_prompt_chars: int = 96
    """The plain prompt (tiny character model, 256 positions) shows only this many characters of the text."""

    def __post_init__(self) -> None:
        if self.corpus not in HUB_DATASETS:
            raise ValueError(f"corpus must be one of {sorted(HUB_DATASETS)}, got {self.corpus!r}")
        weights = self.weights()
        if any(w < 0 for w in weights.values()) or not sum(weights.values()) > 0:
            raise ValueError(f"rouge1_weight/rouge2_weight/rougeL_weight must be >= 0 with a positive sum: {weights}")
        if not 0.0 <= self.correct_threshold <= 1.0:
            raise ValueError(f"correct_threshold must be in [0, 1], got {self.correct_threshold}")
        for field_name in ("max_document_chars", "plain_prompt_chars"):
            if getattr(self, field_name) < 1:
                raise ValueError(f"{field_name} must be >= 1, got {getattr(self, field_name)}")

    def weights(self) -> dict[str, float]:
        return {"rouge1": self.rouge1_weight, "rouge2": self.rouge2_weight, "rougeL": self.rougeL_weight}


class Summarization(Task):
    scan = ("head", MAX_COMPLETION_CHARS)  # the reward reads no more (Task.scan)
    Config = SummarizationConfig
    version = "1"
    description = "Summarize an XSum article or a DialogSum dialogue; ROUGE-1/2/L F1 mix vs the reference(s)."
    hub_dataset = HUB_DATASETS["xsum"]
    """Class default; each instance sets the hub id of its own ``corpus``."""

    cfg: SummarizationConfig

    def __init__(self, cfg: SummarizationConfig, tokenizer=None, **kwargs) -> None:
        super().__init__(cfg, tokenizer, **kwargs)
        self.hub_dataset = HUB_DATASETS[cfg.corpus]
        self._all: dict[str, list[Example]] | None = None
        self.unscorable: list[str] = []
        """uids dropped at load because a reference has no ROUGE tokens (none in the shipped files)."""

    # ---- loading ------------------------------------------------------------------------------------------------
    def load_split(self, split: Split) -> list[Example]:
        if self._all is None:
            splits = self._load_hub() if self.use_hub() else self._load_local()
            self.unscorable = [e.uid for exs in splits.values() for e in exs if not scorable(e)]
            self._all = {s: [e for e in exs if scorable(e)] for s, exs in splits.items()}
        return list(self._all[split])

    def _load_local(self) -> dict[str, list[Example]]:
        out: dict[str, list[Example]] = {"train": [], "val": [], "test": []}
        if self.cfg.corpus == "xsum":
            path = self.data_file(*LOCAL_FILES["xsum"])
            rows = read_jsonl(path, ("document", "summary", "id"))
            where = xsum_splits([rec["id"] for rec in rows])
            for rec in rows:
                key = rec["id"]
                out[where[key]].append(make_example("xsum", key, rec["document"], [rec["summary"]], path.name))
            return out
        dev = self.data_file(*LOCAL_FILES["dialogsum"])
        test = self.data_file("summarization", "dialogsum", "dialogsum_test.jsonl")
        rows = read_jsonl(dev, ("fname", "dialogue", "summary"))
        where = dialogsum_dev_splits([rec["fname"] for rec in rows])
        for rec in rows:
            key = rec["fname"]
            ex = make_example("dialogsum", key, rec["dialogue"], [rec["summary"]], dev.name, topic=rec.get("topic"))
            out[where[key]].append(ex)
        ref_keys = ("summary1", "summary2", "summary3")
        for rec in read_jsonl(test, ("fname", "dialogue", *ref_keys)):
            refs = [rec[k] for k in ref_keys]
            topics = [rec.get(f"topic{i}") for i in (1, 2, 3)]
            out["test"].append(make_example("dialogsum", rec["fname"], rec["dialogue"], refs, test.name, topic=topics))
        return out

    def _load_hub(self) -> dict[str, list[Example]]:
        """Hub splits train/validation/test; rows sharing a text become one example with several references."""
        text_key = "document" if self.cfg.corpus == "xsum" else "dialogue"
        out: dict[str, list[Example]] = {}
        for split, hub_split in (("train", "train"), ("val", "validation"), ("test", "test")):
            rows = self.load_hub(LOCAL_FILES[self.cfg.corpus], split=hub_split)
            grouped: dict[str, tuple[str, list[str]]] = {}
            for row in rows:
                grouped.setdefault(row[text_key], (str(row["id"]), []))[1].append(row["summary"])
            out[split] = [
                make_example(self.cfg.corpus, key, text, refs, f"{self.hub_dataset}:{hub_split}")
                for text, (key, refs) in grouped.items()
            ]
        return out

    # ---- prompts ------------------------------------------------------------------------------------------------
    def instruction(self, example: Example) -> str:
        text = truncate_words(example.question.strip(), self.cfg.max_document_chars)
        if self.cfg.corpus == "xsum":
            return f"Summarize the following article in one sentence. Reply with the summary only.\n\nArticle:\n{text}"
        return (
            "Summarize the dialogue in one to three sentences, written from an observer's point of view and naming "
            "the speakers as the dialogue does (for example #Person1#). Reply with the summary only.\n\n"
            f"Dialogue:\n{text}"
        )

    def plain_prompt(self, example: Example) -> str:
        snippet = _WHITESPACE.sub(" ", example.question).strip()[: self.cfg.plain_prompt_chars].rstrip()
        return f"summarize: {snippet}\n"

    # ---- reward and structure -----------------------------------------------------------------------------------
    def reward(self, example: Example, completion: str) -> RewardResult:
        return reward(example, completion, weights=self.cfg.weights())

    def answer_span(self, completion: str) -> tuple[int, int] | None:
        """The whole scored prefix is the answer (there is no reasoning part); None when it is blank."""
        end = min(len(completion), MAX_COMPLETION_CHARS)
        return (0, end) if completion[:end].strip() else None

    def segment(self, completion: str) -> list[int]:
        """Sentence starts: 0, then the first character after each sentence end (. ! ? plus whitespace) or newline.
        A heuristic: abbreviations such as "Mr. Smith" also split."""
        starts = [0]
        for m in _SENTENCE_BREAK.finditer(completion):
            if 0 < m.end() < len(completion) and m.end() > starts[-1]:
                starts.append(m.end())
        return starts
