"""Killable worker processes for work on untrusted input (a reward's verifier, a model-written query).

A limit checked inside the work (a signal, an SQLite progress handler) fails when the work is stuck inside one C call:
a huge integer power in sympy, ``printf('%.*c', 2147483647, 'x')`` in SQLite. Here the work runs in a pool of worker
processes; the caller waits at most ``timeout_s`` for the answer, and a worker that has not answered is killed
(SIGKILL) and replaced, so the wall time of one call is bounded for any input. Workers are started with
``start_new_session`` (a Ctrl-C reaches the harness, not them), shut down at exit and never shared with forked
children.

Protocol: one JSON object per line each way. The first line a worker writes is ``{"ready": true}`` or
``{"ready": false, "error": ...}``; then one reply per request. A request carries ``"cpu"``: a CPU-seconds budget for
the worker's own RLIMIT_CPU backstop (it outlives a parent that was killed). Used by tasks/math.py (math-verify) and
bench/sqlite_sandbox.py (text-to-SQL execution).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import resource
import select
import subprocess
import threading
import time
from collections.abc import Callable

STARTUP_TIMEOUT_S = 120.0
"""How long a call waits for a freshly started worker to become ready (generous: the host may be loaded)."""


def limit_memory(memory_mb: int) -> None:
    """In a worker, at start: an address-space limit of ``memory_mb`` MiB (none when <= 0)."""
    if memory_mb > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, resource.getrlimit(resource.RLIMIT_AS)[1]))


def limit_cpu(extra_s: float) -> None:
    """In a worker, before each request: RLIMIT_CPU at the CPU time used so far + ``extra_s``, a backstop for a worker
    whose parent was killed (SIGXCPU ends it); the parent's kill is the real bound."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    cpu = math.ceil(used.ru_utime + used.ru_stime) + int(extra_s)
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu if hard == resource.RLIM_INFINITY else min(cpu, hard), hard))


# ---- confinement: what a worker on untrusted input may not do --------------------------------------------------------
_WRITE_FLAGS = (os.O_WRONLY, os.O_RDWR, os.O_CREAT, os.O_TRUNC, os.O_APPEND)
_DENIED = (
    # start a process
    "execve", "execveat", "fork", "vfork",
    # reach the network (no socket, no descriptor to send on)
    "socket", "socketpair", "connect", "bind", "listen", "accept", "accept4",
    # change the file system
    "creat", "rename", "renameat", "renameat2", "unlink", "unlinkat", "mkdir", "mkdirat", "rmdir", "link", "linkat",
    "symlink", "symlinkat", "chmod", "fchmod", "fchmodat", "chown", "fchown", "lchown", "fchownat", "truncate",
    "ftruncate", "utime", "utimes", "utimensat", "futimesat", "mknod", "mknodat", "memfd_create",
    # escape hatches: another process's memory or namespace, a kernel-side file API that bypasses these rules
    "ptrace", "process_vm_writev", "mount", "umount2", "chroot", "pivot_root", "setns", "unshare", "bpf",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "name_to_handle_at", "open_by_handle_at",
)  # fmt: skip
_AUDIT_DENIED = ("os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "subprocess.Popen",
                 "pty.spawn", "socket.", "os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.symlink", "os.link",
                 "os.chmod", "os.chown", "os.truncate", "os.utime", "shutil.", "os.kill", "os.killpg",
                 "signal.pthread_kill", "ctypes.dlopen", "webbrowser.open", "urllib.Request")  # fmt: skip


# ---- what an eval or a parser may be given (workers that run a dependency's verifier on model output) ----------------
def literal_ok(text: str) -> bool:
    """``text`` is a plain Python literal (numbers, strings, lists, tuples, dicts, sets of them): ``eval`` of it
    computes what ``ast.literal_eval`` does, and nothing else."""
    import ast

    try:
        ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False
    return True


