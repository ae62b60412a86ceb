"""Spider text-to-SQL: hostile-SQL sandbox, execution-match reward table, ordered/unordered comparison, spans and
segments, data loading and gold self-match on the real databases."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.sqlite_sandbox import KILL_GRACE_S
from tasks.text_to_sql import (
    DEFAULT_LIMITS,
    Limits,
    TextToSQL,
    TextToSQLConfig,
    clause_starts,
    demonstration,
    extract_sql,
    gold_result,
    is_ordered,
    make_example,
    open_readonly,
    render_schema,
    reward,
    reward_time_bound_s,
    run_query,
    segment,
    sql_block_span,
)
from tests.conftest import data_root as conftest_data_root

SINGERS = [
    (1, "Joe Sharp", "Netherlands", 52, 1.1),
    (2, "Timbaland", "United States", 32, 2.2),
    (3, "Justin Brown", "France", 29, 3.3),
    (4, "Rose White", "France", 41, 0.1),
    (5, "John Nizinik", "France", 43, 0.2),
    (6, "Tribal King", "France", 25, 0.3),
]
# A fast limit for the tests' runaway queries; the step budget (not the clock) stops them, deterministically.
FAST = Limits(timeout_s=1.0, max_vm_steps=5_000_000)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    """A small writable SQLite file (the sandbox must protect it without help from file permissions)."""
    path = tmp_path_factory.mktemp("spiderdb") / "concert_singer" / "concert_singer.sqlite"
    path.parent.mkdir()
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE singer (Singer_ID INT PRIMARY KEY, Name TEXT, Country TEXT, Age INT, Score REAL)")
    conn.executemany("INSERT INTO singer VALUES (?, ?, ?, ?, ?)", SINGERS)
    conn.execute("CREATE TABLE concert (concert_ID INT, Singer_ID INT REFERENCES singer(Singer_ID), Year TEXT)")
    conn.execute("CREATE TABLE numbers (x INT)")
    conn.executemany("INSERT INTO numbers VALUES (?)", [(i,) for i in range(200)])
    conn.commit()
    conn.close()
    return path


def ex(db: Path, gold: str) -> object:
    return make_example("t", {"db_id": "concert_singer", "question": "q?", "query": gold}, db)


def block(sql: str) -> str:
    return f"```sql\n{sql}\n```"


UNORDERED = "SELECT Name FROM singer WHERE Age > 30"
ORDERED = "SELECT Name FROM singer ORDER BY Age DESC"
SUM45 = "SELECT sum(Score) FROM singer WHERE Singer_ID IN (4, 5)"  # 0.1 + 0.2 = 0.30000000000000004
EMPTY = "SELECT Name FROM singer WHERE Age > 99"
GARBAGE = "lorem ```sq ipsum ``` SELECT * FROM singer; ' \" ``` ((( " * 2000
assert len(GARBAGE) >= 100_000

# (id, gold, completion, score, parses, executes)
REWARD_CASES = [
    ("gold_itself", UNORDERED, block(UNORDERED), 1, 1, 1),
    ("equivalent_query", UNORDERED, block("SELECT name FROM singer WHERE NOT age <= 30"), 1, 1, 1),
    ("reasoning_then_block", UNORDERED, "Ages over 30.\n" + block(UNORDERED) + "\nDone.", 1, 1, 1),
    ("unordered_gold_any_order", UNORDERED, block(UNORDERED + " ORDER BY Name DESC"), 1, 1, 1),
    ("ordered_gold_same_order", ORDERED, block("SELECT Name FROM singer ORDER BY Age DESC, Name"), 1, 1, 1),
    ("ordered_gold_wrong_order", ORDERED, block("SELECT Name FROM singer ORDER BY Age ASC"), 0, 1, 1),
    ("ordered_gold_no_order", ORDERED, block("SELECT Name FROM singer ORDER BY Singer_ID"), 0, 1, 1),
    ("multiset_not_set", "SELECT Country FROM singer", block("SELECT DISTINCT Country FROM singer"), 0, 1, 1),
    ("multiset_same_counts", "SELECT Country FROM singer", block("SELECT Country FROM singer ORDER BY 1"), 1, 1, 1),
    ("duplicated_rows", UNORDERED, block(UNORDERED + " UNION ALL " + UNORDERED), 0, 1, 1),
    ("extra_column", UNORDERED, block("SELECT Name, Age FROM singer WHERE Age > 30"), 0, 1, 1),
    ("swapped_columns", "SELECT Name, Age FROM singer", block("SELECT Age, Name FROM singer"), 0, 1, 1),
    ("missing_row", UNORDERED, block("SELECT Name FROM singer WHERE Age > 32"), 0, 1, 1),
    ("float_noise_rounded", SUM45, block("SELECT 0.3"), 1, 1, 1),
    ("float_really_different", SUM45, block("SELECT 0.3001"), 0, 1, 1),
    ("int_equals_integral_float", "SELECT count(*) FROM singer", block("SELECT 6.0"), 1, 1, 1),
    ("string_not_number", "SELECT count(*) FROM singer", block("SELECT '6'"), 0, 1, 1),
    ("both_empty_same_width", EMPTY, block("SELECT Name FROM singer WHERE 0"), 1, 1, 1),
    ("both_empty_other_width", EMPTY, block("SELECT 1, 2 WHERE 0"), 0, 1, 1),
    ("trailing_semicolon", UNORDERED, block(UNORDERED + ";"), 1, 1, 1),
    ("trailing_empty_statements", "SELECT count(*) FROM singer", block("SELECT count(*) FROM singer;;"), 1, 1, 1),
    ("trailing_empty_statements_spaced", UNORDERED, block(UNORDERED + " ; ;\n;"), 1, 1, 1),
    ("second_statement_after_empty_one", "SELECT 1", block("SELECT 1;; SELECT 2"), 0, 0, 0),
    ("upper_case_fence", UNORDERED, f"```SQL\n{UNORDERED}\n```", 1, 1, 1),
    ("sqlite_fence_one_line", UNORDERED, f"```sqlite {UNORDERED} ```", 1, 1, 1),
    ("leading_comment", UNORDERED, block("-- names\n/* over 30 */ " + UNORDERED), 1, 1, 1),
    ("values_statement", "SELECT 1", block("VALUES (1)"), 1, 0, 1),
    ("cte_query", UNORDERED, block("WITH o AS (SELECT * FROM singer WHERE Age > 30) SELECT Name FROM o"), 1, 1, 1),
    ("unknown_table", UNORDERED, block("SELECT Name FROM singers WHERE Age > 30"), 0, 1, 0),
    ("syntax_error", UNORDERED, block("SELECT Name FROM WHERE Age >"), 0, 0, 0),
    ("no_block", UNORDERED, UNORDERED, 0, 0, 0),
    ("python_block", UNORDERED, f"```python\n{UNORDERED}\n```", 0, 0, 0),
    ("bare_fence", UNORDERED, f"```\n{UNORDERED}\n```", 0, 0, 0),
    ("unclosed_block", UNORDERED, f"```sql\n{UNORDERED}\n", 0, 0, 0),
    ("empty_block", UNORDERED, "```sql\n\n```", 0, 0, 0),
    ("tag_glued_to_fence", UNORDERED, f"```sql```{UNORDERED}```", 0, 0, 0),
    ("first_block_wrong", UNORDERED, block("SELECT 1") + " no, " + block(UNORDERED), 0, 1, 1),
    ("first_block_right", UNORDERED, block(UNORDERED) + " or " + block("SELECT 1"), 1, 1, 1),
    ("empty_string", UNORDERED, "", 0, 0, 0),
    ("garbage_100kB", UNORDERED, GARBAGE, 0, 0, 0),
    ("garbage_100kB_then_answer", UNORDERED, GARBAGE + block(UNORDERED), 1, 1, 1),  # no ```sql fence in GARBAGE
    ("clean_100kB_then_answer", UNORDERED, "thinking " * 12_000 + block(UNORDERED), 1, 1, 1),
    ("garbage_100kB_in_block", UNORDERED, block("SELECT " + "x" * 100_000), 0, 0, 0),
    ("sql_in_question_style", UNORDERED, f"Question: {UNORDERED}? Answer: none", 0, 0, 0),
    ("null_byte", UNORDERED, block(UNORDERED + "\x00"), 0, 0, 0),
    ("lone_surrogate", UNORDERED, block("SELECT '\ud800'"), 0, 1, 0),
    ("non_ascii_string", EMPTY, block("SELECT Name FROM singer WHERE Name = 'Zoë ✓'"), 1, 1, 1),
    ("parens_1000_deep", UNORDERED, block("SELECT " + "(" * 1000 + "1" + ")" * 1000), 0, 0, 0),
    ("explain", UNORDERED, block("EXPLAIN " + UNORDERED), 0, 0, 0),
    ("random_denied", "SELECT 1", block("SELECT 1 WHERE random() IS NOT NULL"), 0, 1, 0),
    ("huge_string", UNORDERED, block("SELECT length(hex(zeroblob(60000)))"), 0, 1, 0),
    (
        "doubling_strings",
        UNORDERED,
        block("WITH RECURSIVE c(x) AS (SELECT 'a' UNION ALL SELECT x||x FROM c) SELECT max(length(x)) FROM c"),
        0,
        1,
        0,
    ),  # fmt: skip
    ("printf_over_length_is_null", UNORDERED, block("SELECT printf('%.*c', 100000000, 'x')"), 0, 1, 1),
    ("too_many_rows", UNORDERED, block("SELECT * FROM numbers a, numbers b"), 0, 1, 0),
]


@pytest.mark.parametrize(
    ("gold", "completion", "score", "parses", "executes"),
    [c[1:] for c in REWARD_CASES],
    ids=[c[0] for c in REWARD_CASES],
)
def test_reward_table(db: Path, gold: str, completion: str, score: int, parses: int, executes: int) -> None:
    """Completions get the intended score and components, never raise, and return within the bound the sandbox
    enforces (each query killed after its time limit: reward_time_bound_s), not a machine speed."""
    limits = Limits(max_rows=10_000)
    t0 = time.perf_counter()
    res = reward(ex(db, gold), completion, limits)
    elapsed = time.perf_counter() - t0
    comps = res.components
    assert set(comps) == {"parses", "executes", "matches"}, f"components {comps}"
    assert res.score == score == comps["matches"], f"score {res.score} != {score}; info={res.info}"
    assert (comps["parses"], comps["executes"]) == (parses, executes), f"components {comps}; info={res.info}"
    assert isinstance(res.info["reason"], str) and res.info["reason"], f"missing reason: {res.info}"
    assert elapsed < reward_time_bound_s(limits), f"reward took {elapsed:.3f}s"


# Each must score 0, leave the database byte-identical and create no file. {tmp} is a fresh directory.
HOSTILE = [
    ("drop", "DROP TABLE singer"),
    ("delete", "DELETE FROM singer"),
    ("update", "UPDATE singer SET Age = 0"),
    ("insert", "INSERT INTO singer VALUES (7, 'x', 'y', 1, 1.0)"),
    ("replace", "REPLACE INTO singer VALUES (1, 'x', 'y', 1, 1.0)"),
    ("create_table", "CREATE TABLE t2 (x INT)"),
    ("create_table_as", "CREATE TABLE t2 AS SELECT * FROM singer"),
    ("create_temp", "CREATE TEMP TABLE t2 AS SELECT * FROM singer"),
    ("create_index", "CREATE INDEX i ON singer(Age)"),
    ("create_view", "CREATE VIEW v AS SELECT 1"),
    ("create_trigger", "CREATE TRIGGER tr AFTER INSERT ON singer BEGIN DELETE FROM singer; END"),
    ("alter", "ALTER TABLE singer ADD COLUMN z INT"),
    ("attach_existing", "ATTACH DATABASE '{other}' AS other"),
    ("attach_new_file", "ATTACH DATABASE '{tmp}/attached.db' AS other"),
    ("attach_memory", "ATTACH ':memory:' AS m"),
    ("detach", "DETACH DATABASE main"),
    ("pragma_writable_schema", "PRAGMA writable_schema=1"),
    ("pragma_journal", "PRAGMA journal_mode=WAL"),
    ("pragma_function", "SELECT * FROM pragma_table_info('singer')"),
    ("load_extension", "SELECT load_extension('{tmp}/evil.so')"),
    ("fts3_tokenizer", "SELECT fts3_tokenizer('simple')"),
    ("recursive_forever", "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c"),
    ("cross_join", "SELECT count(*) FROM numbers a, numbers b, numbers c, numbers d, numbers e"),
    ("cross_join_sorted", "SELECT a.x FROM numbers a, numbers b, numbers c ORDER BY a.x * b.x - c.x LIMIT 1"),
    ("one_megabyte", "SELECT " + "1 + " * 250_000 + "1"),
    ("multi_statement", "SELECT 1; DROP TABLE singer"),
    ("right_answer_then_drop", UNORDERED + "; DROP TABLE singer"),
    ("right_answer_then_comment_drop", UNORDERED + "; -- x\nDROP TABLE singer"),
    ("vacuum_into", "VACUUM INTO '{tmp}/copy.db'"),
    ("vacuum", "VACUUM"),
    ("cte_delete", "WITH x AS (SELECT 1) DELETE FROM singer"),
    ("cte_insert", "WITH x AS (SELECT 1) INSERT INTO singer SELECT * FROM singer"),
    ("transaction", "BEGIN; DELETE FROM singer; COMMIT"),
    ("begin", "BEGIN IMMEDIATE"),
    ("savepoint", "SAVEPOINT a"),
    ("analyze", "ANALYZE"),
    ("reindex", "REINDEX"),
    ("create_virtual", "CREATE VIRTUAL TABLE f USING fts5(x)"),
]
NOT_STATEMENT_LEVEL = {"recursive_forever", "cross_join", "cross_join_sorted", "one_megabyte", "multi_statement"}
NOT_STATEMENT_LEVEL |= {"right_answer_then_drop", "right_answer_then_comment_drop"}
DENIED_DIRECTLY = [q for name, q in HOSTILE if name not in NOT_STATEMENT_LEVEL]


def _snapshot(*dirs: Path) -> dict[str, str]:
    return {str(p): sha256(p) for d in dirs for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("sql", [h[1] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_hostile_sql_scores_zero_and_changes_nothing(db: Path, tmp_path: Path, sql: str) -> None:
    """Hostile SQL scores 0 within the time limit; the database is byte-identical and no file appears anywhere."""
    other = tmp_path / "other.db"
    sqlite3.connect(other).close()
    sql = sql.format(tmp=tmp_path, other=other)
    before = _snapshot(db.parent, tmp_path)
    t0 = time.perf_counter()
    res = reward(ex(db, UNORDERED), "Sure.\n" + block(sql), FAST)
    elapsed = time.perf_counter() - t0
    assert res.score == 0.0 and res.components["executes"] == 0.0, f"{res}"
    assert elapsed < FAST.timeout_s + 0.5, f"took {elapsed:.2f}s, limit {FAST.timeout_s}s"
    assert _snapshot(db.parent, tmp_path) == before, "files changed or appeared"
    assert sorted(p.name for p in db.parent.iterdir()) == ["concert_singer.sqlite"], list(db.parent.iterdir())
    assert reward(ex(db, UNORDERED), block(UNORDERED), FAST).score == 1.0, "the database no longer answers"


@pytest.mark.parametrize("sql", DENIED_DIRECTLY)
def test_authorizer_alone_denies(db: Path, tmp_path: Path, sql: str) -> None:
    """Without the keyword pre-check, the sandboxed connection itself refuses every write/attach/pragma statement."""
    sql = sql.format(tmp=tmp_path, other=tmp_path / "other.db")
    conn = open_readonly(db)
    try:
        with pytest.raises((sqlite3.DatabaseError, sqlite3.ProgrammingError)):
            conn.execute(sql).fetchall()
    finally:
        conn.close()
    assert not list(tmp_path.iterdir()), f"files created: {list(tmp_path.iterdir())}"


def test_runaway_query_is_stopped_deterministically_by_steps(db: Path) -> None:
    """With a generous clock, a never-ending CTE stops at the VM step budget, with the same reason every time."""
    sql = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c"
    limits = Limits(timeout_s=30.0, max_vm_steps=2_000_000)
    first, second = run_query(db, sql, limits), run_query(db, sql, limits)
    assert first.error and "step budget" in first.error, f"{first}"
    assert first == second, f"not deterministic: {first} vs {second}"


def test_runaway_query_is_stopped_by_the_clock(db: Path) -> None:
    """With an unlimited step budget, the wall-clock deadline stops a cross-join explosion in time."""
    sql = "SELECT count(*) FROM numbers a, numbers b, numbers c, numbers d, numbers e"
    t0 = time.perf_counter()
    res = run_query(db, sql, Limits(timeout_s=0.3, max_vm_steps=10**15))
    elapsed = time.perf_counter() - t0
    assert res.error and "time limit" in res.error, f"{res}"
    assert elapsed < 0.3 + KILL_GRACE_S + 0.5, f"took {elapsed:.2f}s"  # the kill at timeout + grace, then the reply


# Built-in functions that loop inside ONE VM instruction, where no progress handler runs (issue 13: the printf case
# took 6.6 s against a 2 s limit in-process). Each must come back within the time limit plus the kill grace.
ONE_INSTRUCTION_LOOPS = {
    "printf_width": "SELECT printf('%.*c', 2147483647, 'x')",
    "printf_width_star": "SELECT printf('%*d', 2147483647, 1)",
    "format_width": "SELECT format('%.*c', 2147483647, 'x')",
    "printf_many_args": "SELECT printf('%.*c%.*c', 2147483647, 'x', 2147483647, 'y')",
    "trim_8k_set": "SELECT length(trim(hex(zeroblob(49000)), '" + "0123456789ABCDEFGHIJ" * 400 + "x'))",
    "zeroblob_huge": "SELECT length(zeroblob(2147483647))",
    "randomblob_huge": "SELECT length(randomblob(2147483647))",
    "replace_huge_blob": "SELECT length(replace(hex(zeroblob(49000)), '0', '00'))",
    "substr_huge_hex": "SELECT substr(hex(zeroblob(2000000000)), 1, 10)",
    "nested_replace": "SELECT length(replace(replace(replace(hex(zeroblob(40000)), '0', 'ab'), 'a', 'cd'), 'c', 'ef'))",
    "like_long_pattern": "SELECT hex(zeroblob(49000)) LIKE '%" + "0%" * 400 + "1'",
}


@pytest.mark.parametrize("sql", ONE_INSTRUCTION_LOOPS.values(), ids=ONE_INSTRUCTION_LOOPS.keys())
def test_time_limit_is_a_wall_clock_bound_for_one_instruction_loops(db: Path, sql: str) -> None:
    """The query's wall time is at most timeout_s + KILL_GRACE_S (+ slack for a loaded host), whatever it does."""
    from bench.sqlite_sandbox import KILL_GRACE_S, POOL

    POOL.get().warm_up()  # a worker's start-up is not part of the query's time
    limits = Limits(timeout_s=0.5)
    t0 = time.perf_counter()
    res = run_query(db, sql, limits)
    elapsed = time.perf_counter() - t0
    assert elapsed < limits.timeout_s + KILL_GRACE_S + 0.5, f"took {elapsed:.2f}s: {res}"
    if res.error is None:  # finished in time: then it stayed within the value-size limit
        assert all(len(str(v)) <= DEFAULT_LIMITS.max_value_bytes for row in res.rows for v in row), res
    assert reward(ex(db, "SELECT 1"), block(sql), limits).score == 0.0


