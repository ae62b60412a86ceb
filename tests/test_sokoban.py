"""The Sokoban environment (tasks/sokoban.py): reasoning-gym's levels and moves, the turn rules on a hand-made level,
its dynamics against the Game reasoning-gym's own scorer replays, the demonstrator's error knob, and an end-to-end
GiGPO run whose anchor states repeat. The hostile-action audit is the environment contract's
(tests/test_tasks_contract.py), which every environment gets."""

from __future__ import annotations

import random

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf
from reasoning_gym.games.contrib.sokoban.src.game import Game

from bench.config import compose
from bench.engine.policy import char_tokenizer
from bench.registry import TASKS
from bench.run.train import train
from bench.task import Example
from tests.conftest import SMALL

ROOM = ("++++++", "+X---+", "+-@--+", "+-*--+", "+----+", "++++++")
LEVEL = Example(uid="sokoban-hand", question="\n".join(ROOM), answer=ROOM)


def sokoban(**overrides):
    cfg = compose(["algorithm=grpo", "task=sokoban", "task.num_levels=200",
                   *[f"task.{k}={v}" for k, v in overrides.items()]])  # fmt: skip
    return TASKS.get("sokoban")(OmegaConf.to_object(cfg).task, char_tokenizer(), seed=0)


def test_moves_push_the_box_walls_block_and_the_goal_solves():
    """U pushes the box up; R, U walk round it; L pushes it onto X: reward 1, done. A move into a wall leaves the board
    (blocked), a non-move says so (invalid)."""
    task = sokoban()
    obs, state = task.reset(LEVEL, 0)
    assert obs == LEVEL.question
    t = task.step(state, "U")
    assert t.observation == "++++++\n+X@--+\n+-*--+\n+----+\n+----+\n++++++" and (t.reward, t.done) == (0.0, False)
    assert task.step(state, "right").observation.splitlines()[2] == "+--*-+"
    t = task.step(state, "jump")
    assert t.observation.startswith("Invalid move") and t.components["invalid"] == 1.0
    task.step(state, "U")
    t = task.step(state, "U")  # into the top wall
    assert t.components["blocked"] == 1.0 and t.observation.splitlines()[1] == "+X@*-+"
    t = task.step(state, "l")
    assert t.observation.splitlines()[1] == "+$*--+"
    assert (t.reward, t.done, t.components["solved"], t.components["on_goal"], t.components["moves"]) == (
        1.0, True, 1.0, 1.0, 6.0)  # fmt: skip


def test_a_box_pushed_against_a_goalless_wall_is_a_deadlock_and_the_episode_goes_on():
    """Walking round the box and pushing it down twice leaves it on the bottom row, which has no goal: reasoning-gym's
    deadlock test holds, the reward stays 0 and the episode is not over (as RAGEN's)."""
    task = sokoban()
    _, state = task.reset(LEVEL, 0)
    for move in "LUUR":
        t = task.step(state, move)
    assert t.observation.splitlines()[1] == "+X*--+" and t.components["deadlock"] == 0.0
    task.step(state, "D")
    t = task.step(state, "D")
    assert t.observation.splitlines()[4] == "+-@--+"
    assert (t.components["deadlock"], t.reward, t.done) == (1.0, 0.0, False)


def test_the_dynamics_are_the_ones_reasoning_gyms_scorer_replays():
    """On generated levels, random move sequences (pushes, blocked moves and all) give the same board under the
    environment's step as under reasoning-gym's Game, which its score_answer replays."""
    task = sokoban()
    rng = random.Random(0)
    for ex in task.eval_examples()[:15]:
        _, state = task.reset(ex, 0)
        game = Game(height=len(ex.answer), width=len(ex.answer[0]))
        game.load_puzzle_matrix(np.array([list(r) for r in ex.answer]))
        for move in rng.choices("LDRU", k=40):
            task.step(state, move)
            game.player.update(key=move)
            assert state["board"] == game.get_curr_state(), (ex.uid, move)


def test_levels_are_reasoning_gyms_split_by_seed_and_the_demonstrator_errs_on_request():
    """Train and test levels are disjoint seeds of the requested size and box count; with the error knob at 0.3 some
    demonstrated moves differ from the solver's and some demonstrations lose the level."""
    task = sokoban()
    train_uids = {e.uid for e in task.load_split("train")}
    test = task.eval_examples()
    assert test and not train_uids & {e.uid for e in test}
    assert all(len(e.answer) == 6 and "".join(e.answer).count("@") + "".join(e.answer).count("$") == 1 for e in test)
    clean, noisy = task, sokoban(demo_error_rate=0.3)
    unsolved = 0
    differs = 0
    for a, b in zip(clean.load_split("train"), noisy.load_split("train"), strict=True):
        differs += a.demonstration != b.demonstration
        _, state = noisy.reset(b, 0)
        unsolved += not any(noisy.step(state, m).done for m in b.demonstration)
    assert differs > 20 and 0 < unsolved < differs


def test_gigpo_trains_on_sokoban_and_its_step_groups_share_boards(store):
    """Two GiGPO steps on Sokoban: FINISHED, turns logged, and some turns share an anchor board within a group
    (a blocked or undone move repeats a board), so the step-level advantage has groups to compare."""
    args = ["algorithm=gigpo", "task=sokoban", *SMALL, "task.num_levels=200", "rollout.max_new_tokens=120",
            "rollout.max_turns=4", "trainer.max_steps=2", "trainer.eval_every=2", "trainer.progress_bar=false",
            *store["args"]]  # fmt: skip
    result = train(compose(args))
    run = MlflowClient(tracking_uri=store["uri"]).get_run(result.run_id)
    assert run.info.status == "FINISHED"
    for key in ("rollout/turns_mean", "reward/deadlock", "reward/blocked", "eval/accuracy"):
        assert key in run.data.metrics, key
    assert 1.0 <= run.data.metrics["rollout/turns_mean"] <= 4.0
    assert run.data.metrics["stats/gigpo_shared_turn_frac"] > 0.0


@pytest.mark.parametrize("action", ["R" * 100_000, "left" + "\x00" * 10_000, "__import__('os').system('ls')"])
def test_hostile_actions_on_a_generated_level_are_ordinary_turns(action):
    task = sokoban()
    ex = task.eval_examples()[0]
    _, state = task.reset(ex, 0)
    t = task.step(state, action)
    assert 0.0 <= t.reward <= 1.0 and len(t.observation) < 200


@pytest.mark.parametrize("bad", ["task.boxes=5", "task.size=3", "task.size=30", "task.demo_error_rate=1.5"])
def test_an_impossible_level_request_is_refused_with_the_knob_and_its_range(bad):
    """reasoning-gym's generator redraws until a level fits, so an impossible request must fail at start-up."""
    with pytest.raises(Exception, match=bad.split("=")[0]):
        OmegaConf.to_object(compose(["algorithm=grpo", "task=sokoban", bad]))
