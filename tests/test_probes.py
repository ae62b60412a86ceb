"""Credit-assignment probes (tasks/chain.py, tasks/delay.py) and the process-reward oracle: reward tables on hostile
input, the optimal policy at every knob setting, demonstrations at error rate 0, the oracle's step rewards, their
placement on tokens, GRPO's process-supervision advantage (hand values, reductions) and a real run that uses them."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from bench.config import ConfigError, compose
from bench.engine.policy import char_tokenizer
from bench.registry import TASKS
from bench.rl import losses as L
from bench.rl import segment as S
from bench.rl.objective import PolicyGradientConfig, shape_rewards
from bench.run.train import train
from tasks.chain import LETTERS, answer, unreliable, wrong_answer
from tasks.chain import MAX_SCAN_CHARS as MAX_CHAIN_SCAN
from tasks.delay import MAX_SCAN_CHARS as MAX_DELAY_SCAN


def make(name: str, *overrides: str):
    cfg = compose(["algorithm=grpo", f"task={name}", "task.num_train_problems=400", "task.num_test_problems=50",
                   "task.num_eval=50", *overrides])  # fmt: skip
    return TASKS.get(name)(OmegaConf.to_object(cfg).task, char_tokenizer(), seed=0)


# ---- chain ------------------------------------------------------------------------------------------------------
CHAIN = make("chain", "task.horizon=3")
EX3 = next(e for e in CHAIN.eval_examples())  # answer: a tuple of 3 digits
GOLD3 = " ".join(map(str, EX3.answer))
WRONG_LAST = " ".join(map(str, (*EX3.answer[:2], (EX3.answer[2] + 1) % 10)))

CHAIN_TABLE = [  # completion, outcome score, partial, format
    (GOLD3, 1.0, 1.0, 1.0),
    ("  " + GOLD3.replace(" ", "   ") + " \n", 1.0, 1.0, 1.0),  # whitespace is a separator, whatever its amount
    (WRONG_LAST, 0.0, 2 / 3, 1.0),
    (GOLD3 + " 4", 0.0, 1.0, 0.0),  # an extra answer: not all-K-right (K + 1 answers), the first K still counted
    (GOLD3.replace(" ", ""), 0.0, 0.0, 0.0),  # one token "dd d": nothing parses as the first answer
    (GOLD3[:3], 0.0, 2 / 3, 0.0),  # two answers of three
    ("", 0.0, 0.0, 0.0),
    ("\x00" * 100, 0.0, 0.0, 0.0),
    ("9 " * 50_000, 0.0, float(EX3.answer[0] == 9) / 3 + float(EX3.answer[1] == 9) / 3 + float(EX3.answer[2] == 9) / 3,
     0.0),
    ("😀 " * 10_000, 0.0, 0.0, 0.0),
    ("1" * 100_000, 0.0, 0.0, 0.0),
]  # fmt: skip


@pytest.mark.parametrize("completion,score,partial,fmt", CHAIN_TABLE)
def test_chain_reward_table(completion, score, partial, fmt):
    """Hostile and edge-case completions get the intended outcome, partial and format scores; the reward reads at most
    MAX_SCAN_CHARS of any completion (its work is bounded by that cap, not by the input: what follows it changes
    nothing)."""
    res = CHAIN.reward(EX3, completion)
    if len(completion) >= MAX_CHAIN_SCAN:
        assert CHAIN.reward(EX3, completion[:MAX_CHAIN_SCAN] + "7 " * 100_000) == res
    assert res.score == score and res.components["correct"] == score
    assert res.components["partial"] == pytest.approx(partial) and res.components["format"] == fmt
    partial_task = make("chain", "task.horizon=3", "task.reward=partial")
    assert partial_task.reward(EX3, completion).score == pytest.approx(partial)
    assert not partial_task.is_correct(partial_task.reward(EX3, WRONG_LAST))  # accuracy stays all-K-right


@pytest.mark.parametrize("k", [1, 2, 4, 8, 16, 32])
def test_chain_optimal_policy_scores_one_at_every_k(k):
    task = make("chain", f"task.horizon={k}")
    for ex in task.eval_examples():
        assert len(ex.answer) == k
        assert task.reward(ex, task.gold_completion(ex)).score == 1.0
        assert sum(r for _, r in task.process_rewards(ex, task.gold_completion(ex))) == pytest.approx(1.0)


@pytest.mark.parametrize("k", [1, 4, 8])
def test_chain_demonstrations_at_error_rate_zero_score_one(k):
    task = make("chain", f"task.horizon={k}", "task.error_rate=0")
    assert all(task.reward(e, e.demonstration).score == 1.0 for e in task.examples("train"))


def test_chain_error_rate_knob():
    """The unreliable letters grow with error_rate (none at 0, all at 1, nested in between); on them the demonstrator
    writes a fixed wrong answer with probability error_strength, so the demonstrations' per-letter accuracy is
    1 − share·strength and the right answer keeps 1 − strength of an unreliable letter's mass."""
    sets = [{x for x in LETTERS if unreliable(x, rate, 7)} for rate in (0.0, 0.1, 0.3, 0.6, 1.0)]
    assert sets[0] == set() and sets[-1] == set(LETTERS)
    assert all(a <= b for a, b in zip(sets, sets[1:], strict=False)) and 3 <= len(sets[2]) <= 13, [len(x) for x in sets]
    assert all(wrong_answer(x, 7) != answer(x, 7) for x in LETTERS)
    knobs = ("task.horizon=1", "task.error_rate=0.3", "task.error_strength=0.6", "task.num_train_problems=20000")
    task = make("chain", *knobs)
    share = len(sets[2]) / 26
    acc = sum(task.reward(e, e.demonstration).score for e in task.examples("train")) / 20000
    assert acc == pytest.approx(1 - share * 0.6, abs=0.015), (acc, share)
    bad = [e for e in task.examples("train") if e.data["letters"][0] in sets[2]]
    right = sum(task.reward(e, e.demonstration).score for e in bad) / len(bad)
    assert right == pytest.approx(0.4, abs=0.03)