def expression_ok(text: str) -> bool:
    """``text`` is an expression of numbers, operators, brackets, commas and allowed names (single letters, the
    elementary functions, ``pi``, ``E``, ``I``, ``oo``, ``Integral``, which some golds hold): what sympy's
    ``parse_expr`` may be given."""
    import re

    allowed = {"sin", "cos", "tan", "cot", "sec", "csc", "asin", "acos", "atan", "sinh", "cosh", "tanh", "exp", "log",
               "ln", "sqrt", "pi", "E", "I", "Abs", "oo", "Integral"}  # fmt: skip
    if len(text) > 4096 or "__" in text or not re.fullmatch(r"[0-9A-Za-z_ .,+\-*/^()]*", text):
        return False
    if re.search(r"[A-Za-z_)]\s*\.\s*[A-Za-z_]", text):  # attribute access (a decimal point is digits either side)
        return False
    return all(len(n) == 1 or n in allowed for n in re.findall(r"[A-Za-z_][A-Za-z_0-9]*", text))


class ConfinementError(RuntimeError):
    """A worker could not confine itself (no libseccomp): it refuses to start rather than run untrusted input
    unconfined."""


def confine() -> None:
    """Confine this process for good before it reads untrusted input: it can no longer write a file, start a process,
    reach the network, signal another process or touch another's memory, whatever code runs in it afterwards.

    Two layers. The kernel's seccomp filter (libseccomp through ``pyseccomp``): the syscalls above fail with EPERM,
    ``open``/``openat`` fail with EPERM whenever their flags ask to write, create, truncate or append, ``clone`` only
    makes threads, ``kill``/``tgkill`` only reach this process, and ``clone3``/``openat2`` (whose flags the filter
    cannot read) fail with ENOSYS, so the C library falls back to the calls above; inherited descriptors (the protocol
    pipe) stay writable. It holds for anything, ctypes and C extensions included, and cannot be lifted. Then a Python
    audit hook turns the same operations into a PermissionError at the Python level, with a message that names them.
    Call it after the imports the worker needs (lazy imports still read files). Raises ConfinementError when seccomp is
    not available (``apt install libseccomp2``)."""
    try:
        import pyseccomp as sc

        f = sc.SyscallFilter(sc.ALLOW)
    except Exception as e:  # noqa: BLE001 - the library or the kernel's seccomp missing: refuse to run unconfined
        raise ConfinementError(f"seccomp is not available ({type(e).__name__}: {e}): apt install libseccomp2") from e
    import errno
    import sys

    eperm, enosys = sc.ERRNO(errno.EPERM), sc.ERRNO(errno.ENOSYS)
    for name in _DENIED:
        try:
            f.add_rule(eperm, name)
        except (ValueError, RuntimeError, OSError):  # a syscall this architecture does not have (e.g. fork on arm64)
            pass
    for name, arg in (("open", 1), ("openat", 2)):
        for flag in _WRITE_FLAGS:
            with contextlib.suppress(ValueError, RuntimeError, OSError):
                f.add_rule(eperm, name, sc.Arg(arg, sc.MASKED_EQ, flag, flag))
    clone_thread = 0x00010000  # CLONE_THREAD: a thread of this process
    f.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, clone_thread, 0))
    for name in ("clone3", "openat2"):
        with contextlib.suppress(ValueError, RuntimeError, OSError):
            f.add_rule(enosys, name)
    me = os.getpid()
    f.add_rule(eperm, "kill", sc.Arg(0, sc.NE, me))
    for name in ("tgkill", "tkill"):
        f.add_rule(eperm, name, sc.Arg(0, sc.NE, me))
    f.load()
    sys.dont_write_bytecode = True

    def hook(event: str, args: tuple) -> None:
        if event == "open" and len(args) >= 3:
            mode, flags = args[1] or "", args[2] or 0
            if any(c in str(mode) for c in "wax+") or flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
                raise PermissionError(f"confined worker: opening {args[0]!r} for writing is not allowed")
        elif event.startswith(_AUDIT_DENIED):
            raise PermissionError(f"confined worker: {event} is not allowed")

    sys.addaudithook(hook)