def test_four_printf_bombs_in_a_row_take_four_time_limits_not_more(db: Path) -> None:
    """A worker killed for one bomb is replaced; the next bomb is bounded the same way (issue 13: four took 27 s)."""
    from bench.sqlite_sandbox import KILL_GRACE_S, POOL

    POOL.get().warm_up()
    limits = Limits(timeout_s=0.5)
    t0 = time.perf_counter()
    for _ in range(4):
        assert run_query(db, ONE_INSTRUCTION_LOOPS["printf_width"], limits).error
    assert time.perf_counter() - t0 < 4 * (limits.timeout_s + KILL_GRACE_S) + 4.0  # + restarts of ~0.1 s each
    assert run_query(db, "SELECT count(*) FROM singer", limits).rows == ((len(SINGERS),),)  # the pool still works


def test_temporary_storage_stays_in_memory_under_the_heap_limit(db: Path) -> None:
    """A recursive CTE sorted by a 90 kB column (issue 13: 1.7 GB of SQLite temp files in 2 s) fails with
    out-of-memory under the worker's heap limit; the workers' temp directory stays empty and their file-size limit is
    0, so no query can write to disk."""
    from bench.sqlite_sandbox import POOL, temp_dir

    sql = (
        "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < 100000) "
        "SELECT i FROM r ORDER BY substr(hex(zeroblob(45000)), 1, 90000) || i"
    )
    t0 = time.perf_counter()
    res = run_query(db, sql, Limits(timeout_s=2.0))
    assert res.error is not None and time.perf_counter() - t0 < 3.0, res
    assert reward(ex(db, "SELECT 1"), block(sql)).score == 0.0
    assert temp_dir().is_dir() and not any(temp_dir().iterdir()), list(temp_dir().iterdir())
    for pid in POOL.get().pids():
        limits = Path(f"/proc/{pid}/limits").read_text()
        assert re.search(r"Max file size\s+0\s+0|Max file size\s+0\s", limits), limits


