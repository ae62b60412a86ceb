"""The folders are floors: orchestration (bench/run: train, sweep, report) sits on the RL, preference and engine
floors and the shared statistics, never under them."""

from __future__ import annotations

import ast

from bench import ROOT

LOWER = ["bench/rl", "bench/pref", "bench/engine", "bench/stats.py", "bench/dist.py", "bench/task.py", "algorithms"]
# The one known exception, imported lazily: TGDPO's token weights come from a DPO run trained (and cached) on first use.
ALLOWED = {"bench/pref/module.py": ["bench.run.train"]}


def _imports(path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_no_lower_floor_imports_the_orchestration_floor():
    """bench/rl/module.py used to import bench/run/stats.py (pass@k, SEs): the statistics now live in bench/stats.py,
    below both."""
    files = [p for e in LOWER for p in ((ROOT / e).rglob("*.py") if (ROOT / e).is_dir() else [ROOT / e])]
    assert len(files) > 20
    found = {str(p.relative_to(ROOT)): sorted(m for m in _imports(p) if m == "bench.run" or m.startswith("bench.run."))
             for p in files}  # fmt: skip
    bad = {k: v for k, v in found.items() if v and v != ALLOWED.get(k)}
    assert not bad, bad