def test_chain_segments_and_process_rewards():
    """Each sub-answer is a segment; the oracle rewards each answered step 1/K (right) or 0 (wrong) at its last
    character, so the step rewards sum to the partial score."""
    task = make("chain", "task.horizon=3")
    assert task.segment(GOLD3) == [0, 2, 4]
    assert task.process_rewards(EX3, GOLD3) == [(0, 1 / 3), (2, 1 / 3), (4, 1 / 3)]
    assert task.process_rewards(EX3, WRONG_LAST) == [(0, 1 / 3), (2, 1 / 3), (4, 0.0)]
    a = EX3.answer  # " 12 a b c": the answers shift by one, each compared with the sub-problem at its place
    assert task.process_rewards(EX3, " 12 " + GOLD3) == [(2, 0.0), (4, (a[0] == a[1]) / 3), (6, (a[1] == a[2]) / 3)]
    assert task.process_rewards(EX3, "") == [(0, 0.0)] * 3  # answers never written: 0 each, at the end
    assert task.process_rewards(EX3, GOLD3[:3]) == [(0, 1 / 3), (2, 1 / 3), (3, 0.0)]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="0123456789 x\n", max_size=30))
def test_chain_step_rewards_sum_to_the_partial_score(text):
    res = CHAIN.reward(EX3, text)
    steps = CHAIN.process_rewards(EX3, text)
    assert sum(r for _, r in steps) == pytest.approx(res.components["partial"])
    assert len(steps) == 3 and all(c == len(text) or not text[c].isspace() for c, _ in steps)


def test_chain_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="task.horizon"):
        compose(["task=chain", "task.horizon=0"])
    with pytest.raises(ConfigError, match="task.error_rate"):
        compose(["task=chain", "task.error_rate=1.5"])


# ---- delay ------------------------------------------------------------------------------------------------------
DELAY = make("delay", "task.horizon=6", "task.filler=fixed", "task.error_rate=0.3")  # the task's own defaults
EXD = DELAY.eval_examples()[0]
A = str(EXD.answer)
B = str((EXD.answer + 1) % 10)

DELAY_TABLE = [  # completion, score, decision right, format
    ("ABCDEF" + A, 1.0, 1.0, 1.0),
    ("ABCDEF" + B, 0.0, 0.0, 1.0),
    ("ABCDE" + A, 0.0, 1.0, 0.0),  # one letter short
    ("ABCDEFG" + A, 0.0, 1.0, 0.0),  # one letter too many: the right digit (the decision) in the wrong place
    ("ABCDEF" + A + "X", 0.0, 1.0, 0.0),
    ("abcdef" + A, 0.0, 1.0, 0.0),  # lower case is not filler
    (A + "ABCDEF", 0.0, 1.0, 0.0),  # right digit, wrong position
    ("", 0.0, 0.0, 0.0),
    ("\x00" * 100, 0.0, 0.0, 0.0),
    ("garbage " * 12_500, 0.0, 0.0, 0.0),
    ("😀" * 10_000, 0.0, 0.0, 0.0),
]


