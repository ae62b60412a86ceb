"""Multi-turn episodes (bench/engine/episode.py), the FrozenLake environment (tasks/frozen_lake.py) and the
turn-level methods (GiGPO, LOOP): the loop's bounds, the environment's rules and its audit against hostile actions,
the environment's tokens out of the gradient, one-turn episodes as the single-turn rollout bit for bit, and each
method's hand-computed values and reductions."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from bench.config import ConfigError, compose
from bench.engine.episode import Turn, observation_text, run_episodes
from bench.engine.policy import char_tokenizer, load_policy
from bench.engine.rollout import branch, generate
from bench.registry import ALGORITHMS, TASKS
from bench.run.train import train
from bench.task import Example
from tests.conftest import COIN, SMALL
from tests.test_credit import _module as _countdown_module

LAKE = Example(uid="lake-hand", question="PFF\nFHF\nFFG", answer=("SFF", "FHF", "FFG"))


def lake(**overrides):
    cfg = compose(["algorithm=grpo", "task=frozen_lake", "task.num_maps=200",
                   *[f"task.{k}={v}" for k, v in overrides.items()]])  # fmt: skip
    obj = OmegaConf.to_object(cfg)
    return TASKS.get("frozen_lake")(obj.task, char_tokenizer(), seed=0)


# ---- the environment -----------------------------------------------------------------------------------------------
def test_frozen_lake_renders_the_grid_and_follows_gymnasiums_moves():
    """The first observation is the prompt's grid; moves are gymnasium's (L, D, R, U, or the words); a hole ends the
    episode with reward 0, the goal with 1; an invalid move leaves the player and says so."""
    task = lake()
    obs, state = task.reset(LAKE, 0)
    assert obs == "PFF\nFHF\nFFG" == LAKE.question
    t = task.step(state, "right")
    assert (t.observation, t.reward, t.done) == ("SPF\nFHF\nFFG", 0.0, False)
    t = task.step(state, "jump!")
    assert t.observation.startswith("Invalid move") and t.observation.endswith("SPF\nFHF\nFFG") and not t.done
    assert t.components["invalid"] == 1.0 and t.components["moves"] == 2.0
    t = task.step(state, " d")  # into the hole at the centre
    assert (t.reward, t.done, t.components["hole"], t.components["goal"]) == (0.0, True, 1.0, 0.0)
    _, state = task.reset(LAKE, 0)
    for move in "RRD":
        assert not task.step(state, move).done
    t = task.step(state, "Down")
    assert (t.reward, t.done, t.components["goal"]) == (1.0, True, 1.0)


def test_shaped_rewards_sum_to_the_fraction_of_the_way_and_to_one_at_the_goal():
    """reward=shaped (the process-style oracle): each turn earns its progress in shortest-path distance over the
    start's; a detour costs, a hole earns 0, and the return is 1 exactly when the goal is reached."""
    task = lake(reward="shaped")
    _, state = task.reset(LAKE, 0)
    rewards = [task.step(state, m).reward for m in "RLRRDD"]
    assert rewards == pytest.approx([0.25, -0.25, 0.25, 0.25, 0.25, 0.25]) and sum(rewards) == pytest.approx(1.0)
    _, state = task.reset(LAKE, 0)
    assert [task.step(state, m).reward for m in "RD"] == pytest.approx([0.25, 0.0])  # into the hole: no progress


def test_solver_demonstrations_reach_the_goal_and_the_error_knob_makes_mistakes():
    task = lake()
    exs = task.eval_examples()[:20]
    for ex in exs:
        _, state = task.reset(ex, 0)
        turns = [task.step(state, m) for m in ex.demonstration]
        assert turns[-1].done and turns[-1].components["goal"] == 1.0 and all(not t.done for t in turns[:-1])
    noisy = lake(demo_error_rate=0.5).eval_examples()[:20]
    assert sum(a.demonstration != b.demonstration for a, b in zip(exs, noisy, strict=True)) >= 10


def test_train_and_test_maps_are_disjoint_and_the_test_set_is_fixed():
    task = lake()
    train_ids = {e.uid for e in task.examples("train")}
    test = task.eval_examples()
    assert not train_ids & {e.uid for e in test} and len(test) > 5
    assert [e.uid for e in lake().eval_examples()] == [e.uid for e in test]


