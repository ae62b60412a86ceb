"""Spider text-to-SQL: answer a question about a relational database with one SQLite query.

Reference: Spider 1.0 (Yu et al., 2018, "Spider: A Large-Scale Human-Labeled Dataset for Complex and Cross-Domain
Semantic Parsing and Text-to-SQL Task", EMNLP), scored by execution match as in the test-suite evaluation of Zhong,
Yu and Klein (2020, https://github.com/taoyds/test-suite-sql-eval). Hub dataset ``xlangai/spider`` (questions and
queries only: the hub dataset has no databases, so this task always reads the local copy). One literal record, as
stored in ``<data_root>/text2sql/spider/dev.jsonl``::

    {"db_id": "concert_singer", "question": "How many singers do we have?", "query": "SELECT count(*) FROM singer",
     "gold_executes": true, "gold_nonempty": true, "uses_missing_table": false}

Reward in one sentence: the SQL inside the first ```sql fenced block is executed, under a read-only allow-list
authorizer and step, time, row and size limits, on ``database/<db_id>/<db_id>.sqlite`` and scores 1.0 iff its result
has the gold query's column count and the same multiset of rows (the same row sequence when the gold query has a
top-level ORDER BY), values compared after rounding floats to 12 significant digits; anything else scores 0.0.

version = "1"
    1: initial version (execution match; dev minus the 8 questions on the empty wta_1.rankings table as test; val =
       6 train databases held out whole).

Answer format: a fenced block opened by three backticks and ``sql`` (or ``sqlite``, any case) and closed by three
backticks, e.g. ``"I count the rows.\\n```sql\\nSELECT count(*) FROM singer\\n```"``. Text before the block is free
reasoning; only the FIRST block counts; an unclosed block (a truncated completion) counts as no block.

Splits. test = Spider dev (dev.jsonl), minus the questions flagged ``uses_missing_table`` (8: their gold touches
wta_1.rankings, which is empty in the rebuilt databases, so their gold results are not the real answers). train =
train.jsonl rows whose database file exists (rows on a missing database are skipped and counted in
``TextToSQL.counts``; the shipped train.jsonl already omits baseball_1 and soccer_1, so the count is 0 there), minus
val. val = every train question of the ``val_databases`` train databases with the smallest sha256(db_id): whole
databases are held out, as Spider's own train/dev split is by database. Each split is listed in a fixed order by
sha256 of the uid, so ``num_eval`` (the first N) spans many databases instead of the first two.

Prompts. ``instruction`` (chat models) renders the schema read from the database file itself (``schema_format``:
compact ``table(col, col -> other.col)`` lines, or the CREATE TABLE statements of sqlite_master), capped at
``max_schema_chars`` at a line boundary, then the question and the answer format. ``plain_prompt`` (tokenizers
without a chat template, in practice the tiny character-level model with 256 positions) is ``"<db_id>| <question>"``
cut to ``plain_prompt_chars`` plus a newline: no schema fits there; that model learns table names per database from
the demonstrations. Demonstrations are the gold query in the answer format, verbatim (train queries keep SpiderMan's
MySQL-style `backticks`, which SQLite accepts).

Execution security (model output is hostile input; Spider's own evaluator executes it on a writable connection).
Each query gets a fresh connection opened with ``file:...?mode=ro&immutable=1`` (no journal, WAL or lock files),
``isolation_level=None`` (Python issues no implicit BEGIN) and:
  - an authorizer allow-list: SELECT, READ, RECURSIVE (for WITH RECURSIVE) and FUNCTION except DENIED_FUNCTIONS;
    everything else (ATTACH, DETACH, every write, CREATE, PRAGMA, TRANSACTION, ANALYZE, ...) is denied. VACUUM INTO
    and ATTACH would otherwise create files even on a read-only connection; both start with an ATTACH action;
  - ``enable_load_extension(False)``, and SQLITE_LIMIT_ATTACHED = 0;
  - a progress handler that stops the statement after ``max_vm_steps`` virtual-machine steps (deterministic, so the
    reward is a function of its input) or at the ``timeout_s`` wall-clock deadline (backstop for slow steps);
  - execution in a killable worker process (bench/sqlite_sandbox.py): a function that loops inside one VM instruction
    (``printf('%.*c', 2147483647, 'x')``) is killed at ``timeout_s`` + KILL_GRACE_S, a hard wall-clock bound; the
    worker keeps temporary storage in memory under a heap limit and may not write a byte to disk (RLIMIT_FSIZE 0);
  - SQLITE_LIMIT_LENGTH = ``max_value_bytes`` (bounds every string, blob and record), COLUMN = MAX_COLUMNS,
    LIKE_PATTERN_LENGTH = MAX_LIKE_PATTERN (one LIKE call is one uninterruptible VM step), WORKER_THREADS = 0; rows
    are fetched one at a time, up to ``max_rows`` rows and MAX_RESULT_CHARS characters;
  - before execution: at most ``max_query_chars`` characters, parentheses nested at most MAX_PAREN_DEPTH deep, and
    the first keyword (after comments and parentheses) is SELECT, WITH or VALUES; Python's sqlite3 refuses a second
    statement after the first (``SELECT 1; DROP TABLE singer`` raises before anything runs).
A result over ``max_rows`` rows scores 0 (not truncated): gold results are held to the same cap (an example whose
gold exceeds it is unscorable, scored 0 and flagged in ``info``), so such a prediction cannot match anyway and the
cap never changes a score. The largest Spider gold result has 20,662 rows and the costliest ~8.1M VM steps.

Components: ``parses`` (sqlglot, dialect sqlite, parses the block as exactly one SELECT-type query: diagnostic, it
does not gate execution), ``executes`` (ran to completion within the limits), ``matches`` (= score).

Deviations from the reference (test-suite-sql-eval ``exec_eval.py``), per docs/field-notes.md "Rewards":
``# NOTE(deviation)`` columns are compared in the order written (the reference also accepts a column permutation);
two empty results match only with the same column count (the reference matches any two empty results); floats are
rounded to FLOAT_DIGITS significant digits (the reference compares exactly, so ``avg(x)`` and ``sum(x)/count(*)``
differing in the last bit mismatch); "ordered" means a top-level ORDER BY in the gold AST (the reference searches the
gold text for "order by", which also fires on subqueries); the random()/randomblob() functions are denied so the
reward stays deterministic.
"""

