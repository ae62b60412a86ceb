"""Carry a sweep's finished runs from one tracking store to another: ``python -m bench export <sweep> --runs DIR``
writes each finished cell (and the sweep's parent run) as ``DIR/<run id>/run.json`` (params, tags, every metric's
history, status and times) beside its artifacts (the per-problem outcomes the report pairs); ``python -m bench import
<sweep> --runs DIR`` recreates them in this machine's store, where the sweep then skips those cells and the report
reads them as if they had run there. For a sweep spread over machines or sessions that share no store (a machine
handed out for hours, started bare each time): plain text, so a folder of finished cells can be committed.

mlflow-export-import (MLflow's own tool) does this for MLflow 2; on MLflow 3.17 its import of a second run into a
SQLite store fails (the experiment's "already exists" comes back as a SQLAlchemy error, not the REST error it catches)
and it marks every imported run FINISHED whatever its status, which would make a sweep skip a cell that was stopped.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from mlflow.entities import Metric, Param, RunTag

from bench.config import ConfigError
from bench.run.sweep import Sweep

PARENT = "mlflow.parentRunId"
BATCH = 1000  # MLflow's log_batch limit on metrics per call


def _runs(sweep: Sweep) -> list:
    """The sweep's parent run(s) and its finished cells: what a report needs and what a restarted sweep skips."""
    return sweep.runs(role="sweep") + [r for r in sweep.runs(role="cell") if r.info.status == "FINISHED"]


def export_runs(sweep: Sweep, out: Path) -> int:
    """Write the sweep's finished cells and parent run under ``out``; returns how many runs were written."""
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    for run in _runs(sweep):
        rid = run.info.run_id
        first = run.data.tags.get("carried_from", rid)  # a run imported before keeps its first id: one folder a run
        d = out / first
        if d.exists():
            shutil.rmtree(d)
        d.mkdir()
        metrics = {
            key: [[m.step, m.timestamp, m.value] for m in sweep.client.get_metric_history(rid, key)]
            for key in sorted(run.data.metrics)
        }
        record = {
            "run_id": first,
            "run_name": run.info.run_name,
            "status": run.info.status,
            "start_time": run.info.start_time,
            "end_time": run.info.end_time,
            "params": dict(sorted(run.data.params.items())),
            "tags": dict(sorted(run.data.tags.items())),
            "metrics": metrics,
        }
        (d / "run.json").write_text(json.dumps(record, indent=1) + "\n")
        if sweep.client.list_artifacts(rid):
            with tempfile.TemporaryDirectory() as tmp:
                local = Path(sweep.client.download_artifacts(rid, "", tmp))
                shutil.copytree(local, d / "artifacts")
        n += 1
    return n


def import_runs(sweep: Sweep, src: Path) -> tuple[int, int]:
    """Recreate the runs exported under ``src`` in ``sweep``'s store, skipping a cell already finished there (so an
    import can be repeated); returns (imported, skipped). Each run keeps its params, tags, metric histories, status
    and times, its parent link points at this store's parent run, and the tag ``carried_from`` names its source."""
    records = [json.loads(p.read_text()) for p in sorted(src.glob("*/run.json"))]
    if not records:
        raise ConfigError(
            f"no exported runs (<run id>/run.json) under {src}; write them with `python -m bench export "
            f"{sweep.spec.name} --runs {src}` on the machine whose store holds them"
        )
    other = {r["tags"].get("sweep") for r in records} - {sweep.spec.name}
    if other:
        raise ConfigError(f"{src} holds runs of sweep(s) {sorted(other)}, not {sweep.spec.name!r}: import them with "
                          f"`python -m bench import {sorted(other)[0]} --runs {src}`")  # fmt: skip
    done = {r.data.tags.get("sweep.cell") for r in sweep.runs(role="cell") if r.info.status == "FINISHED"}
    here = sweep.runs(role="sweep")
    parent = here[0].info.run_id if here else None
    imported = skipped = 0
    for rec in sorted(records, key=lambda r: r["tags"].get("role") != "sweep"):  # the parent first
        is_parent = rec["tags"].get("role") == "sweep"
        if is_parent and parent is not None:
            continue  # this store's parent run stays the sweep's parent
        if not is_parent and rec["tags"].get("sweep.cell") in done:
            skipped += 1
            continue
        tags = {**rec["tags"], "carried_from": rec["run_id"]}
        if not is_parent:  # nested under this store's parent run (the imported one, else the sweep's own)
            parent = parent or sweep.parent_run()
            tags[PARENT] = parent
        run = sweep.client.create_run(sweep.exp_id, start_time=rec["start_time"], run_name=rec["run_name"])
        rid = run.info.run_id
        metrics = [Metric(k, v, ts, step) for k, hist in rec["metrics"].items() for step, ts, v in hist]
        sweep.client.log_batch(rid, params=[Param(k, v) for k, v in rec["params"].items()],
                               tags=[RunTag(k, v) for k, v in tags.items()])  # fmt: skip
        for i in range(0, len(metrics), BATCH):
            sweep.client.log_batch(rid, metrics=metrics[i : i + BATCH])
        if (src / rec["run_id"] / "artifacts").is_dir():
            sweep.client.log_artifacts(rid, str(src / rec["run_id"] / "artifacts"))
        sweep.client.set_terminated(rid, rec["status"], end_time=rec["end_time"])
        if is_parent:
            parent = rid
        imported += 1
    return imported, skipped