@pytest.mark.parametrize("completion,score,decision,fmt", DELAY_TABLE)
def test_delay_reward_table(completion, score, decision, fmt):
    res = DELAY.reward(EXD, completion)
    if len(completion) >= MAX_DELAY_SCAN:  # it reads at most MAX_SCAN_CHARS
        assert DELAY.reward(EXD, completion[:MAX_DELAY_SCAN] + "7" * 100_000) == res
    assert (res.score, res.components["decision"], res.components["format"]) == (score, decision, fmt)


@pytest.mark.parametrize("mode", ["fixed", "varied"])
@pytest.mark.parametrize("position", ["end", "start"])
@pytest.mark.parametrize("filler", [0, 1, 16, 64, 256])
def test_delay_optimal_policy_and_perfect_demonstrations_score_one(filler, position, mode):
    task = make(
        "delay", f"task.horizon={filler}", f"task.position={position}", "task.error_rate=0", f"task.filler={mode}"
    )
    for ex in task.eval_examples():
        gold = task.gold_completion(ex)
        assert len(gold) == filler + 1 and task.reward(ex, gold).score == 1.0
        (i, r), = task.process_rewards(ex, gold)  # fmt: skip
        assert r == 1.0 and gold[i] == str(ex.answer) and i == (filler if position == "end" else 0)
    assert all(task.reward(e, e.demonstration).score == 1.0 for e in task.examples("train"))


def test_delay_segments_and_start_position():
    task = make("delay", "task.horizon=6", "task.position=start", "task.filler=fixed")
    ex = task.eval_examples()[0]
    a = str(ex.answer)
    assert task.reward(ex, a + "ABCDEF").score == 1.0 and task.reward(ex, "ABCDEF" + a).score == 0.0
    assert task.segment(a + "ABCDEF") == [0, 1]
    assert DELAY.segment("ABCDEF" + A) == [0, 6]
    assert DELAY.process_rewards(EXD, "ABCDEF" + B) == [(6, 0.0)] and DELAY.process_rewards(EXD, "ABC") == []


DELAY_VARIED = make("delay", "task.horizon=6", "task.filler=varied")
DELAY_VARIED_TABLE = [  # completion, score, format: 0 to L letters, then the digit
    ("ABCDEF" + A, 1.0, 1.0),
    ("ABC" + A, 1.0, 1.0),
    (A, 1.0, 1.0),  # no filler at all
    ("ABCDEFG" + A, 0.0, 0.0),  # L + 1 letters
    ("ABC" + B, 0.0, 1.0),
    ("ABC" + A + "D", 0.0, 0.0),
    ("ABC\u0663", 0.0, 0.0),  # an Arabic-Indic digit is not a digit here
    ("A" * 10_000 + A, 0.0, 0.0),
    ("", 0.0, 0.0),
]


@pytest.mark.parametrize("completion,score,fmt", DELAY_VARIED_TABLE)
def test_delay_varied_filler_reward_table(completion, score, fmt):
    res = DELAY_VARIED.reward(EXD, completion)
    assert (res.score, res.components["format"]) == (score, fmt), res


def test_delay_varied_filler_demonstrations_vary_in_length_and_fixed_ones_are_unchanged():
    """filler=varied: perfect demonstrations score 1 and their filler counts cover 0..L; filler=fixed draws the same
    problems and demonstrations as before the option existed (the same random stream)."""
    task = make("delay", "task.horizon=6", "task.filler=varied", "task.error_rate=0")
    demos = [e.demonstration for e in task.examples("train")]
    assert all(task.reward(e, e.demonstration).score == 1.0 for e in task.examples("train"))
    assert {len(d) - 1 for d in demos} == set(range(7))
    fixed = make("delay", "task.horizon=6", "task.filler=fixed", "task.error_rate=0").examples("train")
    assert {len(e.demonstration) for e in fixed} == {7}
    # the default (fixed) stream, pinned from before the option existed (the same three demonstrations)
    assert [(e.question, e.demonstration) for e in DELAY.examples("train")[:3]] == [
        ("w", "FGMLRC6"), ("s", "SMQTGI7"), ("n", "YNWDHP9")]  # fmt: skip
    with pytest.raises(ConfigError, match="task.filler"):
        compose(["task=delay", "task.filler=sometimes"])