from __future__ import annotations

import hashlib
import logging
import re
import sqlite3
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import sqlglot
from sqlglot import exp
from sqlglot.tokens import TokenType

from bench.sqlite_sandbox import (
    DEFAULT_LIMITS,
    KILL_GRACE_S,
    Limits,
    QueryResult,
    open_readonly,  # noqa: F401 (re-exported for callers of this task)
    uri_quote,
)
from bench.sqlite_sandbox import run as sandbox_run
from bench.task import Example, RewardResult, Split, Task, TaskConfig, read_jsonl

# ---- answer extraction --------------------------------------------------------------------------------------------

FENCE = "```"
# An opening fence: three backticks, optional blanks, the language tag sql or sqlite (any case), then whitespace.
# "```sql```" (no whitespace after the tag) is not an opening fence.
_OPEN_FENCE = re.compile(r"```[ \t]*(?:sqlite|sql)(?=\s)", re.IGNORECASE)


def sql_block_span(completion: str) -> tuple[int, int] | None:
    """[start, end) of the stripped text inside the first complete ```sql block, or None (no block, unclosed block,
    or an empty one). Linear time: one regex search for the opening fence, one str.find for the closing one."""
    m = _OPEN_FENCE.search(completion)
    if m is None:
        return None
    close = completion.find(FENCE, m.end())
    if close < 0:
        return None
    start, end = m.end(), close
    while start < end and completion[start].isspace():
        start += 1
    while end > start and completion[end - 1].isspace():
        end -= 1
    return (start, end) if end > start else None


def extract_sql(completion: str) -> str | None:
    """The SQL inside the first complete ```sql block (stripped), or None."""
    span = sql_block_span(completion)
    return None if span is None else completion[span[0] : span[1]]


# ---- static checks ------------------------------------------------------------------------------------------------

MAX_PAREN_DEPTH = 64
"""Deeper nesting is rejected before sqlglot (a recursive-descent parser) or SQLite sees it; Spider golds nest <= 4."""

