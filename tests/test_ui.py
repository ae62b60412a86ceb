"""`make ui` starts lean on a small machine: a real MLflow server, started through the Makefile, measured."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request

import pytest

from bench import ROOT


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _session(sid: int) -> list[tuple[int, int]]:
    """(pid, RSS kB) of every process in session ``sid``."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.getsid(int(pid)) != sid:
                continue
            rss = next(line for line in open(f"/proc/{pid}/status") if line.startswith("VmRSS:"))
            out.append((int(pid), int(rss.split()[1])))
        except (OSError, StopIteration):
            continue
    return out


@pytest.mark.slow
def test_make_ui_starts_one_worker_and_no_job_runner(tmp_path):
    """MLflow's defaults started 17 processes and ~3.2 GB on 2 cores; `make ui` starts at most 5 and under 1 GB."""
    port = _free_port()
    proc = subprocess.Popen(
        ["make", "-s", "-o", "install", "ui", f"UI_PORT={port}"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(1)
        else:
            pytest.fail("the MLflow UI did not answer /health within 120 s")
        time.sleep(3)  # anything started lazily after the first request
        procs = _session(proc.pid)
        rss_mb = sum(kb for _, kb in procs) / 1024
        assert len(procs) <= 5, f"{len(procs)} processes: {procs}"
        assert rss_mb < 1024, f"{rss_mb:.0f} MB"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
