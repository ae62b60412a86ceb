"""FrozenLake: walk a text grid to the goal, one move a turn (an environment task: multi-turn episodes).

Gymnasium's ``FrozenLake`` (its own dynamics, its ``generate_random_map``, slippery off or on), as RAGEN and GiGPO
use it: the policy sees the grid, answers one move, sees the new grid, ... until it reaches the goal (reward 1),
falls in a hole (0) or runs out of turns (``rollout.max_turns``, the horizon knob beside ``task.size``). One reward at
the end of up to ``max_turns`` decisions: which turn earned it is the credit-over-turns question.

One literal episode (size 3, no slip), prompt and turns for the character-level tiny model::

    prompt  "lake\\nPFF\\nFHF\\nFFG\\n"                        (P: you, F: ice, H: hole, G: goal)
    turn 1  action "R"   ->  observation "SPF\\nFHF\\nFFG"       reward 0
    turn 2  action "R"   ->  observation "SFP\\nFHF\\nFFG"       reward 0
    turn 3  action "D"   ->  ...                               turn 4 "D": at the goal, reward 1, done

The grid is gymnasium's ANSI render with its colour codes stripped and the highlighted cell written ``P``. A move
is the first whole word L, D, R, U (or left, down, right, up) in the action's first ``MAX_SCAN_CHARS`` characters,
case ignored ("jump" is no move); anything else is an invalid move: the player stays, the next observation says
so, and ``invalid`` counts it. Nothing in an action is evaluated; the environment reads only that bounded prefix.

Rewards: ``reward=goal`` (the default) 1 on the turn that reaches G, else 0. ``reward=shaped`` is the process-style
oracle: each turn earns (d(s) − d(s')) / d(s₀), d the shortest-path distance to G avoiding holes (a hole counts as no
progress), so an episode's return is the fraction of the way covered and 1 exactly when it reaches G. Components:
``goal`` (reached G), ``hole``, ``invalid`` (invalid moves), ``moves``.

Demonstrations (the SFT warm start) come from the shortest-path solver with an **error-rate knob**, as the chain
probe's: on a hash-chosen share ``demo_error_rate`` of the cells (the same cells on every map) the demonstrator is
unreliable and takes the cell's fixed wrong move with probability ``demo_error_strength``. The warm start then errs
greedily on those cells (a detour, a loop or a hole), keeps some mass on the right move, and RL must find which
turn's move cost the episode. A demonstration is
the whole episode, its actions trained and its observations only read (``Task.collate_demonstrations``).

Data: maps drawn by ``generate_random_map(size, p_frozen, seed)`` (a path to G always exists), one per map seed;
train and test are disjoint sets of seeds (a hash of the seed), the evaluation set fixed per (size, p_frozen,
slippery).

version = "1"
    1: initial version.
"""

from __future__ import annotations

import random
import re
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv, generate_random_map

from bench.engine.episode import Turn
from bench.task import Example, RewardResult, Split, Task, TaskConfig, hash_unit

MAX_SCAN_CHARS = 64
"""Only this prefix of an action is read."""

MOVES = {"l": 0, "d": 1, "r": 2, "u": 3}  # gymnasium's action ids: LEFT, DOWN, RIGHT, UP
WORDS = {"left": "l", "down": "d", "right": "r", "up": "u"}
NAMES = "LDRU"
_MOVE = re.compile(r"\b(?:left|down|right|up|[ldru])\b", re.IGNORECASE)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class FrozenLakeConfig(TaskConfig):
    name: str = "frozen_lake"
    size: int = 4
    """The map's side (gymnasium's generate_random_map ``size``)."""
    p_frozen: float = 0.8
    """Probability that a cell is ice rather than a hole (``generate_random_map``'s p)."""
    slippery: bool = False
    """Gymnasium's is_slippery: the move goes where intended w.p. 1/3, to either side w.p. 1/3 each."""
    reward: Literal["goal", "shaped"] = "goal"
    """goal: 1 on reaching G; shaped: the distance-progress oracle (the module docstring)."""
    demo_error_rate: float = 0.0
    """Share of the cells (hash-chosen, the same on every map) where the demonstrator is unreliable."""
    demo_error_strength: float = 0.7
    """Probability that the demonstrator takes the cell's fixed wrong move on an unreliable cell (> 0.5: the warm
    start's greedy move there is wrong, with some mass left on the right one)."""
    demo_max_moves: int | None = None
    """The demonstrator stops after this many moves (None: 3·size, room for a detour on a winding path)."""
    num_maps: int = 4000
    """Map seeds 0 .. num_maps − 1, split between train and test by a hash of the seed."""
    test_share: float = 0.1
    num_eval: int = 200