# Leading blanks, comments and opening parentheses, skipped before the first keyword. The alternatives start with
# different characters, so the repetition cannot backtrack catastrophically; an unclosed /* stops the skip.
_LEADING = re.compile(r"(?:\s+|--[^\n]*|/\*.*?\*/|\()*", re.DOTALL)
_FIRST_KEYWORD = re.compile(r"(?:select|with|values)\b", re.IGNORECASE)


def paren_depth(sql: str) -> int:
    """Deepest parenthesis nesting (ignoring quoting: an over-estimate is harmless, it only rejects)."""
    depth = deepest = 0
    for ch in sql:
        if ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth -= 1
    return deepest


def starts_like_query(sql: str) -> bool:
    """True when the first keyword after comments and parentheses is SELECT, WITH or VALUES. Defence in depth only:
    the authorizer is what keeps writes out (``WITH x AS (...) DELETE ...`` passes this check and is denied there)."""
    rest = sql[_LEADING.match(sql).end() :]
    return _FIRST_KEYWORD.match(rest) is not None


def parse_one(sql: str) -> exp.Expression | None:
    """sqlglot's AST (dialect sqlite) when ``sql`` is exactly one statement, else None. Never raises."""
    if paren_depth(sql) > MAX_PAREN_DEPTH:
        return None
    try:
        trees = [t for t in sqlglot.parse(sql, read="sqlite") if t is not None]
    except Exception:  # noqa: BLE001 - a third-party parser on hostile text: any failure means "does not parse"
        return None
    return trees[0] if len(trees) == 1 else None


def parses_as_select(sql: str) -> bool:
    """The ``parses`` component: sqlglot reads exactly one statement and it is a query (SELECT, UNION/INTERSECT/
    EXCEPT of SELECTs, a parenthesised SELECT, optionally with a WITH clause). Text whose first keyword is not
    SELECT/WITH/VALUES cannot be one and is not handed to sqlglot."""
    return starts_like_query(sql) and isinstance(parse_one(sql), exp.Query)