def test_gold_over_limits_is_unscorable(db: Path) -> None:
    """A gold query that exceeds the row cap makes the example unscorable: even the gold itself scores 0."""
    res = reward(ex(db, UNORDERED), block(UNORDERED), Limits(max_rows=3))
    assert res.score == 0.0 and res.info.get("unscorable") is True, f"{res}"
    assert "gold" in res.info["reason"], res.info


SLOW_GOLD = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 2000000) SELECT count(*) FROM c"


def test_a_gold_whose_worker_dies_once_is_retried_not_cached_as_failed(db: Path) -> None:
    """The worker running a gold query is killed mid-query (as a crash or the OOM killer would): the gold is run
    again, scores its own gold 1, and is cached only once it has a result (was: the failure was cached for the rest of
    the process and the example scored 0 even for its gold)."""
    import signal
    import threading

    from bench.sqlite_sandbox import POOL

    limits = Limits(timeout_s=30.0)
    POOL.get().warm_up()
    before = set(POOL.get().pids())
    out = {}
    t = threading.Thread(target=lambda: out.update(r=reward(ex(db, SLOW_GOLD), block("SELECT 2000000"), limits)))
    t.start()
    deadline = time.monotonic() + 10
    killed = False
    while not killed and time.monotonic() < deadline:  # kill the worker once the gold is running in it
        time.sleep(0.05)
        for pid in before:
            stat = Path(f"/proc/{pid}/stat")
            if stat.exists() and float(stat.read_text().rsplit(")", 1)[1].split()[11]) > 5:  # utime > 50 ms: busy
                os.kill(pid, signal.SIGKILL)
                killed = True
    t.join(60)
    assert killed, "no worker was seen running the gold query"
    res = out["r"]
    assert res.score == 1.0 and not res.info.get("unscorable"), res
    cached = gold_result(db, SLOW_GOLD, limits)
    assert cached.result.error is None and cached.result.rows == ((2000000,),)


