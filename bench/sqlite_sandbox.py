"""Sandboxed, read-only execution of model-written SQLite queries (text-to-SQL's reward), with limits that hold.

In-process limits (``execute``): an authorizer allow-list (plain reads and functions, see DENIED_FUNCTIONS), a
read-only immutable connection, SQLITE_LIMIT_* bounds on value size, columns and LIKE patterns, and a progress handler
that stops a statement after ``max_vm_steps`` VM steps or at the ``timeout_s`` deadline. The progress handler runs
between VM instructions only, and some built-in functions loop inside one instruction (``printf('%.*c',
2147483647, 'x')`` took 6.6 s against a 2 s limit; ``trim`` with an 8k-character set is similar), so ``run`` executes
the statement in a worker process (bench/sandbox.py) that is killed when it has not answered within ``timeout_s`` +
KILL_GRACE_S: a wall-clock bound for any query.

Temporary storage is bounded too: each worker sets ``temp_store = MEMORY`` on its connections and a process-wide
``hard_heap_limit`` of HEAP_LIMIT_MB, so a sort or a recursive CTE that would spill to temporary files (one such query
wrote 1.7 GB in 2 s) fails with out-of-memory instead; the worker's file-size limit is 0 (RLIMIT_FSIZE) and its
SQLITE_TMPDIR an empty private directory, so it cannot write a byte to disk either way. An address-space limit
(``memory_mb``) and a CPU-time limit back these up.

This module imports only the standard library: a worker starts in ~0.1 s.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import resource
import shutil
import signal
import sqlite3
import sys
import tempfile
import time
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any

from bench import ROOT
from bench.sandbox import SharedPool, limit_cpu


@dataclass(frozen=True)
class Limits:
    """Execution limits applied to predicted and gold queries alike (see the module docstring)."""

    timeout_s: float = 2.0
    max_vm_steps: int = 50_000_000
    max_rows: int = 50_000
    max_query_chars: int = 20_000
    max_value_bytes: int = 100_000


DEFAULT_LIMITS = Limits()
PROGRESS_EVERY = 1_000
"""VM instructions between progress-handler calls (step-budget granularity)."""
MAX_RESULT_CHARS = 64_000_000
"""Bound on the characters (str/bytes lengths, plus 8 per value) held from one result; Spider golds need < 1M."""
MAX_COLUMNS = 256
"""SQLITE_LIMIT_COLUMN: with max_value_bytes it bounds one result row (Spider tables have <= 32 columns)."""
MAX_LIKE_PATTERN = 1000
"""SQLITE_LIMIT_LIKE_PATTERN_LENGTH. One LIKE/GLOB call is a single VM step that no progress handler can interrupt
and costs up to (value length x pattern length): 100 kB x 1000 is ~0.1 s, the default 50 kB pattern ~5 s."""
FLOAT_DIGITS = 12
"""Floats are compared after rounding to this many significant digits (absorbs summation-order noise only)."""
DENIED_FUNCTIONS = frozenset(
    {
        "load_extension",  # loads native code (extension loading is also disabled on the connection)
        "fts3_tokenizer",  # the 2-argument form registers a raw pointer: a known code-execution vector
        "readfile",  # file access helpers of the sqlite3 shell, in case an extension provides them
        "writefile",
        "edit",
        "random",  # nondeterministic: the reward must be a function of its input
        "randomblob",
    }
)
_ALLOWED_ACTIONS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE})


def _authorizer(action: int, arg1: str | None, arg2: str | None, db_name: str | None, source: str | None) -> int:
    """Allow-list: plain reads only. FUNCTION's arg2 is the function name."""
    if action in _ALLOWED_ACTIONS:
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() not in DENIED_FUNCTIONS:
        return sqlite3.SQLITE_OK
    return sqlite3.SQLITE_DENY