def test_aggregations_coincide_up_to_a_constant_when_every_completion_has_the_same_length():
    """Why delay's fixed filler cannot separate the loss aggregations: with every row of length n, token-mean and
    seq-mean-token-mean are the same number and constant-normalised is token-mean x n / budget; with ragged rows
    (filler=varied) they differ."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 10, generator=g)
    same = torch.zeros(8, 10)
    same[:, :7] = 1
    norm = L.Norm.of(same, budget=10)
    tm, sm = (L.agg_loss(x, same, m, norm) for m in ("token-mean", "seq-mean-token-mean"))
    assert torch.allclose(tm, sm, atol=1e-6) and torch.allclose(L.agg_loss(x, same, "constant-normalised", norm),
                                                                tm * 7 / 10, atol=1e-6)  # fmt: skip
    ragged = (torch.arange(10) < torch.tensor([1, 3, 5, 7, 9, 10, 2, 4])[:, None]).float()
    norm = L.Norm.of(ragged, budget=10)
    assert not torch.allclose(
        L.agg_loss(x, ragged, "token-mean", norm), L.agg_loss(x, ragged, "seq-mean-token-mean", norm)
    )


# ---- the harness: step rewards on tokens, the process advantage, reward shaping --------------------------------
def test_step_rewards_land_on_the_token_that_ends_each_step():
    tok = char_tokenizer()
    texts = [GOLD3, "7"]
    ids = [tok(t, add_special_tokens=False).input_ids for t in texts]
    T = max(map(len, ids))
    completion = torch.tensor([i + [tok.pad_token_id] * (T - len(i)) for i in ids])
    mask = torch.tensor([[1.0] * len(i) + [0.0] * (T - len(i)) for i in ids])
    # unsorted; a step past the text (never reached) lands on the row's last token
    steps = [[(0, 0.5), (4, 0.25), (2, 0.0)], [(9, 3.0), (0, 1.0)]]
    decode = lambda x: tok.decode(x, skip_special_tokens=True)  # noqa: E731
    r, ends = S.step_token_rewards(steps, completion, mask, decode)
    assert r.tolist() == [[0.5, 0, 0.0, 0, 0.25], [4.0, 0, 0, 0, 0]]
    assert ends.tolist() == [[True, False, True, False, True], [True, False, False, False, False]]
    with_eos = torch.cat([completion, torch.full((2, 1), tok.eos_token_id)], 1)
    r, _ = S.step_token_rewards([[(5, 1.0)], []], with_eos, torch.cat([mask, torch.tensor([[1.0], [0.0]])], 1), decode)
    assert r[0].tolist() == [0, 0, 0, 0, 0, 1.0]  # on the EOS that stopped it


def test_process_advantages_hand_values():
    """One group of 2 rows: steps (row 0) 1 at t=0, 0 at t=2; (row 1) 1 at t=1. R = {1, 0, 1}: mean 2/3, sample std
    1/√3. r̃ = (1/3)√3, −(2/3)√3, (1/3)√3; Â is the suffix sum of r̃ over each row's steps."""
    r = torch.tensor([[1.0, 0, 0, 0], [0, 1.0, 0, 0]])
    steps = torch.tensor([[True, False, True, False], [False, True, False, False]])
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 0]])
    a = L.process_advantages(r, steps, mask, group_size=2, eps=0.0)
    s3 = 3**0.5
    want = torch.tensor([[s3 / 3 - 2 * s3 / 3, -2 * s3 / 3, -2 * s3 / 3, 0], [s3 / 3, s3 / 3, 0, 0]])
    torch.testing.assert_close(a, want)


def test_step_return_discounts_per_step_not_per_token():
    """Row: steps end at t=1 (r=1), t=2 (r=2), t=4 (r=4); γ = 0.5. Tokens 0-1 are step 1: 1 + 0.5·2 + 0.25·4 = 3;
    token 2 is step 2: 2 + 0.5·4 = 4; tokens 3-4 are step 3: 4; token 5 is masked. γ = 0: each step's own reward."""
    r = torch.tensor([[0.0, 1, 2, 0, 4, 0]])
    steps = torch.tensor([[False, True, True, False, True, False]])
    mask = torch.tensor([[1.0, 1, 1, 1, 1, 0]])
    assert L.step_return(r, steps, mask, 0.5).tolist() == [[3.0, 3.0, 4.0, 4.0, 4.0, 0.0]]
    assert L.step_return(r, steps, mask, 0.0).tolist() == [[1.0, 1.0, 2.0, 4.0, 4.0, 0.0]]
    assert L.step_return(r, steps, mask, 1.0).tolist() == [[7.0, 7.0, 6.0, 4.0, 4.0, 0.0]]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-2, 2), min_size=12, max_size=12), st.lists(st.booleans(), min_size=12, max_size=12),
       st.floats(0.0, 1.0))  # fmt: skip
