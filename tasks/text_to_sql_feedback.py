"""Text-to-SQL with execution feedback: Spider questions answered over several turns, the database answering each
exploratory query (an environment task: multi-turn episodes, bench/engine/episode.py).

As SkyRL-SQL runs it (../shared/docs/algorithms-round4.md, "SkyRL (text2sql)"): each turn the policy either explores,
``<sql>QUERY</sql>``, and sees the query's result (its first ``feedback_rows`` rows, cut to ``feedback_chars``
characters) or its error, or answers, ``<solution>QUERY</solution>``, which ends the episode and is scored by
execution match exactly as tasks/text_to_sql.py scores its ```sql block (the same sandbox, limits and gold cache).
A turn with neither tag is told the format. No answer within ``rollout.max_turns`` scores 0.

One literal episode (concert_singer)::

    prompt   the schema and "Question: How many singers do we have?" and the two tags
    turn 1   "<sql>SELECT * FROM singer LIMIT 3</sql>"   ->  "7 columns, 3 rows:\\n(1, 'Joe Sharp', ...)\\n..."
    turn 2   "<solution>SELECT count(*) FROM singer</solution>"   ->  reward 1, done

Every query, exploratory or final, goes through ``run_query``: a read-only, authorizer-guarded connection in a
killable worker with step, time, row and size limits (tasks/text_to_sql.py); a query never writes a file or the
database, and each turn is bounded by one query's limit (plus the gold's, when it answers): ``reward_time_bound_s``.
Only the action's first ``max_query_chars`` + 64 characters are read.
Demonstrations: one exploratory look at the gold query's first table (``SELECT * FROM <table> LIMIT 3``), then the
gold query as the solution. Components: ``matches`` (the score), ``executes``, ``parses``, ``queries`` (exploratory
queries run), ``answered``.

version = "1"
    1: initial version.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlglot import exp

from bench.engine.episode import Turn
from bench.task import Example, RewardResult
from tasks.text_to_sql import FENCE, TextToSQL, TextToSQLConfig, reward, run_query

_TAG = re.compile(r"<(sql|solution)>(.*?)</\1>", re.DOTALL | re.IGNORECASE)


@dataclass
class TextToSQLFeedbackConfig(TextToSQLConfig):
    name: str = "text_to_sql_feedback"
    feedback_rows: int = 5
    """Rows of an exploratory query's result shown to the policy."""
    feedback_chars: int = 400
    """Characters of the result (or error) shown, at most."""


def first_table(sql: str) -> str | None:
    """The first table the gold query reads (sqlglot), for the demonstrator's exploratory look."""
    try:
        tree = sqlglot.parse_one(sql, read="sqlite")
    except (sqlglot.errors.ParseError, sqlglot.errors.TokenError, ValueError):
        return None
    table = next(tree.find_all(exp.Table), None) if tree is not None else None
    return table.name if table is not None and re.fullmatch(r"\w+", table.name) else None


class TextToSQLFeedback(TextToSQL):
    Config = TextToSQLFeedbackConfig
    version = "1"
    description = "Spider text-to-SQL over turns: exploratory read-only queries answered by the database, then one"
    verified_component = None

    def load_split(self, split):
        out = []
        for ex in super().load_split(split):
            table = first_table(ex.answer["query"])
            look = (f"<sql>SELECT * FROM {table} LIMIT 3</sql>",) if table else ()
            demo = (*look, f"<solution>{ex.answer['query'].strip()}</solution>")
            out.append(Example(ex.uid, ex.question, ex.answer, demonstration=demo, data=ex.data))
        return out

    def instruction(self, example: Example) -> str:
        return (
            f"SQLite database {example.data['db_id']}, schema:\n{example.data['schema']}\n\n"
            f"Question: {example.question}\n\n"
            "Each turn, either run a read-only query to look at the data, <sql>QUERY</sql>, and see its result, or "
            "give your final SQLite query, <solution>QUERY</solution>, which ends the conversation."
        )

    def reset(self, example: Example, seed: int) -> tuple[str, Any]:
        return example.question, {"example": example, "queries": 0}

    def step(self, state: dict, action: str) -> Turn:
        m = _TAG.search(action[: self.limits.max_query_chars + 64])
        if m is None:
            return Turn("Answer with <sql>QUERY</sql> to look, or <solution>QUERY</solution> to finish.", 0.0, False,
                        self.components(state, None))  # fmt: skip
        kind, sql = m.group(1).lower(), m.group(2)
        if kind == "solution":
            res = reward(state["example"], f"{FENCE}sql\n{sql}\n{FENCE}", self.limits)
            return Turn("", res.score, True, self.components(state, res))
        state["queries"] += 1
        result = run_query(state["example"].answer["db_path"], sql, self.limits)
        if result.error is not None:
            text = f"error: {result.error}"
        else:
            rows = "\n".join(map(repr, result.rows[: self.cfg.feedback_rows]))
            text = f"{result.columns} columns, {len(result.rows)} rows:\n{rows}"
        return Turn(text[: self.cfg.feedback_chars], 0.0, False, self.components(state, None))

    @staticmethod
    def components(state: dict, res: RewardResult | None) -> dict[str, float]:
        final = res.components if res is not None else {"parses": 0.0, "executes": 0.0, "matches": 0.0}
        return {**final, "queries": float(state["queries"]), "answered": float(res is not None)}

    def is_correct(self, result: RewardResult) -> bool:
        return result.components.get("matches", 0.0) >= 1.0

    def answer_span(self, completion: str) -> tuple[int, int] | None:
        return None

    def segment(self, completion: str) -> list[int] | None:
        return None