def test_slippery_transitions_are_seeded_by_the_reset():
    task = lake(slippery=True)
    ex = task.eval_examples()[0]

    def walk(seed):
        _, state = task.reset(ex, seed)
        return [task.step(state, "R").observation for _ in range(6)]

    assert walk(3) == walk(3)
    assert len({tuple(walk(s)) for s in range(8)}) > 1


HOSTILE_ACTIONS = [
    "__import__('os').system('touch {marker}')",
    "eval(\"__import__('os').system('touch {marker}')\")",
    "().__class__.__base__.__subclasses__()",
    "open('{marker}', 'w').write('x')",
    "\x00" * 1000,
    "R" * 200_000,
    "(" * 100_000,
    "9" * 100_000,
    "😀" * 10_000,
    "",
]


def test_hostile_actions_never_raise_never_write_and_read_only_a_bounded_prefix(tmp_path):
    """Every hostile action is an ordinary turn (no exception, no file, no process); the environment reads only the
    action's first MAX_SCAN_CHARS characters, so what lies past them changes nothing (the bound is the cap, not a
    timing)."""
    from tasks.frozen_lake import MAX_SCAN_CHARS

    task = lake()
    marker = tmp_path / "pwned"
    for text in HOSTILE_ACTIONS:
        text = text.format(marker=marker)
        _, state = task.reset(LAKE, 0)
        turn = task.step(state, text)
        assert isinstance(turn, Turn) and 0.0 <= turn.reward <= 1.0
        head = (text or " ") * (MAX_SCAN_CHARS // max(len(text), 1) + 1)
        outcomes = []
        for tail in ("9 " * 40_000, "left right up down " * 4_000):
            _, state = task.reset(LAKE, 0)
            outcomes.append(task.step(state, head[:MAX_SCAN_CHARS] + tail))
        assert outcomes[0] == outcomes[1], text[:40]
    assert not marker.exists() and not list(tmp_path.iterdir())


# ---- the episode loop ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    cfg = OmegaConf.to_object(compose(["algorithm=grpo", "task=frozen_lake", *SMALL[:4]]))
    policy, tok = load_policy(cfg.model, 0)
    policy.eval()
    return policy, tok


def _episodes(tiny, task, n=3, G=4, max_turns=3, turn_tokens=2, budget=60, temperature=1.0):
    policy, tok = tiny
    task.tokenizer = tok
    exs = task.eval_examples()[:n]
    batch = task.collate_prompts(exs)
    kw = {"temperature": temperature, "top_p": 1.0, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    seeds = list(range(n))
    return exs, batch, run_episodes(
        task, tok, exs, G,
        lambda k: generate(policy, batch["prompt_ids"], batch["prompt_mask"], group_size=G, max_new_tokens=k,
                           seeds=seeds, **kw),
        lambda *a, **k: branch(policy, *a, **k, **kw),
        prompt_ids=batch["prompt_ids"].repeat_interleave(G, 0),
        prompt_mask=batch["prompt_mask"].repeat_interleave(G, 0), seeds=seeds, env_seeds=[7] * n,
        max_turns=max_turns, turn_tokens=turn_tokens, budget=budget,
    )  # fmt: skip


def test_episodes_keep_every_bound_and_lay_turns_out_as_the_environment_answered(tiny):
    """max_turns, the per-turn and the whole-episode token budgets hold for every row; the tokens between two actions
    are exactly the observation the environment gave (as observation_text renders it) and carry no loss, no
    log-prob; each turn's reward sits on its last action token; the anchors are the observations acted on."""
    task = lake()
    exs, _, ep = _episodes(tiny, task)
    _, tok = tiny
    assert ep.completion_ids.shape[0] == 12
    for i in range(12):
        n = int(ep.lengths[i])
        assert n <= 60 and 1 <= int(ep.turns[i]) <= 3 and len(ep.anchors[i]) == int(ep.turns[i])
        ids, loss, turn = ep.completion_ids[i, :n], ep.loss_mask[i, :n], ep.turn_index[i, :n]
        assert ep.mask[i, :n].eq(1).all() and ep.mask[i, n:].eq(0).all() and ep.turn_index[i, n:].eq(-1).all()
        assert loss[-1] == 1  # the last token is an action's
        assert ep.sampler_logp[i, :n][loss == 0].eq(0).all()
        # replay the environment with the decoded actions: the observations in the row are what it answers
        _, state = task.reset(exs[i // 4], 7)
        for t in range(int(ep.turns[i])):
            action_ids = ids[(turn == t) & (loss == 1)]
            assert 1 <= len(action_ids) <= 2
            reply = task.step(state, tok.decode(action_ids.tolist(), skip_special_tokens=True))
            end = int(((turn == t) & (loss == 1)).nonzero().max())
            assert ep.step_ends[i, end] and float(ep.step_rewards[i, end]) == reply.reward
            obs_ids = ids[(turn == t) & (loss == 0)]
            if len(obs_ids):
                ended = bool(action_ids[-1] == tok.eos_token_id)
                assert tok.decode(obs_ids.tolist()) == observation_text(tok, reply.observation, ended)
                assert ep.anchors[i][t + 1] == reply.observation
        assert ep.step_ends[i].sum() == ep.turns[i]


def test_the_budget_ends_an_episode_before_an_observation_that_does_not_fit(tiny):
    _, _, ep = _episodes(tiny, lake(), max_turns=8, turn_tokens=4, budget=30)
    assert int(ep.lengths.max()) <= 30 and bool(ep.truncated.any())
    assert all(int(ep.turns[i]) >= 1 for i in range(12))


def test_observation_text_follows_the_chat_template():
    """With a chat template, what follows an action is the template's own rendering of the observation as the next
    user message and the opening of the assistant's reply; the EOS the action ended with is not written twice, and
    an action cut without it gets the template's closing marker first. Without a template: the observation's lines."""
    tok = char_tokenizer()
    assert observation_text(tok, "GRID", True) == "GRID\n" and observation_text(tok, "GRID", False) == "\nGRID\n"
    tok.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<eos>{% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|>{% endif %}")  # fmt: skip
    assert observation_text(tok, "GRID", True) == "<|user|>GRID<eos><|assistant|>"
    assert observation_text(tok, "GRID", False) == "<eos><|user|>GRID<eos><|assistant|>"


# ---- the module: zero gradient on the environment's tokens, one-turn episodes as single-turn rollouts -------------
def _module(name: str, store_args, *extra):
    cfg = compose([f"algorithm={name}", "task=frozen_lake", *SMALL, "task.num_maps=200", "rollout.max_turns=4",
                   "rollout.turn_tokens=3", "rollout.max_new_tokens=80", *extra, *store_args])  # fmt: skip
    obj = OmegaConf.to_object(cfg)
    policy, tok = load_policy(obj.model, obj.seed)
    task = TASKS.get("frozen_lake")(obj.task, tok, seed=0, prompts_per_step=4)
    return ALGORITHMS.get(name)(obj, policy, tok, task), task


@pytest.mark.parametrize("name", ["grpo", "gigpo", "loop", "turn_ppo", "empg"])
def test_the_environments_tokens_get_exactly_zero_gradient(name, store):
    """Through the module's own rollout, advantages and loss: d loss / d log π at every environment token is exactly
    0, at the action tokens it is not."""
    module, task = _module(name, store["args"], "algorithm.beta=0")
    batch = task.collate_prompts(task.examples("train")[:4])
    ro = module.make_rollout(batch)
    module.behaviour_logprobs(ro)
    module.shape_rewards(ro)
    ro.scores = ro.rewards = torch.linspace(0, 1, ro.size)  # varied returns: every group carries a gradient
    from bench.rl.losses import terminal_rewards

    ro.token_rewards = terminal_rewards(ro.rewards, ro.train_mask)
    ro.adv = module.advantages(ro)
    env = (ro.mask == 1) & (ro.train_mask == 0)
    assert env.any(), "no episode reached a second turn"
    rows = ro.rows(torch.arange(ro.size))
    logp = rows["old_logp"].clone().requires_grad_(True)
    from bench.rl.losses import Norm

    loss, _ = module.loss(rows, logp, Norm.of(rows["mask"], budget=80, groups=rows["group"]))
    loss.backward()
    assert logp.grad[env].eq(0).all()
    assert logp.grad[ro.train_mask.bool()].abs().sum() > 0


ONE_TURN = '''
from bench.engine.episode import Turn
from bench.task import RewardResult
from tasks.countdown import Countdown


class CoinTurn(Countdown):
    """tests/conftest.py's coin task as an environment of one turn: the episode is the completion, scored as coin."""

    def reward(self, example, completion):
        score = float(bool(completion) and ord(completion[0]) % 2 == 0)
        return RewardResult(score=score, components={"correct": score})

    def reset(self, example, seed):
        return example.question, example

    def step(self, state, action):
        res = self.reward(state, action)
        return Turn("", res.score, True, res.components)
'''


@pytest.fixture
def one_turn(tmp_path):
    d = tmp_path / "turntasks"
    d.mkdir()
    (d / "coin_turn.py").write_text(ONE_TURN)
    (d / "coin.py").write_text(COIN)
    TASKS.include(d)
    yield d
    TASKS.dirs.remove(d.resolve())
    TASKS._classes = None


@pytest.mark.parametrize("name", ["grpo", "loop"])
def test_one_turn_episodes_train_bit_for_bit_as_the_single_turn_task(name, one_turn, store):
    """The coin task and the same task as a one-turn environment: the same samples, rewards, losses and final
    weights, bit for bit (turn 1 is the engine's group sampling; nothing else changes)."""
    from safetensors.torch import load_file

    runs = {}
    for task in ("coin", "coin_turn"):
        args = [f"algorithm={name}", f"task={task}", *SMALL, "trainer.max_steps=3", "trainer.eval_every=3",
                "trainer.progress_bar=false", "optim.lr=3e-3", *store["args"]]  # fmt: skip
        runs[task] = train(compose(args))
    client = MlflowClient(tracking_uri=store["uri"])
    for key in ("reward/mean", "loss/total", "eval/accuracy", "rollout/tokens_generated"):
        a = [m.value for m in client.get_metric_history(runs["coin"].run_id, key)]
        b = [m.value for m in client.get_metric_history(runs["coin_turn"].run_id, key)]
        assert a == b and a, (key, a, b)
    wa = load_file(str(runs["coin"].run_dir / "final" / "model.safetensors"))
    wb = load_file(str(runs["coin_turn"].run_dir / "final" / "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    turns = client.get_metric_history(runs["coin_turn"].run_id, "rollout/turns_mean")
    assert [m.value for m in turns] == [1.0, 1.0, 1.0]


def test_an_algorithm_that_reads_one_turns_text_is_refused_on_an_environment(store):
    with pytest.raises(ConfigError, match=r"algorithm=vineppo .* environment .* gigpo.*grpo.*loop"):
        _module("vineppo", store["args"])


# ---- GiGPO ----------------------------------------------------------------------------------------------------------
def _gigpo(anchors, rewards, **cfg):
    """Rows of one token per turn: turn rewards [B][turns] -> the GiGPO advantages [B, turns]."""
    from algorithms.gigpo import GiGPOConfig, gigpo_advantages

    B, T = len(rewards), max(map(len, rewards))
    step_rewards, ends = torch.zeros(B, T), torch.zeros(B, T, dtype=torch.bool)
    index, mask = torch.full((B, T), -1), torch.zeros(B, T)
    for i, r in enumerate(rewards):
        step_rewards[i, : len(r)] = torch.tensor(r)
        ends[i, : len(r)] = True
        index[i, : len(r)] = torch.arange(len(r))
        mask[i, : len(r)] = 1
    R = step_rewards.sum(1)
    return gigpo_advantages(R, step_rewards, ends, index, mask, anchors, len(rewards), GiGPOConfig(**cfg))


def test_gigpo_hand_computed_values():
    """Two episodes from one state s0; the first reaches s1 and earns 1 on its second turn, the second reaches s2
    and earns nothing. γ = 0.5. Episode returns [1, 0]; turn returns [0.5, 1] and [0, 0]. s0's anchor group holds
    both first turns ([0.5, 0]); s1 and s2 are singletons (A^S = 0)."""
    anchors = [["s0", "s1"], ["s0", "s2"]]
    adv = _gigpo(anchors, [[0.0, 1.0], [0.0, 0.0]], gamma=0.5, norm="none")
    # A^E = [0.5, -0.5]; A^S(s0) = [0.25, -0.25]
    assert adv.flatten().tolist() == pytest.approx([0.75, 0.5, -0.75, -0.5])
    adv = _gigpo(anchors, [[0.0, 1.0], [0.0, 0.0]], gamma=0.5, norm="std")
    s = 2**0.5 / 2  # (x − mean)/std of two values is ±1/√2
    assert adv.flatten().tolist() == pytest.approx([2 * s, s, -2 * s, -s], abs=1e-5)
    # the code's turn-row statistics: the first episode counted twice, the second twice (both took 2 turns): same
    rows = _gigpo(anchors, [[0.0, 1.0], [0.0, 0.0]], gamma=0.5, norm="none", episode_stats="turn_rows")
    assert rows.flatten().tolist() == pytest.approx([0.75, 0.5, -0.75, -0.5])
    # an episode of 3 turns against one of 1: turn rows weight it 3:1 (mean 0.75), episodes 1:1 (mean 0.5)
    uneven = [["a", "b", "c"], ["a"]]
    rows = _gigpo(uneven, [[0.0, 0.0, 1.0], [0.0]], gamma=1.0, norm="none", episode_stats="turn_rows", step_weight=0)
    eps = _gigpo(uneven, [[0.0, 0.0, 1.0], [0.0]], gamma=1.0, norm="none", step_weight=0)
    assert rows[:, 0].tolist() == pytest.approx([0.25, -0.75]) and eps[:, 0].tolist() == pytest.approx([0.5, -0.5])


def test_gigpo_counts_the_turns_its_step_groups_can_credit():
    from algorithms.gigpo import shared_turn_frac

    # group 1: s0 twice (2 shared turns) of 4; group 2: nothing shared of 2
    assert shared_turn_frac([["s0", "a"], ["s0", "b"], ["x"], ["y"]], 2) == pytest.approx(2 / 6)


def test_gigpo_reduces_to_episode_grpo():
    """No anchor shared by two turns: A = A^E, GRPO's group z-score on every turn. One-turn episodes (every first turn
    answers the same observation): A = (1 + ω)·A^E. Constant returns: 0, never NaN."""
    from bench.rl.losses import group_advantages

    rewards = [[0.0, 1.0], [0.0, 0.0], [1.0], [0.0, 0.0, 1.0]]
    anchors = [[f"x{i}-{t}" for t in range(len(r))] for i, r in enumerate(rewards)]
    adv = _gigpo(anchors, rewards)
    grpo = group_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), 4, scale="std")
    for i, r in enumerate(rewards):
        assert adv[i, : len(r)].tolist() == pytest.approx([float(grpo[i])] * len(r), abs=1e-6)
    one = _gigpo([["s"]] * 4, [[1.0], [0.0], [0.0], [1.0]], step_weight=0.5)
    grpo = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), 4, scale="std")
    assert one[:, 0].tolist() == pytest.approx((1.5 * grpo).tolist(), abs=1e-6)
    flat = _gigpo([["s", "t"]] * 3, [[0.0, 1.0]] * 3)
    assert torch.isfinite(flat).all() and flat.eq(0).all()


# ---- LOOP -----------------------------------------------------------------------------------------------------------
def test_loop_advantage_is_leave_one_out_and_its_clip_interval_is_a_choice(store):
    from bench.rl.objective import advantages

    module, _ = _module("loop", store["args"])
    adv = advantages(module.acfg, torch.tensor([1.0, 0.0, 0.0, 1.0]), None, None, 4)
    assert adv.tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])  # R_k − mean of the other three
    assert (module.acfg.clip_eps_low, module.acfg.clip_eps_high) == (0.1, 0.1)
    logsym, _ = _module("loop", store["args"], "algorithm.clip_interval=log_symmetric")
    assert logsym.acfg.clip_eps_low == pytest.approx(0.1 / 1.1) and 1 - logsym.acfg.clip_eps_low == pytest.approx(
        1 / 1.1
    )
    assert module.acfg.dynamic_sampling and module.acfg.max_sampling_rounds == 1 and module.acfg.beta == 0


# ---- end to end -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["grpo", "gigpo", "loop", "turn_ppo", "empg"])
def test_each_method_trains_on_frozen_lake_and_logs_the_turns(name, store):
    args = [f"algorithm={name}", "task=frozen_lake", *SMALL, "task.num_maps=200", "rollout.max_new_tokens=80",
            "trainer.max_steps=2", "trainer.eval_every=2", "trainer.progress_bar=false", *store["args"]]  # fmt: skip
    result = train(compose(args))
    client = MlflowClient(tracking_uri=store["uri"])
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    for key in (
        "rollout/turns_mean",
        "rollout/turn_reward_mean",
        "rollout/turn_len_mean",
        "rollout/turn_limit_frac",
        "rollout/episode_truncated_frac",
        "reward/moves",
        "eval/accuracy",
    ):
        assert key in run.data.metrics, key
    assert 1.0 <= run.data.metrics["rollout/turns_mean"] <= 8.0
    assert run.data.params["rollout.max_turns"] == "8"


def test_gigpo_on_a_single_turn_task_is_grpo_scaled_by_one_plus_omega(store):
    """Each completion an episode of one turn from the prompt: A = (1 + ω)·A^E on every policy token (token-level)."""
    module, _, _ = _countdown_module("gigpo", store["args"])
    ro = _fake_rollout(module)
    adv = module.advantages(ro)
    from bench.rl.losses import group_advantages

    want = 2.0 * group_advantages(ro.rewards, ro.group_size, scale="std")
    assert torch.allclose(adv, want.unsqueeze(-1) * ro.mask, atol=1e-6)


def _fake_rollout(module):
    from bench.engine.rollout import Rollout

    B, T = 8, 5
    mask = torch.ones(B, T)
    mask[1, 3:] = 0
    mask[5, 1:] = 0
    return Rollout(examples=[None, None], prompt_ids=torch.ones(B, 2, dtype=torch.long), prompt_mask=torch.ones(B, 2),
                   completion_ids=torch.ones(B, T, dtype=torch.long), mask=mask, sampler_logp=torch.zeros(B, T),
                   lengths=mask.sum(1).long(), truncated=torch.zeros(B, dtype=torch.bool), texts=[""] * B,
                   group_size=4, rewards=torch.tensor([1.0, 0, 0, 1, 0, 0, 0, 1]))  # fmt: skip


# ---- turn-level PPO -------------------------------------------------------------------------------------------------
def test_turn_gae_hand_computed_and_its_one_turn_form():
    """Two turns (tokens 0-1, then an observation, then tokens 4-5), rewards [0, 1] on each turn's last token, V read
    at each turn's first token [0.5, 0.8], γ 0.99, λ 0.9: δ_2 = 1 − 0.8 = 0.2, δ_1 = 0.99·0.8 − 0.5 = 0.292,
    Â = [0.292 + 0.891·0.2, 0.2] = [0.4702, 0.2], R̂ = Â + V = [0.9702, 1.0]. One turn: Â = R − V(s_1) everywhere."""
    from algorithms.turn_ppo import turn_gae

    index = torch.tensor([[0, 0, -1, -1, 1, 1]])
    rewards = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.7, 9.0, 9.0, 0.8, 0.1]])  # only each turn's first token is read
    adv, ret = turn_gae(rewards, values, index, 0.99, 0.9)
    assert adv.flatten().tolist() == pytest.approx([0.4702, 0.4702, 0, 0, 0.2, 0.2], abs=1e-6)
    assert ret.flatten().tolist() == pytest.approx([0.9702, 0.9702, 0, 0, 1.0, 1.0], abs=1e-6)
    one = torch.tensor([[0, 0, 0, -1]])
    adv, _ = turn_gae(torch.tensor([[0.0, 0.0, 1.0, 0.0]]), torch.tensor([[0.3, 0.2, 0.1, 0.0]]), one, 0.5, 0.5)
    assert adv.flatten().tolist() == pytest.approx([0.7, 0.7, 0.7, 0.0])