def test_step_return_matches_the_python_definition(values, ends, gamma):
    """Any γ: the loop equals Σ_{k ≥ j} γ^{k−j} r_k written out step by step; γ → 1 is the token return-to-go."""
    r = torch.tensor(values).view(2, 6)
    s = torch.tensor(ends).view(2, 6)
    r = torch.where(s, r, torch.zeros_like(r))
    mask = torch.ones(2, 6)
    got = L.step_return(r, s, mask, gamma)
    for b in range(2):
        ends_b = [t for t in range(6) if s[b, t]]
        for t in range(6):
            later = [k for k in ends_b if k >= t]
            want = sum(gamma**i * float(r[b, k]) for i, k in enumerate(later))
            assert abs(float(got[b, t]) - want) < 1e-5
    torch.testing.assert_close(L.step_return(r, s, mask, 1.0), L.return_to_go(r, mask))


def test_step_discount_needs_the_process_advantage_and_a_discount_in_0_1():
    with pytest.raises(ValueError, match="set advantage=process"):
        PolicyGradientConfig(step_discount=0.0)
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        PolicyGradientConfig(reward_shaping="process", advantage="process", step_discount=1.5)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 1), min_size=8, max_size=8), st.lists(st.integers(1, 6), min_size=8, max_size=8))
def test_process_advantage_with_one_step_at_the_end_is_grpo(scores, lengths):
    """One step per completion, on its last token, carrying the score: GRPO's process advantage is GRPO's outcome
    advantage on every token (DeepSeekMath: process supervision generalises outcome supervision)."""
    G, T = 4, 6
    s = torch.tensor(scores, dtype=torch.float32)
    mask = (torch.arange(T) < torch.tensor(lengths).unsqueeze(-1)).float()
    r = L.terminal_rewards(s, mask)
    ends = L.terminal_rewards(torch.ones(8), mask).bool()
    a = L.process_advantages(r, ends, mask, G)
    grpo = L.group_advantages(s, G).unsqueeze(-1) * mask
    torch.testing.assert_close(a, grpo, atol=1e-5, rtol=1e-5)


def test_process_advantage_of_a_constant_group_is_exactly_zero():
    r = torch.full((4, 3), 0.7)
    assert torch.equal(L.process_advantages(r, torch.ones(4, 3, dtype=torch.bool), torch.ones(4, 3), 2),
                       torch.zeros(4, 3))  # fmt: skip


def test_shape_rewards_with_process_puts_the_step_rewards_in_the_token_rewards():
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 1, 1]])
    step = torch.tensor([[0.5, 0, 0.5, 0], [0, 0.5, 0, 0]])
    scores = torch.tensor([1.0, 0.0])
    args = (scores, mask, torch.tensor([3, 4]), torch.zeros(2, dtype=torch.bool), 8)
    R, tr, _ = shape_rewards(PolicyGradientConfig(reward_shaping="process"), *args, step_rewards=step)
    assert torch.equal(tr, step) and R.tolist() == [1.0, 0.5]  # R is the sum of the step rewards (partial credit)
    R, tr, _ = shape_rewards(PolicyGradientConfig(), *args, step_rewards=step)  # outcome: the score, at the end
    assert R.tolist() == [1.0, 0.0] and tr.tolist() == [[0, 0, 1.0, 0], [0, 0, 0, 0]]


def test_process_advantage_needs_process_shaping():
    with pytest.raises(ConfigError, match="reward_shaping=process"):
        compose(["algorithm=grpo", "algorithm.advantage=process"])


def test_process_shaping_on_a_task_without_step_rewards_names_the_ones_that_have_them(small):
    with pytest.raises(ConfigError, match=r"no process_rewards; tasks that have them: .*chain.*delay"):
        train(compose(["algorithm=grpo", "task=countdown", "algorithm.reward_shaping=process", *small]))


@pytest.mark.parametrize(
    "algo",
    [
        ["algorithm=grpo", "algorithm.reward_shaping=process", "algorithm.advantage=process"],
        ["algorithm=ppo", "algorithm.reward_shaping=process"],
        ["algorithm=ma_ppo", "algorithm.reward_shaping=process", "algorithm.termination=task"],
    ],
    ids=["grpo-process", "ppo-process", "ma_ppo-task-process"],
)
def test_process_supervision_trains_on_chain(algo, small, store):
    """GRPO's process supervision and PPO/MA-PPO with the oracle's token rewards train on chain: FINISHED, finite
    losses, and the run records the shaping."""
    result = train(compose([*algo, "task=chain", "task.horizon=3", "task.num_train_problems=200", *small]))
    client = MlflowClient(tracking_uri=store["uri"])
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED" and run.data.params["algorithm.reward_shaping"] == "process"
    losses = [m.value for m in client.get_metric_history(result.run_id, "loss/total")]
    assert len(losses) == 2 and all(map(torch.isfinite, torch.tensor(losses))), losses