class WorkerStartError(RuntimeError):
    """A worker could not start (a package missing, or the host too slow): an environment error, raised rather than
    scored 0, so a broken setup cannot silently fail every answer."""


class Worker:
    """One worker process and its line-based pipe protocol."""

    def __init__(self, argv: list[str], name: str, env: dict[str, str] | None = None):
        self.name = name
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            bufsize=0,
            close_fds=True,
            start_new_session=True,  # a Ctrl-C in the terminal reaches the harness, not the workers
            env=env,
        )
        self._in, self._out = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        self._poll = select.poll()  # poll, not select: no FD_SETSIZE limit in processes with many open files
        self._poll.register(self._out, select.POLLIN | select.POLLHUP | select.POLLERR)
        self._buf = b""
        self.ready = False

    def _readline(self, timeout_s: float) -> dict | None:
        """The next message, None on timeout; EOFError when the worker died."""
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._poll.poll(max(1, int(remaining * 1000))):
                if time.monotonic() >= deadline:
                    return None
                continue
            chunk = os.read(self._out, 1 << 16)
            if not chunk:
                raise EOFError("worker exited")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return json.loads(line)

    def wait_ready(self) -> None:
        if self.ready:
            return
        try:
            msg = self._readline(STARTUP_TIMEOUT_S)
        except (EOFError, ValueError) as e:
            msg = {"ready": False, "error": f"worker exited during startup ({e})"}
        if msg is None:
            msg = {"ready": False, "error": f"no answer within STARTUP_TIMEOUT_S={STARTUP_TIMEOUT_S:g} s"}
        if not msg.get("ready"):
            self.kill()
            raise WorkerStartError(f"{self.name} worker failed to start: {msg.get('error')}")
        self.ready = True

    def request(self, payload: dict, timeout_s: float) -> dict:
        """Send one request, wait up to timeout_s; {"status": "timeout"|"crashed"} when there is no answer."""
        self.wait_ready()
        data = json.dumps(payload).encode() + b"\n"
        try:
            while data:
                data = data[os.write(self._in, data) :]
            msg = self._readline(timeout_s)
        except (OSError, EOFError, ValueError):
            return {"status": "crashed"}
        return {"status": "timeout"} if msg is None else msg

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass  # reaped at shutdown

    def close(self, grace_s: float) -> None:
        """Ask politely (EOF on stdin ends the worker's loop), then kill."""
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=grace_s)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()