def test_killed_workers_leave_no_temporary_directory(tmp_path: Path, db: Path) -> None:
    """Three queries killed at their time limit in a fresh process whose temporary directory is ``tmp_path``: while it
    runs there is one creditbench-sqlite-* directory (the parent's), and none once it exits (was: one more per killed
    worker, each made at import and never removed)."""
    script = f"""
import os, sys
sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
from tasks.text_to_sql import Limits, run_query
for _ in range(3):
    assert run_query({str(db)!r}, "SELECT printf('%.*c', 2147483647, 'x')", Limits(timeout_s=0.3)).error
import json
print(json.dumps(sorted(p for p in os.listdir({str(tmp_path)!r}) if p.startswith("creditbench-sqlite-"))))
"""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(json.loads(out.stdout.strip().splitlines()[-1])) == 1, out.stdout
    assert not [p for p in os.listdir(tmp_path) if p.startswith("creditbench-sqlite-")], os.listdir(tmp_path)


def test_gold_results_are_cached(db: Path) -> None:
    """gold_result returns the cached object for the same (database, query, limits)."""
    a = gold_result(db, "SELECT Name FROM singer WHERE Age < 40", DEFAULT_LIMITS)
    b = gold_result(db, "SELECT Name FROM singer WHERE Age < 40", DEFAULT_LIMITS)
    assert a is b and len(a.result.rows) == 3, f"{a} / {b}"