def move_of(action: str) -> int | None:
    """Gymnasium's action id of the first move named in the action's bounded prefix, or None."""
    m = _MOVE.search(action[:MAX_SCAN_CHARS])
    if m is None:
        return None
    word = m.group(0).lower()
    return MOVES[WORDS.get(word, word)]


def distances(desc: list[str]) -> dict[int, int]:
    """Shortest-path distance to G from every cell that reaches it without entering a hole (BFS from G)."""
    n = len(desc)
    goal = next(r * n + c for r in range(n) for c in range(n) if desc[r][c] == "G")
    dist, queue = {goal: 0}, deque([goal])
    while queue:
        s = queue.popleft()
        r, c = divmod(s, n)
        for dr, dc in ((0, -1), (1, 0), (0, 1), (-1, 0)):
            rr, cc = r + dr, c + dc
            if 0 <= rr < n and 0 <= cc < n and desc[rr][cc] != "H" and rr * n + cc not in dist:
                dist[rr * n + cc] = dist[s] + 1
                queue.append(rr * n + cc)
    return dist


def unreliable(s: int, size: int, rate: float) -> bool:
    """Whether the demonstrator is unreliable on cell ``s`` of a ``size`` map: a stable hash-chosen share ``rate`` of
    the cells, the same on every map (as chain's unreliable letters), so the warm start learns a wrong habit there."""
    return hash_unit("lake-unreliable", size, s) < rate


def wrong_move(s: int, size: int, right: int) -> int:
    """The demonstrator's fixed wrong move on an unreliable cell: a hash-chosen direction, never ``right``."""
    a = int(hash_unit("lake-wrong", size, s) * 4)
    return a if a != right else (a + 1) % 4


def solver_move(desc: list[str], s: int, dist: dict[int, int]) -> int:
    """The move along a shortest path from cell ``s`` (the first of L, D, R, U that is one)."""
    n = len(desc)
    r, c = divmod(s, n)
    best, move = None, 1
    for a, (dr, dc) in enumerate(((0, -1), (1, 0), (0, 1), (-1, 0))):
        rr, cc = min(max(r + dr, 0), n - 1), min(max(c + dc, 0), n - 1)
        d = dist.get(rr * n + cc)
        if d is not None and (best is None or d < best):
            best, move = d, a
    return move