def open_readonly(db_path: str | Path, limits: Limits = DEFAULT_LIMITS) -> sqlite3.Connection:
    """A read-only, immutable connection with the allow-list authorizer and size limits (no progress handler: the
    caller installs one per statement). Raises FileNotFoundError for a missing database file (a setup error, not a
    model error: it must not silently score 0)."""
    path = Path(db_path)
    if not path.is_file():
        raise FileNotFoundError(f"Spider database not found: {path}")
    uri = "file:" + uri_quote(str(path.resolve())) + "?mode=ro&immutable=1"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=True)
    if hasattr(conn, "enable_load_extension"):
        conn.enable_load_extension(False)
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, limits.max_value_bytes)
    conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, 4 * limits.max_query_chars + 16)  # UTF-8 bytes, not characters
    conn.setlimit(sqlite3.SQLITE_LIMIT_WORKER_THREADS, 0)
    conn.setlimit(sqlite3.SQLITE_LIMIT_COLUMN, MAX_COLUMNS)
    conn.setlimit(sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, MAX_LIKE_PATTERN)
    conn.execute("PRAGMA temp_store = MEMORY")  # sorts and temporary tables under the heap limit, never on disk
    conn.set_authorizer(_authorizer)
    return conn


def uri_quote(path: str) -> str:
    """Escape the characters that end or corrupt the path part of an SQLite URI."""
    return path.replace("%", "%25").replace("?", "%3f").replace("#", "%23")


@dataclass(frozen=True)
class QueryResult:
    """Outcome of one sandboxed execution: ``error`` is None on success."""

    columns: int = 0
    rows: tuple[tuple, ...] = ()
    error: str | None = None
    steps: int = 0
    transient: bool = False
    """The failure may not recur: a wall-clock timeout (the machine may be loaded) or a worker that crashed; a step
    budget, a row cap or an SQL error are deterministic."""


def _norm_value(v: Any) -> Any:
    if isinstance(v, float) and math.isfinite(v):
        return float(f"{v:.{FLOAT_DIGITS}g}")
    return v


TIMED_OUT = "timed out"


def execute(db_path: str | Path, sql: str, limits: Limits = DEFAULT_LIMITS) -> QueryResult:
    """Execute one statement in this process and return its normalised rows, or the reason it failed. Bounded in VM
    steps, value sizes, rows and result characters; NOT in wall time when one VM instruction loops (``printf`` with
    a huge width): call ``run``, which executes it in a killable worker."""
    conn = open_readonly(db_path, limits)
    calls = 0
    max_calls = limits.max_vm_steps // PROGRESS_EVERY
    stopped: list[str] = []
    deadline = time.monotonic() + limits.timeout_s

    def progress() -> int:
        nonlocal calls
        calls += 1
        if calls > max_calls:
            stopped.append(f"over the step budget of {limits.max_vm_steps} VM steps")
            return 1
        if time.monotonic() > deadline:
            stopped.append(TIMED_OUT)
            return 1
        return 0

    conn.set_progress_handler(progress, PROGRESS_EVERY)
    try:
        cur = conn.execute(sql)
        columns = len(cur.description or ())
        rows: list[tuple] = []
        size = 0
        for row in cur:
            if len(rows) >= limits.max_rows:
                return QueryResult(columns, error=f"more than {limits.max_rows} rows", steps=calls * PROGRESS_EVERY)
            size += sum(len(v) + 8 if isinstance(v, str | bytes) else 8 for v in row)
            if size > MAX_RESULT_CHARS:
                return QueryResult(columns, error=f"result over {MAX_RESULT_CHARS} chars", steps=calls * PROGRESS_EVERY)
            rows.append(tuple(_norm_value(v) for v in row))
        return QueryResult(columns, tuple(rows), None, calls * PROGRESS_EVERY)
    except (sqlite3.Error, ValueError, OverflowError, MemoryError, RecursionError) as e:
        reason = stopped[0] if stopped else f"{type(e).__name__}: {e}"
        if reason == TIMED_OUT:
            reason = f"over the {limits.timeout_s}s time limit"
            return QueryResult(error=reason, steps=calls * PROGRESS_EVERY, transient=True)
        return QueryResult(error=reason[:200], steps=calls * PROGRESS_EVERY)
    finally:
        conn.close()


# ---- the worker ---------------------------------------------------------------------------------------------------

KILL_GRACE_S = 0.5
"""How long after ``timeout_s`` the caller waits for the worker's answer before killing it (IPC and encoding)."""
HEAP_LIMIT_MB = 512
"""SQLite's hard heap limit in a worker (sorts and temporary tables live in memory, under this bound)."""
WORKER_MEMORY_MB = 2048
"""Address-space limit of a worker process (the heap limit above, a result of MAX_RESULT_CHARS, Python itself)."""
_TEMP_DIR: Path | None = None