@pytest.mark.parametrize(
    ("gold", "ordered"),
    [
        ("SELECT a FROM t ORDER BY a", True),
        ("select a from t order  by a desc limit 1", True),
        ("SELECT `a` FROM `t` ORDER BY `a`", True),
        ("SELECT a FROM t UNION SELECT b FROM u ORDER BY 1", True),
        ("WITH x AS (SELECT 1 AS a) SELECT a FROM x ORDER BY a", True),
        ("SELECT a FROM (SELECT a FROM t ORDER BY a LIMIT 3)", False),
        ("SELECT a FROM t WHERE b IN (SELECT b FROM u ORDER BY b LIMIT 1)", False),
        ("SELECT a FROM t", False),
        ("SELECT 'order by' FROM t", False),
    ],
)
def test_gold_order_detection(gold: str, ordered: bool) -> None:
    """Only a top-level ORDER BY in the gold AST makes the comparison ordered."""
    assert is_ordered(gold) is ordered, f"is_ordered({gold!r}) = {is_ordered(gold)}"


def test_span_and_segments() -> None:
    """answer_span is the SQL inside the first ```sql block; segments start at 0, then at each clause, then at the
    closing fence."""
    sql = "SELECT a FROM t LEFT JOIN u ON t.k = u.k WHERE b = 'from x' GROUP BY a ORDER BY a"
    completion = "I join t and u.\n```sql\n" + sql + "\n```\nDone."
    start, end = sql_block_span(completion)
    assert completion[start:end] == sql and extract_sql(completion) == sql, completion[start:end]
    segs = segment(completion)
    words = [completion[s : s + 8] for s in segs]
    expected = ["I join t", "SELECT a", "FROM t L", "LEFT JOI", "WHERE b ", "GROUP BY", "ORDER BY", "\n```\nDon"]
    assert words == expected, f"segments {segs} -> {words}"
    assert segment("no block here") == [0] and sql_block_span("no block") is None
    assert clause_starts("SELECT 'unterminated FROM x") == [0, 21], "regex fallback on untokenisable text"
    task = TextToSQL(TextToSQLConfig())
    assert task.answer_span(completion) == (start, end) and task.segment(completion) == segs


