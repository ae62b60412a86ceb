"""Delay: one rewarded decision inside L tokens of irrelevant filler (a credit-assignment probe).

In the spirit of bsuite (Osband et al. 2019): one difficulty behind one knob. A completion is L filler letters
(``filler=varied``: 0 to L) and one digit, the answer to a sub-problem of the prompt; ``position`` says whether the
digit comes after the filler (``end``: the decision is made late) or before it (``start``: the reward arrives L tokens
after the decision). The filler is random capital letters in every demonstration (capitals, so that it cannot be
mistaken for the prompt's lower-case letter: with lower-case filler 200 SFT steps left the decision at chance), so the
warm start writes high-entropy, irrelevant tokens: every sequence-level method multiplies their log-probabilities by the
decision's advantage, so L tokens of pure noise join the gradient. When the completions' lengths differ (varied filler),
the loss aggregation decides how a completion's tokens weigh against another's (token-mean: each token alike;
seq-mean-token-mean: 1/length of its completion's share; constant: 1/budget); with fixed filler every well-formed
completion has L + 1 tokens and the three are one loss up to a constant factor. A critic or the process-reward oracle
(the reward on the decision token itself) can give the filler zero credit.

One literal record (L = 6, position = end), prompt and gold completion for the character-level tiny model::

    Example(uid="delay-test-0", question="q", answer=3)
    prompt "delay q\\n"  ->  completion "XWHZKB3"

Sub-problem and demonstrator as in ``chain`` (a letter answered by its digit in a fixed code; an error-rate knob
makes the demonstrator unreliable on a hash-chosen share of the 26 letters, so the warm start's greedy answer is
wrong there). The optimal policy (any L capital letters and the right digit, in the order ``position`` says) scores 1 at
every L.

Reward in one sentence: 1 iff the completion is exactly L (``filler=varied``: at most L) ASCII capital letters and
the right digit in the order ``position`` says; components ``correct`` (= score), ``decision`` (the digit is right,
wherever it is), ``format``.

version = "1"
    1: initial version.
"""

from __future__ import annotations

import random
import re
import string
from dataclasses import dataclass
from typing import Literal

from bench.task import Example, RewardResult, Split, Task
from tasks.chain import LETTERS, ProbeConfig, answer, demonstrated

MAX_SCAN_CHARS = 512
"""Only this prefix of a completion is read (L <= 256)."""
_DIGIT = re.compile(r"[0-9]")


@dataclass
class DelayConfig(ProbeConfig):
    name: str = "delay"
    """Registry name of the task."""
    horizon: int = 16
    """L: filler letters beside the decision (the knob every probe names ``horizon``)."""
    position: Literal["end", "start"] = "end"
    """end: the digit follows the filler; start: the digit comes first, the filler after it."""
    filler: Literal["fixed", "varied"] = "fixed"
    """fixed: exactly L filler letters, so every well-formed completion has the same length, and token-mean,
    seq-mean-token-mean and constant-normalised aggregation are the same loss up to a constant factor; varied: 0 to L
    letters (each demonstration's count uniform), so lengths differ and the aggregations weight tokens differently."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.horizon <= 256:
            raise ValueError(f"task.horizon (L, the filler length) must be in 0..256, got {self.horizon}")


class Delay(Task):
    scan = ("head", MAX_SCAN_CHARS)  # the reward reads no more (Task.scan)
    Config = DelayConfig
    version = "1"
    description = "Credit probe: one rewarded digit among L random filler letters (knob L, decision at start or end)"
    verified_component = "format"

    cfg: DelayConfig

    def load_split(self, split: Split) -> list[Example]:
        c = self.cfg
        n = c.num_train_problems if split == "train" else c.num_test_problems
        rng = random.Random(f"delay/{c.gen_seed}/{split}")
        out = []
        for i in range(n):
            x = rng.choice(LETTERS)
            digit = demonstrated(x, c, rng)
            n_letters = c.horizon if c.filler == "fixed" else rng.randint(0, c.horizon)
            letters = "".join(rng.choice(string.ascii_uppercase) for _ in range(n_letters))
            out.append(
                Example(
                    uid=f"delay-{split}-{i}",
                    question=x,
                    answer=answer(x, c.gen_seed),
                    demonstration=self._compose(letters, digit),
                    data={"letter": x},
                )
            )
        return out

    def _compose(self, letters: str, digit: int) -> str:
        return f"{letters}{digit}" if self.cfg.position == "end" else f"{digit}{letters}"

    def gold_completion(self, example: Example) -> str:
        return self._compose("X" * self.cfg.horizon, example.answer)

    def instruction(self, example: Example) -> str:
        where = "after" if self.cfg.position == "end" else "before"
        code = " ".join(f"{x}={answer(x, self.cfg.gen_seed)}" for x in LETTERS)
        count = "exactly" if self.cfg.filler == "fixed" else "at most"
        return (
            f"Each letter stands for a digit ({code}). Write {count} {self.cfg.horizon} capital letters, and "
            f"{where} them the digit of {example.question}."
        )

    def plain_prompt(self, example: Example) -> str:
        return f"delay {example.question}\n"

    def _decision_index(self, text: str) -> int | None:
        m = _DIGIT.search(text)
        return None if m is None else m.start()

    def reward(self, example: Example, completion: str) -> RewardResult:
        text = completion[:MAX_SCAN_CHARS]
        L = self.cfg.horizon
        i = self._decision_index(text)
        decision = float(i is not None and text[i] == str(example.answer))
        if self.cfg.position == "end":
            letters, digit = text[:-1], text[-1:]
        else:
            digit, letters = text[:1], text[1:]
        n_ok = len(letters) == L if self.cfg.filler == "fixed" else len(letters) <= L
        fmt = float(n_ok and all(ch in string.ascii_uppercase for ch in letters) and len(digit) == 1
                    and digit in string.digits)  # fmt: skip
        correct = float(fmt == 1.0 and digit == str(example.answer))
        return RewardResult(score=correct, components={"correct": correct, "decision": decision, "format": fmt})

    def segment(self, completion: str) -> list[int]:
        """The filler and the decision are separate segments."""
        i = self._decision_index(completion[:MAX_SCAN_CHARS])
        cuts = {0} | ({i, i + 1} if i is not None else set())
        return sorted(c for c in cuts if c < len(completion))

    def process_rewards(self, example: Example, completion: str) -> list[tuple[int, float]]:
        """The oracle: one step, the decision digit, carrying the whole score (0 or 1) on its own token; nothing when
        the completion has no digit."""
        i = self._decision_index(completion[:MAX_SCAN_CHARS])
        return [] if i is None else [(i, self.reward(example, completion).score)]
