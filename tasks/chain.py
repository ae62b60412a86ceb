"""Chain: K independent sub-problems answered in order in one completion (a credit-assignment probe).

In the spirit of bsuite (Osband et al. 2019): one difficulty behind one knob. A completion makes K decisions that
are each right or wrong on their own; the outcome reward is 1 only when all K are right, so K is the **credit
horizon**: how many decisions share one scalar reward. At K = 1 every algorithm sees the same signal; as K grows,
sequence-level credit must find the wrong decision among K from a single 0, token/segment credit can localise it,
and the process-reward oracle (``process_rewards``: 1/K for each right sub-answer) is told directly.

One literal record (K = 3), prompt and gold completion for the character-level tiny model::

    Example(uid="chain-test-0", question="q w e", answer=(3, 0, 7))
    prompt "chain q w e\\n"  ->  completion "3 0 7"

A sub-problem is a letter, answered by its digit in a fixed code (26 entries drawn from ``gen_seed``; the chat
instruction spells the code out): a lookup the tiny model learns in minutes, so what varies with K is credit, not
difficulty. (Digit sums mod 10 were the first design: modular addition is the textbook slow-to-learn function, and
600 SFT steps left the tiny model at chance.) The optimal policy (the solver) scores 1 at every K.

Reward in one sentence: the completion's first K whitespace-separated tokens are compared with the K answers;
``reward=outcome`` scores 1 iff all K are right and there are exactly K tokens, ``reward=partial`` scores the fraction
right. Components: ``correct`` (outcome), ``partial``, ``format`` (exactly K single digits).

Demonstrations (the SFT warm start's data) come from a solver with an **error-rate knob**: on a hash-chosen share
``error_rate`` of the 26 sub-problems the demonstrator is unreliable and writes a fixed wrong answer with
probability ``error_strength`` (> 0.5: wrong more often than right). The warm start then answers those sub-problems
wrong under greedy decoding (so a chain is right with probability about (1 − error_rate)^K) but keeps some mass on
the right answer, so RL can find it. At error_rate 0 every demonstration is right.

Data: generated from ``gen_seed``; train and test are independent draws (different streams), not disjoint sets: the
skill being learnt is the fixed code of 26 letters, and at K = 1 there are only 26 distinct problems.

version = "2"
    1: initial version.
    2: process rewards include the sub-answers a completion never wrote (reward 0 at its end).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from bench.task import Example, RewardResult, Split, Task, TaskConfig, hash_unit

MAX_SCAN_CHARS = 256
"""Only this prefix of a completion is read: K <= 32 answers of one digit and a space each fit many times over."""


LETTERS = "abcdefghijklmnopqrstuvwxyz"


def answer(letter: str, seed: int) -> int:
    """The sub-problem's answer: the letter's digit in the code drawn from ``seed``."""
    return int(hash_unit("code", seed, letter) * 10)


def unreliable(letter: str, error_rate: float, seed: int) -> bool:
    """Whether the demonstrator is unreliable on this letter: a stable hash-chosen share ``error_rate``."""
    return hash_unit("unreliable", seed, letter) < error_rate


def wrong_answer(letter: str, seed: int) -> int:
    """The demonstrator's fixed wrong answer on an unreliable letter (never the right one)."""
    return (answer(letter, seed) + 1 + int(hash_unit("wrong", seed, letter) * 9)) % 10


def demonstrated(letter: str, cfg, rng: random.Random) -> int:
    """The demonstrator's digit for a letter: on an unreliable letter the fixed wrong one with probability
    ``cfg.error_strength`` (one draw from ``rng``, only then), else the right one."""
    if unreliable(letter, cfg.error_rate, cfg.gen_seed) and rng.random() < cfg.error_strength:
        return wrong_answer(letter, cfg.gen_seed)
    return answer(letter, cfg.gen_seed)


def parse(completion: str, k: int) -> list[str]:
    """The first K + 1 whitespace-separated tokens of the completion's bounded prefix (K + 1 to detect extras)."""
    return completion[:MAX_SCAN_CHARS].split(maxsplit=k + 1)[: k + 1]


def token_spans(completion: str, k: int) -> list[tuple[int, int]]:
    """Character spans [start, end) of the first K whitespace-separated tokens."""
    spans, i, text = [], 0, completion[:MAX_SCAN_CHARS]
    while len(spans) < k:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            break
        j = i
        while j < len(text) and not text[j].isspace():
            j += 1
        spans.append((i, j))
        i = j
    return spans