def test_terminal_rewards_land_on_the_last_policy_token_of_a_mask_with_holes():
    from bench.rl.losses import terminal_rewards

    mask = torch.tensor([[1.0, 1, 0, 0, 1, 0], [1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
    out = terminal_rewards(torch.tensor([2.0, 3.0, 4.0]), mask)
    assert out.tolist() == [[0, 0, 0, 0, 2, 0], [0, 0, 3, 0, 0, 0], [0, 0, 0, 0, 0, 0]]


def test_a_multi_turn_run_resumed_mid_training_is_one_run_and_the_uninterrupted_one(store):
    """A FrozenLake run stopped after 2 of 4 steps (its checkpoint kept, its MLflow run KILLED as a stop leaves it)
    and resumed ends as one FINISHED MLflow run with every step logged once, and its episodes (worlds, samples,
    rewards) and final weights are the uninterrupted run's: the prompts, episode seeds and environment seeds are
    functions of (seed, step)."""
    from safetensors.torch import load_file

    from bench.run.train import resume

    args = ["algorithm=gigpo", "task=frozen_lake", *SMALL, "task.num_maps=200", "rollout.max_new_tokens=80",
            "trainer.eval_every=100", "trainer.checkpoint_every=1", "trainer.progress_bar=false",
            "task.demo_error_rate=0.5", *store["args"]]  # fmt: skip
    whole = train(compose([*args, "trainer.max_steps=4"]))
    first = train(compose([*args, "trainer.max_steps=2"]))
    client = MlflowClient(tracking_uri=store["uri"])
    client.update_run(first.run_id, status="KILLED")
    again = resume(first.run_dir, ["trainer.max_steps=4"])
    assert again.run_id == first.run_id and client.get_run(first.run_id).info.status == "FINISHED"
    for key in ("reward/mean", "rollout/turns_mean", "reward/moves", "loss/total"):
        a = [(m.step, m.value) for m in sorted(client.get_metric_history(whole.run_id, key), key=lambda m: m.step)]
        b = [(m.step, m.value) for m in sorted(client.get_metric_history(first.run_id, key), key=lambda m: m.step)]
        assert [s for s, _ in b] == [s for s, _ in a] == [0, 1, 2, 3], (key, a, b)
        assert [v for _, v in a] == pytest.approx([v for _, v in b], abs=1e-6), (key, a, b)
    wa = load_file(str(whole.run_dir / "final" / "model.safetensors"))
    wb = load_file(str(again.run_dir / "final" / "model.safetensors"))
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-6


# ---- text-to-SQL with execution feedback ---------------------------------------------------------------------------
def _sql_task():
    from tests.conftest import data_root

    if data_root() is None:
        pytest.skip("text_to_sql_feedback needs the data root (BENCH_DATA) for Spider's databases")
    cfg = OmegaConf.to_object(compose(["algorithm=grpo", "task=text_to_sql_feedback", "task.num_eval=20"]))
    return TASKS.get("text_to_sql_feedback")(cfg.task, char_tokenizer(), seed=0)


def test_sql_feedback_answers_looks_refuses_writes_and_scores_the_solution():
    """An exploratory query shows its rows (bounded), a failing or writing one its error (the database unchanged), an
    untagged turn the format; the solution ends the episode scored by execution match, as the single-turn task."""
    import hashlib

    task = _sql_task()
    from tasks.text_to_sql_feedback import first_table

    ex = next(e for e in task.eval_examples() if first_table(e.answer["query"]))
    table = first_table(ex.answer["query"])
    db = Path(ex.answer["db_path"])
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    _, state = task.reset(ex, 0)
    t = task.step(state, f"Let me look. <sql>SELECT 1, 2 FROM {table} LIMIT 2</sql>")
    assert t.observation.startswith("2 columns, ") and not t.done and t.components["queries"] == 1.0, t
    for bad in (f"<sql>DROP TABLE {table}</sql>", "<sql>ATTACH DATABASE '/tmp/x.db' AS x</sql>",
                "<sql>SELECT * FROM no_such_table</sql>"):  # fmt: skip
        t = task.step(state, bad)
        assert t.observation.startswith("error:") and not t.done and t.reward == 0.0, bad
    assert not task.step(state, "SELECT 1").done  # no tag: told the format
    t = task.step(state, f"<solution>{ex.answer['query']}</solution>")
    assert (t.reward, t.done, t.components["matches"], t.components["answered"]) == (1.0, True, 1.0, 1.0)
    assert t.components["queries"] == 4.0
    _, state = task.reset(ex, 0)
    t = task.step(state, "<solution>SELECT 1</solution>")
    assert (t.reward, t.done, t.components["matches"]) == (0.0, True, 0.0)
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before and not Path("/tmp/x.db").exists()
    long = "<sql>SELECT " + "1," * 20_000 + "1</sql>"  # past the cap the tag never closes: the format hint
    _, state = task.reset(ex, 0)
    assert task.step(state, long).observation.startswith("Answer with")


def test_sql_feedback_trains_end_to_end_and_logs_its_turns(store):
    """GRPO over SQL episodes on the tiny model, 2 steps from its warm start on the demonstrations (look, then
    answer): FINISHED, and the per-turn metrics are read back from MLflow."""
    _sql_task()
    args = ["algorithm=grpo", "task=text_to_sql_feedback", *SMALL, "init=sft", "warm_start.max_steps=5",
            "rollout.max_new_tokens=500", "rollout.turn_tokens=120", "rollout.max_turns=3", "trainer.max_steps=2",
            "trainer.eval_every=2", "task.num_eval=4", "trainer.progress_bar=false", *store["args"]]  # fmt: skip
    result = train(compose(args))
    client = MlflowClient(tracking_uri=store["uri"])
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    for key in ("rollout/turns_mean", "rollout/turn_len_mean", "rollout/observation_len_mean", "reward/queries",
                "reward/answered", "eval/accuracy"):  # fmt: skip
        assert len(client.get_metric_history(result.run_id, key)) >= 1, key


# ---- EMPG -----------------------------------------------------------------------------------------------------------
def test_empg_hand_computed_values_and_its_bonus_whatever_the_sign():
    """Episode 0 has two steps (token entropies 0 | 1), episode 1 one step (0.5); episode advantages [1, −1].
    Ĥ = [0, 1, 0.5]; g = exp(−Ĥ)/mean = [1.51944, 0.55897, 0.92158]; the bonus ζ·f(Ĥ_next) = 0.1·e^−1 on episode 0's
    first step only; A_mod = [1.55623, 0.55897, −0.92158], centred by its mean 0.39787."""
    from algorithms.empg import EMPGConfig, empg_advantages

    index = torch.tensor([[0, 0, -1, 1], [0, -1, -1, -1]])
    entropy = torch.tensor([[0.0, 0.0, 7.0, 1.0], [0.5, 9.0, 9.0, 9.0]])  # off-step entropies never read
    adv = empg_advantages(torch.tensor([1.0, -1.0]), entropy, index, EMPGConfig())
    assert adv.flatten().tolist() == pytest.approx([1.158362, 1.158362, 0, 0.161103, -1.319465, 0, 0, 0], abs=1e-5)
    # the bonus is the same whether the outcome was good or bad (it can flip a small negative advantage)
    no_bonus = EMPGConfig(zeta=0.0)
    for a in (0.5, -0.5):
        a = torch.tensor([a, -a])
        diff = empg_advantages(a, entropy, index, EMPGConfig()) - empg_advantages(a, entropy, index, no_bonus)
        assert diff[0, 0] == pytest.approx(0.1 * math.exp(-1) * 2 / 3, abs=1e-6)  # ζ f − mean(ζ f) over 3 steps
    small = empg_advantages(torch.tensor([-0.01, 0.01]), entropy, index, EMPGConfig(zeta=1.0))
    assert small[0, 0] > 0


def test_empg_with_equal_entropies_and_one_step_is_grpo():
    from algorithms.empg import EMPGConfig, empg_advantages
    from bench.rl.losses import group_advantages

    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0])
    a = group_advantages(rewards, 4, scale="std")
    index = torch.zeros(8, 3, dtype=torch.long)
    adv = empg_advantages(a, torch.full((8, 3), 0.7), index, EMPGConfig())
    assert torch.allclose(adv, a.unsqueeze(-1).expand(8, 3), atol=1e-6)


def test_the_process_oracle_trains_on_the_shaped_turn_rewards(store):
    """GRPO-PS with task.reward=shaped (lake_turns' oracle): each turn's distance progress is its step reward, the
    start-up check accepts an environment's turns as steps, and the shaped return is what it trains on."""
    args = ["algorithm=grpo_ps", "task=frozen_lake", "task.reward=shaped", *SMALL, "task.num_maps=200",
            "rollout.max_new_tokens=80", "trainer.max_steps=2", "trainer.eval_every=2", "trainer.progress_bar=false",
            *store["args"]]  # fmt: skip
    result = train(compose(args))
    run = MlflowClient(tracking_uri=store["uri"]).get_run(result.run_id)
    assert run.info.status == "FINISHED" and "rollout/turn_reward_mean" in run.data.metrics