class WorkerPool:
    """Up to ``max_workers`` worker processes, started lazily, shared by all threads of this process.

    ``command(memory_mb)`` is the argv of one worker. A call takes an idle worker (or starts one, or waits for one),
    sends one request and waits ``timeout_s``. A worker that timed out or died is killed and a replacement is started
    at once, so it warms up in the background.
    """

    def __init__(
        self,
        command: Callable[[int], list[str]],
        name: str,
        max_workers: int = 2,
        memory_mb: int = 4096,
        env: dict[str, str] | None = None,
    ):
        self.command, self.name, self.env = command, name, env
        self.max_workers, self.memory_mb = max_workers, memory_mb
        self._cond = threading.Condition()
        self._idle: list[Worker] = []
        self._all: set[Worker] = set()
        self._starting = 0
        self._closed = False
        self.restarts = 0
        """Workers killed after a timeout or crash (each replaced)."""

    def configure(self, max_workers: int, memory_mb: int) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        with self._cond:
            self.max_workers, self.memory_mb = max_workers, memory_mb
            self._cond.notify_all()

    def pids(self) -> list[int]:
        """Process ids of the live workers."""
        with self._cond:
            return sorted(w.proc.pid for w in self._all if w.proc.poll() is None)

    def _start(self) -> Worker:
        w = Worker(self.command(self.memory_mb), self.name, self.env)
        with self._cond:
            self._all.add(w)
        return w

    def _acquire(self) -> Worker:
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError(f"the {self.name} worker pool is shut down")
                if self._idle:
                    return self._idle.pop()
                if len(self._all) + self._starting < self.max_workers:
                    self._starting += 1
                    break
                self._cond.wait()
        try:
            return self._start()
        finally:
            with self._cond:
                self._starting -= 1

    def _release(self, w: Worker, healthy: bool) -> None:
        with self._cond:
            keep = healthy and not self._closed and len(self._all) <= self.max_workers
            if keep:
                self._idle.append(w)
            else:
                self._all.discard(w)
            self._cond.notify()
        if not keep:
            w.kill()
            if not healthy:
                with self._cond:
                    self.restarts += 1
                    replace = not self._closed and len(self._all) + self._starting < self.max_workers
                    if replace:
                        self._starting += 1
                if replace:
                    try:
                        fresh = self._start()
                    finally:
                        with self._cond:
                            self._starting -= 1
                    self._release(fresh, True)

    def call(self, payload: dict, timeout_s: float) -> dict:
        """One request; the reply, or {"status": "timeout"} / {"status": "crashed"}. Raises WorkerStartError."""
        w = self._acquire()
        healthy = False
        try:
            w.wait_ready()  # a worker's start-up is not counted against the request's time limit
            reply = w.request({**payload, "cpu": int(timeout_s) + 10}, timeout_s)
            healthy = reply.get("status") in ("ok", "error")
            return reply
        finally:
            self._release(w, healthy)

    def warm_up(self) -> None:
        """Start ``max_workers`` workers and wait until every idle one is ready."""
        workers = []
        with self._cond:
            workers.extend(self._idle)
            self._idle.clear()
        while len(workers) < self.max_workers and len(self._all) < self.max_workers:
            workers.append(self._start())
        try:
            for w in workers:
                w.wait_ready()
        finally:
            for w in workers:
                self._release(w, w.proc.poll() is None)

    def shutdown(self, grace_s: float = 0.5) -> None:
        """Stop every worker (idle and busy); the pool refuses later calls."""
        with self._cond:
            self._closed = True
            workers = list(self._all)
            self._all.clear()
            self._idle.clear()
            self._cond.notify_all()
        for w in workers:
            w.close(grace_s)


class SharedPool:
    """The process-wide pool of one kind of worker: created on first use, resized by ``configure``, stopped at exit,
    and forgotten (not killed) in a forked child, which starts its own."""

    def __init__(self, command: Callable[[int], list[str]], name: str, max_workers: int = 2, memory_mb: int = 4096,
                 env: Callable[[], dict[str, str] | None] = lambda: None):  # fmt: skip
        self.command, self.name, self.env = command, name, env
        self.settings = {"max_workers": max_workers, "memory_mb": memory_mb}
        self._lock = threading.Lock()
        self._pool: WorkerPool | None = None
        atexit.register(self.shutdown)
        os.register_at_fork(after_in_child=self._forget_in_child)

    def get(self) -> WorkerPool:
        with self._lock:
            if self._pool is None or self._pool._closed:
                self._pool = WorkerPool(self.command, self.name, env=self.env(), **self.settings)
            return self._pool

    def configure(self, max_workers: int, memory_mb: int) -> None:
        """Size and memory limit of the pool (now and for pools created after a shutdown)."""
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        with self._lock:
            self.settings.update(max_workers=max_workers, memory_mb=memory_mb)
            if self._pool is not None:
                self._pool.configure(max_workers, memory_mb)

    def shutdown(self) -> None:
        """Stop the pool's workers (a later call starts a new pool)."""
        with self._lock:
            p = self._pool
        if p is not None:
            p.shutdown()

    def _forget_in_child(self) -> None:
        """After fork the workers belong to the parent: the child starts its own pool (and never kills the parent's)."""
        self._lock = threading.Lock()
        self._pool = None