class _DropCommandFallback(logging.Filter):
    """sqlglot logs a warning for every statement it cannot parse and keeps as a raw Command ("... contains
    unsupported syntax. Falling back to parsing as a 'Command'."): on model output that would flood training logs."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Falling back to parsing as a 'Command'" not in record.getMessage()


logging.getLogger("sqlglot").addFilter(_DropCommandFallback())


_ORDER_BY_TEXT = re.compile(r"\border\s+by\b", re.IGNORECASE)


def is_ordered(gold_sql: str) -> bool:
    """Whether the gold query's result order is defined: a top-level ORDER BY on the root query (Select or set
    operation, with or without WITH; ORDER BY inside a subquery does not order the output). Falls back to searching
    the text for "order by" (test-suite-sql-eval's rule) when sqlglot cannot parse the gold."""
    tree = parse_one(gold_sql)
    if tree is None:
        return _ORDER_BY_TEXT.search(gold_sql) is not None
    while isinstance(tree, exp.Subquery) and not tree.args.get("order"):
        tree = tree.this
    return bool(tree.args.get("order"))


# ---- sandboxed execution ------------------------------------------------------------------------------------------


def strip_empty_statements(sql: str) -> str:
    """``sql`` without the empty statements at its end: ``SELECT 1;;`` and ``SELECT 1 ; ;`` are one statement (SQLite
    refuses a second one, even empty). Anything after the first statement that is not empty stays and is refused.
    Linear time (no regex that could backtrack over a long run of blanks)."""
    end = len(sql)
    while end and (sql[end - 1].isspace() or sql[end - 1] == ";"):
        end -= 1
    return sql[:end]


def run_query(db_path: str | Path, sql: str, limits: Limits = DEFAULT_LIMITS) -> QueryResult:
    """Execute one statement in the sandbox (bench/sqlite_sandbox.py: a killable worker process, so the time limit
    holds for any query) and return its normalised rows, or the reason it failed. Never raises on hostile SQL.
    Trailing empty statements (``;;``) are dropped first."""
    sql = strip_empty_statements(sql)
    if len(sql) > limits.max_query_chars:
        return QueryResult(error=f"query longer than {limits.max_query_chars} chars")
    if paren_depth(sql) > MAX_PAREN_DEPTH:
        return QueryResult(error=f"parentheses nested deeper than {MAX_PAREN_DEPTH}")
    if not starts_like_query(sql):
        return QueryResult(error="not a SELECT/WITH/VALUES statement")
    return sandbox_run(db_path, sql, limits)


@dataclass(frozen=True)
class GoldResult:
    result: QueryResult
    ordered: bool


_GOLD_CACHE: dict[tuple[str, str, Limits], GoldResult] = {}
_GOLD_LOCK = threading.Lock()
GOLD_CACHE_SIZE = 20_000
"""Entries kept (Spider dev + train is ~7.7k distinct queries); the cache is cleared when it would overflow."""


GOLD_ATTEMPTS = 2
"""A gold query whose failure may not recur (a wall-clock timeout on a loaded machine, a crashed worker) is run again
up to this many times in all; a failure that remains is returned but not cached, so a later call tries again."""


def gold_result(db_path: str | Path, gold_sql: str, limits: Limits = DEFAULT_LIMITS) -> GoldResult:
    """The gold query's result under the same limits, cached in-process per (database, query, limits). Results and
    deterministic failures (SQL errors, the step budget, the row cap) are cached; transient ones are retried, never
    cached (one crash must not make an example score 0, even for its gold, for the rest of the process)."""
    key = (str(db_path), gold_sql, limits)
    hit = _GOLD_CACHE.get(key)
    if hit is not None:
        return hit
    for _ in range(GOLD_ATTEMPTS):
        result = run_query(db_path, gold_sql, limits)
        if not result.transient:
            break
    value = GoldResult(result, is_ordered(gold_sql))
    if result.transient:
        return value
    with _GOLD_LOCK:
        if len(_GOLD_CACHE) >= GOLD_CACHE_SIZE:
            _GOLD_CACHE.clear()
        _GOLD_CACHE[key] = value
    return value


def results_match(pred: QueryResult, gold: QueryResult, ordered: bool) -> bool:
    """Same column count and the same rows: as sequences when ``ordered``, else as multisets (collections.Counter)."""
    # NOTE(deviation): the column count is compared even when both results are empty (the reference accepts any two
    # empty results), and columns are matched in order (the reference also tries column permutations).
    if pred.error is not None or gold.error is not None or pred.columns != gold.columns:
        return False
    if len(pred.rows) != len(gold.rows):
        return False
    if ordered:
        return pred.rows == gold.rows
    return Counter(pred.rows) == Counter(gold.rows)


# ---- reward -------------------------------------------------------------------------------------------------------


def reward_time_bound_s(limits: Limits = DEFAULT_LIMITS) -> float:
    """Wall seconds one ``reward`` call may take on any completion, with warm workers: the predicted query once and
    (uncached) the gold up to GOLD_ATTEMPTS times, each killed after ``timeout_s`` + KILL_GRACE_S, plus parsing."""
    return (1 + GOLD_ATTEMPTS) * (limits.timeout_s + KILL_GRACE_S) + 0.5


def reward(example: Example, completion: str, limits: Limits = DEFAULT_LIMITS) -> RewardResult:
    """1.0 iff the first ```sql block executes in the sandbox to the gold result (see the module docstring).

    ``example.answer`` is ``{"db_id", "db_path", "query"}``. Components: ``parses``, ``executes``, ``matches``
    (= score). ``info``: ``reason``, ``sql`` (first 500 chars), ``ordered``, ``gold_rows``, ``pred_rows``, and
    ``unscorable`` (the gold itself failed under the limits). Never raises on model output.
    """
    db_path, gold_sql = example.answer["db_path"], example.answer["query"]

    def result(reason: str, sql: str | None, parses: float = 0.0, executes: float = 0.0, matches: float = 0.0, **kw):
        info = {"reason": reason, "sql": None if sql is None else sql[:500], **kw}
        return RewardResult(matches, {"parses": parses, "executes": executes, "matches": matches}, info)

    sql = extract_sql(completion)
    if sql is None:
        return result("no complete ```sql block", None)
    if len(sql) > limits.max_query_chars:
        return result(f"query longer than {limits.max_query_chars} chars", sql)
    parses = float(parses_as_select(sql))
    pred = run_query(db_path, sql, limits)
    gold = gold_result(db_path, gold_sql, limits)
    extra = {"ordered": gold.ordered, "gold_rows": len(gold.result.rows), "pred_rows": len(pred.rows)}
    if gold.result.error is not None:
        return result(f"gold query failed: {gold.result.error}", sql, parses, float(pred.error is None), **extra,
                      unscorable=True)  # fmt: skip
    if pred.error is not None:
        return result(pred.error, sql, parses, **extra)
    matches = float(results_match(pred, gold.result, gold.ordered))
    if matches:
        reason = "ok"
    elif pred.columns != gold.result.columns:
        reason = f"{pred.columns} columns, gold has {gold.result.columns}"
    elif gold.ordered and Counter(pred.rows) == Counter(gold.result.rows):
        reason = "right rows in the wrong order"
    else:
        reason = "different rows"
    return result(reason, sql, parses, 1.0, matches, **extra)


# ---- segments -----------------------------------------------------------------------------------------------------

_CLAUSE_TOKENS = frozenset(
    {
        TokenType.WITH,
        TokenType.SELECT,
        TokenType.FROM,
        TokenType.JOIN,
        TokenType.WHERE,
        TokenType.GROUP_BY,
        TokenType.HAVING,
        TokenType.ORDER_BY,
        TokenType.LIMIT,
        TokenType.UNION,
        TokenType.INTERSECT,
        TokenType.EXCEPT,
    }
)
# Tokens that belong to the JOIN clause that follows them (LEFT OUTER JOIN starts at LEFT).
_JOIN_PREFIX = frozenset(
    {TokenType.LEFT, TokenType.RIGHT, TokenType.INNER, TokenType.OUTER, TokenType.CROSS, TokenType.FULL,
     TokenType.NATURAL}
)  # fmt: skip
_CLAUSE_RE = re.compile(
    r"\b(?:with|select|from|(?:(?:natural|left|right|full|inner|outer|cross)\s+)*join|where|group\s+by|having|"
    r"order\s+by|limit|union|intersect|except)\b",
    re.IGNORECASE,
)


def clause_starts(sql: str) -> list[int]:
    """Offsets in ``sql`` where a clause keyword starts: sqlglot's tokenizer (which skips string literals and quoted
    names), or a keyword regex when the text does not tokenize or is over the default query cap."""
    if len(sql) <= DEFAULT_LIMITS.max_query_chars:
        try:
            tokens = sqlglot.tokenize(sql, read="sqlite")
        except Exception:  # noqa: BLE001 - hostile text; fall back to the regex
            tokens = None
        if tokens is not None:
            starts, prefix = [], None
            for tok in tokens:
                if tok.token_type in _JOIN_PREFIX:
                    prefix = tok.start if prefix is None else prefix
                    continue
                if tok.token_type in _CLAUSE_TOKENS:
                    starts.append(prefix if tok.token_type == TokenType.JOIN and prefix is not None else tok.start)
                prefix = None
            return starts
    return [m.start() for m in _CLAUSE_RE.finditer(sql)]


def segment(completion: str) -> list[int]:
    """Segment starts: 0 (the reasoning before the block, with the opening fence), each SQL clause inside the first
    ```sql block, and the closing fence with whatever follows. Without a block the completion is one segment."""
    span = sql_block_span(completion)
    if span is None:
        return [0]
    start, end = span
    offsets = {0, *(start + s for s in clause_starts(completion[start:end]))}
    if end < len(completion):
        offsets.add(end)
    return sorted(o for o in offsets if 0 <= o < len(completion))


# ---- schema -------------------------------------------------------------------------------------------------------

_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _quote(name: str) -> str:
    return name if _PLAIN_NAME.fullmatch(name) else '"' + name.replace('"', '""') + '"'


def render_schema(db_path: str | Path, fmt: str = "compact", max_chars: int = 4000) -> str:
    """The schema of a database file, one table per line (compact: ``table(col, col -> other.col)``) or as its
    CREATE TABLE statements (create), cut at a line boundary to ``max_chars`` with a note of what was left out."""
    conn = sqlite3.connect(f"file:{uri_quote(str(Path(db_path).resolve()))}?mode=ro&immutable=1", uri=True)
    try:
        tables = conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY rowid"
        ).fetchall()
        blocks = []
        for name, create in tables:
            if fmt == "create":
                blocks.append((create or "").strip() + ";")
                continue
            qn = name.replace('"', '""')
            fks = {r[3]: f"{r[2]}.{r[4] or r[3]}" for r in conn.execute(f'PRAGMA foreign_key_list("{qn}")')}
            cols = [
                _quote(c[1]) + (f" -> {fks[c[1]]}" if c[1] in fks else "")
                for c in conn.execute(f'PRAGMA table_info("{qn}")')
            ]
            blocks.append(f"{_quote(name)}({', '.join(cols)})")
    finally:
        conn.close()
    out, used = [], 0
    for i, block in enumerate(blocks):
        if used + len(block) + 1 > max_chars:
            out.append(f"-- ... {len(blocks) - i} more tables not shown")
            break
        out.append(block)
        used += len(block) + 1
    return "\n".join(out)