def test_schema_rendering(db: Path) -> None:
    """The compact schema lists tables and columns with foreign keys; the cap cuts at a line with a note."""
    compact = render_schema(db)
    assert compact.splitlines() == [
        "singer(Singer_ID, Name, Country, Age, Score)",
        "concert(concert_ID, Singer_ID -> singer.Singer_ID, Year)",
        "numbers(x)",
    ], compact
    assert render_schema(db, "create").startswith("CREATE TABLE singer"), render_schema(db, "create")
    cut = render_schema(db, max_chars=60)
    assert cut.splitlines() == ["singer(Singer_ID, Name, Country, Age, Score)", "-- ... 2 more tables not shown"], cut


def test_task_reward_uses_config_limits(db: Path) -> None:
    """TextToSQL.reward is the module reward with the config's limits."""
    task = TextToSQL(TextToSQLConfig(max_rows=3))
    res = task.reward(ex(db, "SELECT Name FROM singer"), block("SELECT Name FROM singer"))
    assert res.score == 0.0 and res.info.get("unscorable"), f"{res}"
    e = ex(db, UNORDERED)
    for c in (block(UNORDERED), "junk", block("DROP TABLE singer")):
        assert TextToSQL(TextToSQLConfig()).reward(e, c) == reward(e, c), c


def test_config_validation() -> None:
    """Bad configs fail at construction, naming the field (schema_format is a Literal, which OmegaConf checks when the
    config is composed: tests/test_config.py's test of every choice-valued key)."""
    with pytest.raises(ValueError, match="timeout_s"):
        TextToSQLConfig(timeout_s=0)
    with pytest.raises(ValueError, match="max_rows"):
        TextToSQLConfig(max_rows=0)


