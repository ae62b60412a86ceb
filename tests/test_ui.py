"""`make ui` starts lean on a small machine: a real MLflow server, started through the Makefile, measured."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

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


def _ui_bundle() -> str:
    """The installed MLflow UI's JavaScript (the files that define the palette and the colour checksum)."""
    import mlflow

    js = Path(mlflow.__file__).parent / "server" / "js" / "build" / "static" / "js"
    return "".join(p.read_text(errors="replace") for p in sorted(js.glob("*.js")))


def test_the_installed_mlflow_ui_colours_groups_as_bench_tracking_says():
    """bench.tracking.ui_group_color is MLflow's own rule, read off the installed UI bundle: the same 29-colour
    palette in the same order, and a checksum over the group id with the same shape. If an MLflow upgrade changes
    either, this fails and the rule (and ui_group_values) must be read off again."""
    from bench.tracking import UI_PALETTE

    text = _ui_bundle()
    assert "[" + ",".join(f'"{c}"' for c in UI_PALETTE) + "]" in text, "the palette changed"
    checksum = re.compile(
        r"(\w)=\((\1)\+(\w)\.charCodeAt\((\w)\)\)%255,(\w)=\((\5)\+\1\)%255;"
        r"return (\w)\.T\[\(\1\|\5<<8\)%\7\.T\.length\]"
    )
    assert checksum.search(text), "the colour checksum changed"
    assert "groupId:" in text and '"mlflow.runColor"' in text


def test_the_default_sweeps_groups_get_colours_a_reader_tells_apart():
    """Grouped by axis.algorithm, MLflow draws grpo and rloo in the same colour (#f792a6, as the committed
    ui3_charts.png showed); grouped by the `variant` tag a sweep writes, the default sweep's four variants get four
    colours at least 90 apart in RGB (was: two of the four identical)."""
    from bench.run.sweep import Sweep, load_plan
    from bench.tracking import _far, ui_group_color

    assert ui_group_color("tag.axis.algorithm.grpo") == ui_group_color("tag.axis.algorithm.rloo") == "#f792a6"
    spec, cells = load_plan("default", ["tracking.tracking_uri=sqlite:////tmp/creditbench-ui-test.db"])
    values = Sweep.group_values_of(spec, cells)
    assert sorted(values) == ["dapo", "dr_grpo", "grpo", "rloo"]
    colours = [ui_group_color(f"tag.variant.{v}") for v in values.values()]
    assert all(_far(a, b) for i, a in enumerate(colours) for b in colours[i + 1 :]), (values, colours)
    assert all(v.endswith(label) for label, v in values.items())  # the legend still reads the algorithm


def test_make_ui_on_a_busy_port_fails_naming_the_port_and_the_fix():
    """A port something else listens on: `make ui` exits non-zero with the port, what holds it and the UI_PORT to
    choose, and starts no MLflow (was: "address already in use", exit 0, the browser showing the other program)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        proc = subprocess.run(["make", "-s", "-o", "install", "ui", f"UI_PORT={port}"], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)  # fmt: skip
    assert proc.returncode != 0, proc.stdout + proc.stderr
    err = proc.stderr
    assert f"port {port} on 127.0.0.1 is already in use by process {os.getpid()}" in err, err
    assert f"make ui UI_PORT={port + 1}" in err and "was not started" in err, err


def test_the_sweeps_last_line_names_a_command_that_exists():
    """The line that ends a sweep names `make ui` or this interpreter's `-m bench ui` (was: a bare `mlflow ui`, not on
    PATH outside the venv)."""
    import sys

    from bench.cli import ui_hint
    from bench.tracking import tracking_uri

    own = ui_hint(tracking_uri(None), "7")
    assert "make ui" in own and f"{sys.executable} -m bench ui" in own and "mlflow ui" not in own
    other = ui_hint("sqlite:////tmp/elsewhere.db", "7")
    assert f"MLFLOW_TRACKING_URI=sqlite:////tmp/elsewhere.db {sys.executable} -m bench ui" in other