@dataclass
class ProbeConfig(TaskConfig):
    """Fields every letter-code probe shares (chain, delay): the demonstrator's error knobs and the generated data."""

    error_rate: float = 0.3
    """Share of the 26 letters on which the demonstrator is unreliable (0: perfect demonstrations)."""
    error_strength: float = 0.7
    """How often the demonstrator is wrong on an unreliable letter (> 0.5 makes its greedy answer wrong)."""
    num_train_problems: int = 20000
    """Generated train problems (the prompt stream draws from them)."""
    num_test_problems: int = 2000
    """Generated test problems (the first num_eval are evaluated)."""
    gen_seed: int = 7
    """Data seed, independent of the run seed: every run sees the same code, problems and demonstrations."""
    num_eval: int = 1000
    """Held-out problems evaluated (binomial SE 0.016 at p = 0.5)."""

    def __post_init__(self) -> None:
        if not 0 <= self.error_rate <= 1 or not 0 <= self.error_strength <= 1:
            raise ValueError(f"task.error_rate and task.error_strength must be in [0, 1], got {self.error_rate}, "
                             f"{self.error_strength}")  # fmt: skip


@dataclass
class ChainConfig(ProbeConfig):
    name: str = "chain"
    """Registry name of the task."""
    horizon: int = 4
    """K, the credit horizon: sub-problems answered in one completion (the knob every probe names ``horizon``)."""
    reward: Literal["outcome", "partial"] = "outcome"
    """outcome: 1 iff all K sub-answers are right; partial: the fraction right."""
    error_rate: float = 0.5
    """Share of the 26 letters on which the demonstrator is unreliable: 0.5 gives 11 (42 %) at gen_seed 7. At 0.3 (6
    letters) every method solved K <= 8 within ~12 steps and the process oracle could not be told from outcome
    credit (results/credit_horizon/README.md)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.horizon <= 32:
            raise ValueError(f"task.horizon (K, the credit horizon) must be in 1..32, got {self.horizon}")


class Chain(Task):
    scan = ("head", MAX_SCAN_CHARS)  # the reward reads no more (Task.scan)
    Config = ChainConfig
    version = "2"
    description = "Credit-horizon probe: K letter-to-digit lookups in one completion, rewarded only when all are right"
    verified_component = "format"
    rl_only = ("reward",)  # the demonstrations do not depend on it: outcome and partial share one SFT warm start

    cfg: ChainConfig

    def load_split(self, split: Split) -> list[Example]:
        c = self.cfg
        n = c.num_train_problems if split == "train" else c.num_test_problems
        rng = random.Random(f"chain/{c.gen_seed}/{split}")
        out = []
        for i in range(n):
            letters = [rng.choice(LETTERS) for _ in range(c.horizon)]
            demo = " ".join(str(demonstrated(x, c, rng)) for x in letters)
            out.append(
                Example(
                    uid=f"chain-{split}-{i}",
                    question=" ".join(letters),
                    answer=tuple(answer(x, c.gen_seed) for x in letters),
                    demonstration=demo,
                    data={"letters": letters},
                )
            )
        return out

    def gold_completion(self, example: Example) -> str:
        return " ".join(map(str, example.answer))  # the solver: right at every K, whatever the demonstrations say

    def instruction(self, example: Example) -> str:
        code = " ".join(f"{x}={answer(x, self.cfg.gen_seed)}" for x in LETTERS)
        return (
            f"Each letter stands for a digit ({code}). Write the digit of each of these {len(example.answer)} "
            f"letters, in order, separated by spaces: {example.question}"
        )

    def plain_prompt(self, example: Example) -> str:
        return f"chain {example.question}\n"

    def reward(self, example: Example, completion: str) -> RewardResult:
        k = len(example.answer)
        tokens = parse(completion, k)
        right = [j < len(tokens) and tokens[j] == str(a) for j, a in enumerate(example.answer)]
        fmt = float(len(tokens) == k and all(len(t) == 1 and t.isdigit() for t in tokens))
        outcome = float(all(right) and len(tokens) == k)
        partial = sum(right) / k
        score = outcome if self.cfg.reward == "outcome" else partial
        return RewardResult(score=score, components={"correct": outcome, "partial": partial, "format": fmt})

    def is_correct(self, result: RewardResult) -> bool:
        return result.components["correct"] == 1.0  # held-out accuracy is all-K-right, whatever task.reward is

    def segment(self, completion: str) -> list[int]:
        """Each sub-answer (with the space after it) is a segment; the first starts at 0."""
        return [0] + [s for s, _ in token_spans(completion, self.cfg.horizon)[1:]]

    def process_rewards(self, example: Example, completion: str) -> list[tuple[int, float]]:
        """The oracle's step rewards: each of the K sub-answers is a step, rewarded 1/K when right and 0 when wrong, on
        its last character; a sub-answer the completion never wrote is a step rewarded 0 at the completion's end (the
        token that stopped early carries it). The step rewards sum to the partial score."""
        k = len(example.answer)
        spans = token_spans(completion, k)
        steps = [(end - 1, float(completion[start:end] == str(a)) / k)
                 for (start, end), a in zip(spans, example.answer, strict=False)]  # fmt: skip
        # NOTE: without the missing steps, stopping early avoided every 0-reward step: GRPO-PS learnt to write fewer
        # answers and collapsed (K = 4, seed 1: accuracy 0.74 -> 0.02, results/credit_horizon/README.md).
        return steps + [(len(completion), 0.0)] * (k - len(spans))