def test_version_and_metadata() -> None:
    """The task declares a version and a description, and no hub dataset: the hub's Spider has no databases, so a
    missing data root must not send the user there."""
    assert TextToSQL.version == "1" and TextToSQL.description and TextToSQL.hub_dataset is None
    assert TextToSQLConfig().name == "text_to_sql"


def test_missing_data_root_raises(tmp_path: Path) -> None:
    """A missing data root raises FileNotFoundError naming the expected path and BENCH_DATA."""
    with pytest.raises(FileNotFoundError) as err:
        TextToSQL(TextToSQLConfig(data_root=str(tmp_path))).load_split("test")
    msg = str(err.value)
    assert str(tmp_path / "text2sql" / "spider") in msg and "BENCH_DATA" in msg, msg
    with pytest.raises(FileNotFoundError, match="BENCH_DATA") as err:
        TextToSQL(TextToSQLConfig(data_root=None)).load_split("train")
    assert "hub" not in str(err.value), str(err.value)


def test_loading_counts_and_skips_on_a_fake_root(tmp_path: Path, db: Path) -> None:
    """Train rows on a missing database are skipped and counted; flagged dev rows are excluded and counted; val holds
    whole databases."""
    spider = tmp_path / "text2sql" / "spider"
    for name in ("concert_singer", "pets_1"):
        (spider / "database" / name).mkdir(parents=True)
        (spider / "database" / name / f"{name}.sqlite").write_bytes(db.read_bytes())
    rec = {"question": "q?", "query": "SELECT 1", "gold_nonempty": True}
    dev = [{**rec, "db_id": "concert_singer", "uses_missing_table": flag} for flag in (False, True, False)]
    train = [{**rec, "db_id": d} for d in ("concert_singer", "pets_1", "baseball_1", "pets_1", "soccer_1")]
    (spider / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in dev))
    (spider / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    task = TextToSQL(TextToSQLConfig(data_root=str(tmp_path), val_databases=1))
    sizes = {s: len(task.load_split(s)) for s in ("train", "val", "test")}
    assert task.counts["train_missing_db"] == 2 and task.counts["dev_uses_missing_table"] == 1, task.counts
    assert sizes["test"] == 2 and sizes["train"] + sizes["val"] == 3, sizes
    val_dbs = {e.answer["db_id"] for e in task.load_split("val")}
    train_dbs = {e.answer["db_id"] for e in task.load_split("train")}
    assert len(val_dbs) == 1 and not val_dbs & train_dbs, f"val {val_dbs} train {train_dbs}"


# ---- real data ----------------------------------------------------------------------------------------------------


def spider_root() -> Path:
    root = conftest_data_root("text2sql/spider/dev.jsonl")
    if root is None:
        pytest.skip("no data root with text2sql/spider/ (BENCH_DATA or ../shared/data)")
    return root


@pytest.fixture(scope="module")
def spider() -> TextToSQL:
    task = TextToSQL(TextToSQLConfig(data_root=str(spider_root()), num_eval=100_000))
    for split in ("train", "val", "test"):
        task.examples(split)
    return task


def test_spider_split_sizes(spider: TextToSQL) -> None:
    """1026 usable dev questions (8 flagged excluded); train + val = all 6627 train rows; databases disjoint."""
    counts = spider.counts
    assert counts["dev_rows"] == 1034 and counts["dev_uses_missing_table"] == 8, counts
    assert counts["test"] == 1026 == len(spider.examples("test")), counts
    assert counts["train_rows"] == 6627 and counts["train_missing_db"] == 0, counts
    assert counts["train"] + counts["val"] == 6627 and counts["val"] == 351, counts
    dbs = {s: {e.answer["db_id"] for e in spider.examples(s)} for s in ("train", "val", "test")}
    assert len(dbs["test"]) == 20 and len(dbs["val"]) == 6, {s: len(d) for s, d in dbs.items()}
    for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
        assert not dbs[a] & dbs[b], f"{a} and {b} share databases {dbs[a] & dbs[b]}"
    first = {e.answer["db_id"] for e in spider.examples("test")[:200]}
    assert len(first) >= 15, f"the first 200 test questions span only {len(first)} databases"


def test_every_usable_dev_gold_scores_one(spider: TextToSQL) -> None:
    """Every usable Spider dev gold query, as a demonstration, scores 1 with all components 1 (about 3 s)."""
    failures = []
    for e in spider.examples("test"):
        res = spider.reward(e, e.demonstration)
        if res.score != 1.0 or res.components != {"parses": 1.0, "executes": 1.0, "matches": 1.0}:
            failures.append((e.uid, e.answer["query"], res.info))
    assert len(spider.examples("test")) == 1026
    assert not failures, f"{len(failures)} dev golds do not score 1, e.g. {failures[:3]}"


def test_dev_wrong_answers_score_zero(spider: TextToSQL) -> None:
    """A gold query paired with another question's gold on the same database mostly scores 0 (the reward is not
    trivially 1): at most 5% of 300 such swaps match."""
    exs = [e for e in spider.examples("test") if e.data["gold_nonempty"]][:300]
    by_db: dict[str, list] = {}
    for e in exs:
        by_db.setdefault(e.answer["db_id"], []).append(e)
    swaps = [(a, b) for group in by_db.values() for a, b in zip(group, group[1:] + group[:1], strict=True)]
    swaps = [(a, b) for a, b in swaps if a.answer["query"].strip() != b.answer["query"].strip()]
    matched = sum(spider.reward(a, b.demonstration).score for a, b in swaps)
    assert len(swaps) >= 250 and matched / len(swaps) < 0.05, f"{matched} of {len(swaps)} swapped golds matched"


@pytest.mark.slow
def test_every_train_gold_scores_one(spider: TextToSQL) -> None:
    """Every train and val gold query scores 1 against itself (about 15 s)."""
    failures = []
    for e in spider.examples("train") + spider.examples("val"):
        res = spider.reward(e, e.demonstration)
        if res.score != 1.0:
            failures.append((e.uid, e.answer["query"], res.info))
    assert not failures, f"{len(failures)} train golds do not score 1, e.g. {failures[:3]}"


def test_prompts_render(spider: TextToSQL) -> None:
    """instruction and plain_prompt are non-empty for every eval example; the plain prompt is short; the
    instruction holds the schema, the question and the answer format."""
    for split in ("val", "test"):
        for e in spider.examples(split):
            inst, plain = spider.instruction(e), spider.plain_prompt(e)
            assert e.question in inst and "```sql" in inst and e.data["schema"] in inst, f"{e.uid}: {inst[:200]}"
            assert "(" in e.data["schema"] and len(e.data["schema"]) <= spider.cfg.max_schema_chars, e.uid
            assert plain.strip() and len(plain) <= spider.cfg.plain_prompt_chars + 1, f"{e.uid}: {plain!r}"
    e = spider.examples("test")[0]
    assert e.demonstration == demonstration(e.answer["query"]) and e.demonstration.startswith("```sql\n"), e


def test_hostile_sql_on_real_database(spider: TextToSQL, tmp_path: Path) -> None:
    """On the real concert_singer database hostile SQL scores 0 and every file of its folder is byte-identical."""
    e = next(x for x in spider.examples("test") if x.answer["db_id"] == "concert_singer")
    folder = Path(e.answer["db_path"]).parent
    before = _snapshot(folder)
    names = {"drop", "delete", "update", "insert", "attach_new_file", "pragma_writable_schema", "load_extension"}
    names |= {"recursive_forever", "cross_join", "one_megabyte", "multi_statement", "vacuum_into", "cte_delete"}
    real_cross_join = "SELECT count(*) FROM " + ", ".join(f"singer s{i}" for i in range(12))  # 6**12 rows
    for name, sql in [*HOSTILE, ("real_cross_join", real_cross_join)]:
        if name in names | {"real_cross_join"}:
            res = reward(e, block(sql.format(tmp=tmp_path, other=tmp_path / "x.db")), FAST)
            assert res.score == 0.0 and res.components["executes"] == 0.0, f"{name}: {res}"
    assert _snapshot(folder) == before, "the Spider database folder changed"
    assert not list(tmp_path.iterdir()), f"files created: {list(tmp_path.iterdir())}"
    assert spider.reward(e, e.demonstration).score == 1.0


fence_text = st.text(alphabet=st.sampled_from(list("`sqlSQL \n()';-*/SELECTFROMWHERE1,x")), max_size=80)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(fence_text, st.sampled_from(["```sql\n", "```", "SELECT 1", " FROM singer"])), max_size=8))
def test_fuzzed_completions_never_raise(db: Path, parts: list[str]) -> None:
    """Random fence/SQL fragments never raise; scores are 0/1 with matches <= executes; segments start at 0, rise
    strictly and stay inside the completion; the span, when any, lies inside it."""
    completion = "".join(parts)
    res = reward(ex(db, "SELECT 1"), completion, FAST)
    c = res.components
    assert res.score in (0.0, 1.0) and c["matches"] <= c["executes"], f"{completion!r}: {res}"
    segs = segment(completion)
    assert segs[0] == 0 and all(a < b for a, b in zip(segs, segs[1:], strict=False)), f"{completion!r}: {segs}"
    assert all(s < max(len(completion), 1) for s in segs), f"{completion!r}: {segs}"
    span = sql_block_span(completion)
    assert span is None or 0 <= span[0] < span[1] <= len(completion), f"{completion!r}: {span}"
