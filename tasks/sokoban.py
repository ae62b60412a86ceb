"""Sokoban: push the boxes onto the goals, one move a turn (an environment task: multi-turn episodes).

Levels and dynamics are reasoning-gym's (``reasoning_gym.games.contrib.sokoban``): its generator plays a solved board
backwards from a random start (pulling boxes off their goals) and keeps a level only if its A* solver solves it
within ``max_depth`` moves; a move is its ``can_move`` (what that solver steps with; ``tests/test_sokoban.py``
checks it against the ``Game`` its scorer replays). The default, a 6 x 6 board (walls included) with one box, is
the level RAGEN and GiGPO train on. A box pushed into a corner can never reach a goal: one early turn can cost the
episode, and the reward says so only at the end, which is the credit-over-turns question.

One literal episode, prompt and turns for the character-level tiny model::

    prompt  "sokoban\\n++++++\\n+----+\\n+----+\\n+--@*+\\n+---X+\\n++++++\\n"     (* you, @ box, X goal)
    turn 1  action "U"  ->  observation "++++++\\n+----+\\n+---*+\\n+--@-+\\n+---X+\\n++++++"   reward 0
    turns 2-5  "L", "D", "L", "D": round the box and behind it         turn 6 "R": the box onto X ($), reward 1, done

Symbols (reasoning-gym's): ``+`` wall, ``-`` floor, ``X`` goal, ``@`` box, ``$`` box on a goal, ``*`` you, ``%``
you on a goal. A move is the first whole word L, D, R, U (or left, down, right, up) in the action's first
``MAX_SCAN_CHARS`` characters, case ignored; anything else is an invalid move (the player stays, the observation
says so, ``invalid`` counts it). A move into a wall, or a push into a wall or a second box, leaves the board as it
is (``blocked`` counts it). Nothing in an action is evaluated.

Reward 1 on the turn that leaves no box off a goal, else 0. Components: ``solved``, ``on_goal`` (share of boxes on
goals), ``deadlock`` (reasoning-gym's corner and wall deadlock test holds: the level can no longer be solved),
``invalid``, ``blocked``, ``moves``. The episode runs to the solve or ``rollout.max_turns``; a deadlock does not end
it (as RAGEN's does not). No distance-shaped oracle: the progress of a push is not a distance on the board.

Demonstrations (the SFT warm start) are the solver's moves with an **error-rate knob**: each move is replaced by a
random other move with probability ``demo_error_rate``, after which the demonstrator plans again from where it is
(and stops if the level is lost), so a warm start learns to push mostly right and sometimes into a corner.

Data: one level per seed ``0 .. num_levels − 1`` (reasoning-gym's generator on ``random.Random(seed)``); train and
test are disjoint sets of seeds (a hash of the seed).

version = "1"
    1: initial version.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np
from reasoning_gym.games.contrib.sokoban.src.astar import astar
from reasoning_gym.games.contrib.sokoban.src.generator import generate
from reasoning_gym.games.contrib.sokoban.src.utils import can_move, is_deadlock, is_solved

from bench.engine.episode import Turn
from bench.task import Example, RewardResult, Split, Task, TaskConfig, hash_unit
from tasks.frozen_lake import MAX_SCAN_CHARS, NAMES
from tasks.frozen_lake import move_of as lake_move

DELTAS = {"L": (0, -1), "D": (1, 0), "R": (0, 1), "U": (-1, 0)}  # (row, column), as reasoning-gym's solver moves


@dataclass
class SokobanConfig(TaskConfig):
    name: str = "sokoban"
    size: int = 6
    """The board's side, walls included (reasoning-gym's min_w = max_w = min_h = max_h)."""
    boxes: int = 1
    """Boxes (and goals) on the board."""
    max_depth: int = 60
    """The generator's and the demonstrator's A* search depth (levels it cannot solve within it are redrawn)."""
    demo_error_rate: float = 0.0
    """Probability that the demonstrator replaces a move by a random other one (then plans again)."""
    demo_max_moves: int = 10
    """The demonstrator stops after this many moves (conf/task/sokoban.yaml: the run's ``rollout.max_turns``)."""
    num_levels: int = 1000
    """Level seeds 0 .. num_levels − 1, split between train and test by a hash of the seed (reasoning-gym's
    generator takes ~5-10 ms a level here, so 1000 load in seconds)."""
    test_share: float = 0.1
    num_eval: int = 200

    def __post_init__(self) -> None:
        # reasoning-gym's generator redraws until a level fits: an impossible request would loop for ever.
        if not 4 <= self.size <= 20:
            raise ValueError(f"task.size must be in 4..20 (the board's side, walls included), got {self.size}")
        if not 1 <= self.boxes <= (self.size - 2) ** 2 // 4:
            raise ValueError(f"task.boxes must be in 1..{(self.size - 2) ** 2 // 4} on a {self.size} x {self.size} "
                             f"board (a quarter of its floor), got {self.boxes}: raise task.size for more")  # fmt: skip
        if not 0 <= self.demo_error_rate <= 1 or self.max_depth < 1:
            raise ValueError(f"task.demo_error_rate must be in [0, 1] and task.max_depth >= 1, got "
                             f"{self.demo_error_rate}, {self.max_depth}")  # fmt: skip


def move_of(action: str) -> str | None:
    """The first move (L, D, R, U) named in the action's first MAX_SCAN_CHARS characters (FrozenLake's reading), or
    None."""
    a = lake_move(action)
    return None if a is None else NAMES[a]


def board(rows: tuple[str, ...]) -> str:
    return "\n".join(rows)


def player_of(state: str, width: int) -> tuple[int, int]:
    i = next(i for i, c in enumerate(state) if c in "*%")
    return divmod(i, width)


def solve(state: str, shape: tuple[int, int], max_depth: int) -> str | None:
    """reasoning-gym's A* plan from this board, or None (a lost or too-deep level)."""
    if is_solved(state):
        return ""
    plan, _ = astar(np.array(list(state)).reshape(shape), player_of(state, shape[1]), max_depth=max_depth)
    return plan


class Sokoban(Task):
    Config = SokobanConfig
    version = "1"
    description = "reasoning-gym's Sokoban levels as a text board, one move a turn, reward 1 when solved (multi-turn)"
    scan = ("head", MAX_SCAN_CHARS)

    def load_split(self, split: Split) -> list[Example]:
        cfg = self.cfg
        want_test = split != "train"
        out = []
        for seed in range(cfg.num_levels):
            if (hash_unit("sokoban", seed) < cfg.test_share) != want_test:
                continue
            text, solution, _ = generate(
                random.Random(seed), min_w=cfg.size, min_h=cfg.size, max_w=cfg.size, max_h=cfg.size,
                min_boxes=cfg.boxes, max_boxes=cfg.boxes, max_depth=cfg.max_depth,
            )  # fmt: skip
            rows = tuple(line.replace(" ", "") for line in text.strip().splitlines())
            ex = Example(uid=f"sokoban-{cfg.size}-{cfg.boxes}-{seed}", question=board(rows), answer=rows)
            out.append(Example(ex.uid, ex.question, ex.answer, demonstration=self.demonstrate(ex, solution)))
        return out

    # ---- the environment -----------------------------------------------------------------------------------------
    def reset(self, example: Example, seed: int) -> tuple[str, Any]:
        rows = example.answer
        state = {"board": "".join(rows), "shape": (len(rows), len(rows[0])), "boxes": sum(r.count("@") + r.count("$")
                 for r in rows), "invalid": 0, "blocked": 0, "moves": 0}  # fmt: skip
        return example.question, state

    def render(self, state: dict) -> str:
        w = state["shape"][1]
        return "\n".join(state["board"][i : i + w] for i in range(0, len(state["board"]), w))

    def step(self, state: dict, action: str) -> Turn:
        move = move_of(action)
        state["moves"] += 1
        if move is None:
            state["invalid"] += 1
            return Turn("Invalid move: answer L, D, R or U.\n" + self.render(state), 0.0, False, self.components(state))
        after, _ = can_move(state["board"], state["shape"], player_of(state["board"], state["shape"][1]), DELTAS[move])
        if after is None or after == state["board"]:
            state["blocked"] += 1
        else:
            state["board"] = after
        solved = is_solved(state["board"])
        return Turn(self.render(state), float(solved), solved, self.components(state))

    @staticmethod
    def components(state: dict) -> dict[str, float]:
        b = state["board"]
        return {"solved": float(is_solved(b)), "on_goal": b.count("$") / max(state["boxes"], 1),
                "deadlock": float(is_deadlock(b, state["shape"])), "invalid": float(state["invalid"]),
                "blocked": float(state["blocked"]), "moves": float(state["moves"])}  # fmt: skip

    def is_correct(self, result: RewardResult) -> bool:
        return result.components.get("solved", 0.0) >= 1.0

    # ---- prompts and demonstrations ------------------------------------------------------------------------------
    def instruction(self, example: Example) -> str:
        return (
            "You are * in a Sokoban level. Push every box @ onto a goal X (a box on a goal shows $, you on a goal %); "
            "+ is a wall, - is floor. You can push one box at a time and never pull. Each turn, answer with one "
            f"move: L, D, R or U (left, down, right, up).\n{example.question}"
        )

    def plain_prompt(self, example: Example) -> str:
        return f"sokoban\n{example.question}\n"

    def demonstrate(self, example: Example, plan: str | None = None) -> tuple[str, ...]:
        """The solver's moves from the level's start (its generator's plan first), each replaced by a random other
        move with probability ``demo_error_rate`` (seeded by the level), planning again after a slip; stops when
        solved, when no plan is left (the slip lost the level) or at ``demo_max_moves``."""
        cfg = self.cfg
        _, state = self.reset(example, 0)
        rng = random.Random(f"sokoban-demo-{example.uid}")
        moves: list[str] = []
        todo = list(plan if plan is not None else solve(state["board"], state["shape"], cfg.max_depth) or "")
        while todo and len(moves) < cfg.demo_max_moves:
            move = todo.pop(0)
            if rng.random() < cfg.demo_error_rate:
                move = rng.choice([m for m in DELTAS if m != move])
                todo = []
            moves.append(move)
            if self.step(state, move).done:
                break
            if not todo:
                todo = list(solve(state["board"], state["shape"], cfg.max_depth) or "")
        return tuple(moves)

    def reward(self, example: Example, completion: str) -> RewardResult:
        raise NotImplementedError("sokoban is an environment: its episodes are scored turn by turn (step)")