def temp_dir() -> Path:
    """SQLITE_TMPDIR of the workers: stays empty (temp_store = MEMORY, RLIMIT_FSIZE = 0). Created once by the process
    that starts the workers, on first use, and removed at its exit; a worker imports this module but never creates
    one (a killed worker runs no exit handler, so one made at import was left behind by every restart)."""
    global _TEMP_DIR
    if _TEMP_DIR is None or not _TEMP_DIR.is_dir():
        _TEMP_DIR = Path(tempfile.mkdtemp(prefix="creditbench-sqlite-"))
        atexit.register(shutil.rmtree, _TEMP_DIR, True)
    return _TEMP_DIR


def _encode(v: Any) -> Any:
    return {"b": v.hex()} if isinstance(v, bytes) else v


def _decode(v: Any) -> Any:
    return bytes.fromhex(v["b"]) if isinstance(v, dict) else v


def serve() -> None:
    """The worker's loop: ``{"sql", "db", "limits"}`` in, ``{"status": "ok", "columns", "rows", "error", "steps"}``
    out, one JSON line each (bench/sandbox.py's protocol)."""
    proto = os.fdopen(os.dup(1), "wb", buffering=0)  # the protocol channel; fd 1 then points at stderr (devnull)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(obj: dict) -> None:
        proto.write(json.dumps(obj).encode() + b"\n")

    memory_mb = int(sys.argv[1]) if len(sys.argv) > 1 else WORKER_MEMORY_MB
    if memory_mb > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, resource.getrlimit(resource.RLIMIT_AS)[1]))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write over the limit fails (EFBIG) instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    sqlite3.connect(":memory:").execute(f"PRAGMA hard_heap_limit = {HEAP_LIMIT_MB << 20}").close()
    send({"ready": True, "pid": os.getpid()})
    for line in sys.stdin.buffer:
        req = json.loads(line)
        try:
            limit_cpu(req["cpu"])
            res = execute(req["db"], req["sql"], Limits(*req["limits"]))
            rows = [[_encode(v) for v in row] for row in res.rows]
            send({"status": "ok", "columns": res.columns, "rows": rows, "error": res.error, "steps": res.steps,
                  "transient": res.transient})  # fmt: skip
        except BaseException as e:  # MemoryError under the address-space limit, ...
            send({"status": "error", "error": f"{type(e).__name__}: {e}"[:200]})


def _command(memory_mb: int) -> list[str]:
    # the repository goes last on sys.path: nothing in the working directory can shadow a standard module
    boot = f"import sys; sys.path.append({str(ROOT)!r}); from bench.sqlite_sandbox import serve; serve()"
    return [sys.executable, "-c", boot, str(int(memory_mb))]


def _env() -> dict[str, str]:
    return {**os.environ, "SQLITE_TMPDIR": str(temp_dir())}


POOL = SharedPool(_command, "sqlite", max_workers=2, memory_mb=WORKER_MEMORY_MB, env=_env)
"""The process-wide pool of query workers (``POOL.get()``, ``POOL.configure(max_workers, memory_mb)``)."""


def run(db_path: str | Path, sql: str, limits: Limits = DEFAULT_LIMITS) -> QueryResult:
    """``execute`` in a worker process, killed after ``timeout_s`` + KILL_GRACE_S: the time limit holds for any
    query. A missing database is a setup error (FileNotFoundError), checked here, not scored 0."""
    if not Path(db_path).is_file():
        raise FileNotFoundError(f"Spider database not found: {db_path}")
    payload = {"db": str(db_path), "sql": sql, "limits": list(astuple(limits))}
    t0 = time.monotonic()
    reply = POOL.get().call(payload, limits.timeout_s + KILL_GRACE_S)
    status = reply.get("status")
    if status == "ok":
        rows = tuple(tuple(_decode(v) for v in row) for row in reply["rows"])
        return QueryResult(reply["columns"], rows, reply["error"], reply["steps"], reply.get("transient", False))
    if status == "timeout":
        waited = time.monotonic() - t0
        return QueryResult(error=f"over the {limits.timeout_s}s time limit (worker killed after {waited:.1f} s)",
                           transient=True)  # fmt: skip
    return QueryResult(error=f"worker {status}: {reply.get('error', 'no reply')}"[:200], transient=True)