# ---- data ---------------------------------------------------------------------------------------------------------


def _order_key(uid: str) -> str:
    return hashlib.sha256(uid.encode()).hexdigest()


def demonstration(query: str) -> str:
    return f"{FENCE}sql\n{query.strip()}\n{FENCE}"


def make_example(uid: str, rec: dict, db_path: Path | str, schema: str = "") -> Example:
    """An Example from a dev/train record; ``answer`` is what ``reward`` reads."""
    return Example(
        uid=uid,
        question=rec["question"],
        answer={"db_id": rec["db_id"], "db_path": str(db_path), "query": rec["query"]},
        demonstration=demonstration(rec["query"]),
        data={"db_id": rec["db_id"], "schema": schema, "gold_nonempty": rec.get("gold_nonempty")},
    )


@dataclass
class TextToSQLConfig(TaskConfig):
    name: str = "text_to_sql"
    """Registry name of the task."""
    schema_format: Literal["compact", "create"] = "compact"
    """How the prompt shows the schema: "compact" (``table(col, col -> other.col)`` per line; the largest Spider
    schema is ~2.5k chars) or "create" (CREATE TABLE statements from sqlite_master; up to ~6.8k chars)."""
    max_schema_chars: int = 4000
    """Schema text is cut at a line boundary to this many characters (a note says how many tables are left out)."""
    val_databases: int = 6
    """Train databases held out whole as the val split (those with the smallest sha256(db_id); 6 -> 351 questions)."""
    train_nonempty_only: bool = False
    """Drop train questions whose gold result is empty (151 rows): on them any empty query with the right column
    count scores 1. Off by default, as in Spider."""
    plain_prompt_chars: int = 96
    """``plain_prompt`` is ``"<db_id>| <question>"`` cut to this many characters (the tiny model has 256 positions)."""
    timeout_s: float = 2.0
    """Wall-clock limit per query execution (backstop; the step budget normally stops a runaway query first)."""
    max_vm_steps: int = 50_000_000
    """SQLite virtual-machine steps per query (deterministic limit; the costliest Spider gold needs ~8.1M, ~0.06 s)."""
    max_rows: int = 50_000
    """A result with more rows scores 0 (the largest Spider gold result has 20,662 rows)."""
    max_query_chars: int = 20_000
    """A longer SQL block scores 0 without being parsed or run (the longest Spider gold is 677 chars)."""
    max_value_bytes: int = 100_000
    """SQLITE_LIMIT_LENGTH: the longest string, blob or row a query may build (Spider values are <= 213 chars)."""

    def __post_init__(self) -> None:
        for field_name in ("max_schema_chars", "plain_prompt_chars", "max_vm_steps", "max_rows", "max_query_chars"):
            if getattr(self, field_name) < 1:
                raise ValueError(f"{field_name} must be >= 1, got {getattr(self, field_name)}")
        if self.val_databases < 1:
            raise ValueError(f"val_databases must be >= 1, got {self.val_databases}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.max_value_bytes < 1000:
            raise ValueError(f"max_value_bytes must be >= 1000, got {self.max_value_bytes}")


class TextToSQL(Task):
    Config = TextToSQLConfig
    version = "1"
    description = "Spider text-to-SQL: one SQLite query per question, scored by sandboxed execution match."
    verified_component = "executes"
    hub_dataset = None
    """No hub fallback: the hub's xlangai/spider has the questions but not the SQLite databases the reward runs on."""

    cfg: TextToSQLConfig

    def __init__(self, cfg: TextToSQLConfig, tokenizer=None, **kwargs) -> None:
        super().__init__(cfg, tokenizer, **kwargs)
        self.limits = Limits(cfg.timeout_s, cfg.max_vm_steps, cfg.max_rows, cfg.max_query_chars, cfg.max_value_bytes)
        self.counts: dict[str, int] = {}
        """What loading kept and dropped: dev_rows, dev_uses_missing_table, train_rows, train_missing_db,
        train_empty_gold_dropped, train, val, test."""
        self._loaded: dict[str, list[Example]] | None = None

    # NOTE: the hub dataset xlangai/spider has questions and queries but no databases, and the reward needs the
    # databases, so there is no hub fallback: a missing data root is the standard FileNotFoundError.
    def _load(self) -> dict[str, list[Example]]:
        dev_file = self.data_file("text2sql", "spider", "dev.jsonl")
        train_file = self.data_file("text2sql", "spider", "train.jsonl")
        db_dir = self.data_file("text2sql", "spider", "database")
        schemas: dict[str, str | None] = {}

        def db_and_schema(db_id: str) -> tuple[Path, str | None]:
            path = db_dir / db_id / f"{db_id}.sqlite"
            if db_id not in schemas:
                ok = re.fullmatch(r"[A-Za-z0-9_]+", db_id) and path.is_file()
                schemas[db_id] = render_schema(path, self.cfg.schema_format, self.cfg.max_schema_chars) if ok else None
            return path, schemas[db_id]

        counts = dict.fromkeys(("dev_rows", "dev_uses_missing_table", "train_rows", "train_missing_db"), 0)
        counts["train_empty_gold_dropped"] = 0
        test = []
        for i, rec in enumerate(read_jsonl(dev_file, ("db_id", "question", "query"))):
            counts["dev_rows"] += 1
            if rec.get("uses_missing_table"):
                counts["dev_uses_missing_table"] += 1
                continue
            path, schema = db_and_schema(rec["db_id"])
            if schema is None:
                raise FileNotFoundError(f"dev.jsonl row {i} needs the database {path}, which does not exist")
            test.append(make_example(f"spider-dev-{i}", rec, path, schema))
        train_all = []
        for i, rec in enumerate(read_jsonl(train_file, ("db_id", "question", "query"))):
            counts["train_rows"] += 1
            path, schema = db_and_schema(rec["db_id"])
            if schema is None:
                counts["train_missing_db"] += 1
                continue
            if self.cfg.train_nonempty_only and rec.get("gold_nonempty") is False:
                counts["train_empty_gold_dropped"] += 1
                continue
            train_all.append(make_example(f"spider-train-{i}", rec, path, schema))
        train_dbs = sorted({e.answer["db_id"] for e in train_all}, key=lambda d: hashlib.sha256(d.encode()).digest())
        val_dbs = set(train_dbs[: self.cfg.val_databases])
        splits = {
            "train": [e for e in train_all if e.answer["db_id"] not in val_dbs],
            "val": [e for e in train_all if e.answer["db_id"] in val_dbs],
            "test": test,
        }
        for name, exs in splits.items():
            exs.sort(key=lambda e: _order_key(e.uid))
            counts[name] = len(exs)
        self.counts = counts
        return splits

    def load_split(self, split: Split) -> list[Example]:
        if self._loaded is None:
            self._loaded = self._load()
        return list(self._loaded[split])

    def instruction(self, example: Example) -> str:
        return (
            f"SQLite database {example.data['db_id']}, schema:\n{example.data['schema']}\n\n"
            f"Question: {example.question}\n\n"
            "Write one SQLite SELECT query that answers the question. You may think first; give the final query in "
            "a ```sql code block."
        )

    def plain_prompt(self, example: Example) -> str:
        return f"{example.data['db_id']}| {example.question}"[: self.cfg.plain_prompt_chars] + "\n"

    def reward_time_bound_s(self) -> float:
        return reward_time_bound_s(self.limits)

    def reward(self, example: Example, completion: str) -> RewardResult:
        return reward(example, completion, self.limits)

    def answer_span(self, completion: str) -> tuple[int, int] | None:
        return sql_block_span(completion)

    def segment(self, completion: str) -> list[int] | None:
        return segment(completion)