class FrozenLake(Task):
    Config = FrozenLakeConfig
    version = "1"
    description = "gymnasium FrozenLake as a text grid, one move a turn, reward 1 at the goal (multi-turn)"
    scan = ("head", MAX_SCAN_CHARS)
    rl_only = ("reward",)

    def load_split(self, split: Split) -> list[Example]:
        cfg = self.cfg
        want_test = split != "train"
        out = []
        for seed in range(cfg.num_maps):
            if (hash_unit("frozen_lake", seed) < cfg.test_share) != want_test:
                continue
            desc = generate_random_map(size=cfg.size, p=cfg.p_frozen, seed=seed)
            ex = Example(uid=f"lake-{cfg.size}-{seed}", question=self.grid(desc, 0), answer=tuple(desc))
            out.append(Example(ex.uid, ex.question, ex.answer, demonstration=self.demonstrate(ex)))
        return out

    # ---- the environment -----------------------------------------------------------------------------------------
    def make_env(self, example: Example) -> FrozenLakeEnv:
        return FrozenLakeEnv(desc=list(example.answer), is_slippery=self.cfg.slippery, render_mode="ansi")

    @staticmethod
    def grid(desc, s: int) -> str:
        """The map with the player's cell written P."""
        n = len(desc)
        rows = [list(row) for row in desc]
        rows[s // n][s % n] = "P"
        return "\n".join("".join(r) for r in rows)

    @staticmethod
    def render(env: FrozenLakeEnv) -> str:
        """Gymnasium's ANSI render, its highlight made a P and its colour codes and move header stripped."""
        text = re.sub(r"\x1b\[41m(.)\x1b\[0m", "P", env.render())
        lines = [ln for ln in _ANSI.sub("", text).splitlines() if ln and not ln.startswith("  (")]
        return "\n".join(lines)

    def reset(self, example: Example, seed: int) -> tuple[str, Any]:
        env = self.make_env(example)
        s, _ = env.reset(seed=seed)
        dist = distances(list(example.answer))
        state = {"env": env, "s": int(s), "dist": dist, "d0": dist[int(s)], "invalid": 0, "moves": 0}
        return self.render(env), state

    def step(self, state: dict, action: str) -> Turn:
        a = move_of(action)
        state["moves"] += 1
        if a is None:
            state["invalid"] += 1
            return Turn("Invalid move: answer L, D, R or U.\n" + self.render(state["env"]), 0.0, False,
                        self.components(state, goal=False, hole=False))  # fmt: skip
        s_before = state["s"]
        s, r, terminated, truncated, _ = state["env"].step(a)
        state["s"] = int(s)
        goal = bool(terminated and r > 0)
        hole = bool(terminated and not goal)
        if self.cfg.reward == "shaped":
            d = state["dist"]
            after = d[s_before] if hole else d.get(state["s"], d[s_before])
            reward = (d[s_before] - after) / max(state["d0"], 1)
        else:
            reward = float(goal)
        return Turn(self.render(state["env"]), reward, bool(terminated or truncated),
                    self.components(state, goal=goal, hole=hole))  # fmt: skip

    @staticmethod
    def components(state: dict, *, goal: bool, hole: bool) -> dict[str, float]:
        return {"goal": float(goal), "hole": float(hole), "invalid": float(state["invalid"]),
                "moves": float(state["moves"])}  # fmt: skip

    def is_correct(self, result: RewardResult) -> bool:
        return result.components.get("goal", 0.0) >= 1.0

    # ---- prompts and demonstrations ------------------------------------------------------------------------------
    def instruction(self, example: Example) -> str:
        return (
            "You are P on a frozen lake. Reach G without stepping on a hole H (F is safe ice). Each turn, answer "
            f"with one move: L, D, R or U (left, down, right, up).\n{example.question}"
        )

    def plain_prompt(self, example: Example) -> str:
        return f"lake\n{example.question}\n"

    def demonstrate(self, example: Example) -> tuple[str, ...]:
        """The demonstrator's moves through the episode (reset with seed 0): the solver's, except on its unreliable
        cells (``unreliable``), where it takes the cell's fixed wrong move with probability ``demo_error_strength``
        (one draw per visit, seeded by the map); stops at the goal, a hole or ``demo_max_moves`` moves (an
        unreliable demonstrator can bounce between two cells)."""
        _, state = self.reset(example, 0)
        desc, n = list(example.answer), self.cfg.size
        rng = random.Random(f"lake-demo-{example.uid}")
        moves = []
        for _ in range(self.cfg.demo_max_moves or 3 * n):
            s = state["s"]
            a = solver_move(desc, s, state["dist"])
            if unreliable(s, n, self.cfg.demo_error_rate) and rng.random() < self.cfg.demo_error_strength:
                a = wrong_move(s, n, a)
            moves.append(NAMES[a])
            if self.step(state, NAMES[a]).done:
                break
        return tuple(moves)

    def reward(self, example: Example, completion: str) -> RewardResult:
        raise NotImplementedError("frozen_lake is an environment: its episodes are scored turn by turn (step)")
