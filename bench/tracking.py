"""MLflow tracking through Lightning's MLFlowLogger: embedded SQLite store by default, a server when the user sets
MLFLOW_TRACKING_URI; metric names sanitised; runs interrupted by Ctrl-C or SIGTERM end as KILLED, not FAILED."""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
from pathlib import Path

from lightning.pytorch.loggers import MLFlowLogger

from bench import ROOT

_BAD = re.compile(r"[^A-Za-z0-9_\-./ ]")


def sanitize(name: str) -> str:
    """MLflow accepts letters, digits, `_ - . /` and space only: `pass@1` -> `pass_at_1`, `a(b)` -> `a_b_`."""
    return _BAD.sub("_", name.replace("@", "_at_"))


def tracking_uri(configured: str | None) -> str:
    return configured or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{ROOT / 'mlflow.db'}"


def sqlite_path(uri: str) -> Path | None:
    """The database file of an embedded SQLite store's URI; None for a server or another backend."""
    return Path(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else None


def artifact_root(uri: str) -> str | None:
    """Artifacts of an embedded SQLite store live beside it (mlartifacts/), not in the current directory."""
    db = sqlite_path(uri)
    return (db.parent / "mlartifacts").resolve().as_uri() if db else None


EXPERIMENT_KIND = "custom_model_development"
"""The experiment's ``mlflow.experimentKind`` tag: a model-training experiment, not a GenAI one. MLflow 3.17's UI also
keeps a browser-wide workflow type that starts as GenAI (its traces overview): UI_QUERY selects the runs table
(checked in headless Chromium; once a user picks "Model training" the browser remembers it)."""
UI_QUERY = "?workflowType=machine_learning"
"""Appended to experiment URLs printed for users (``ui_url``)."""


def ui_url(experiment_id: str, host: str = "http://127.0.0.1:5000") -> str:
    """The MLflow UI address of an experiment's runs table."""
    return f"{host}/#/experiments/{experiment_id}{UI_QUERY}"


# MLflow 3.17's UI colours a run group by a checksum of its id, "tag.<key>.<value>" for a group by a tag, into a palette
# of 29 colours (main.js: `c=e=>{let t=0,n=0;for(...)t=(t+e.charCodeAt(r))%255,n=(n+t)%255;return r.T[(t|n<<8)%r.T
# .length]}`), unless the user picks one in that browser (kept in its localStorage, not in the store). Grouped by
# axis.algorithm, grpo and rloo both come out #f792a6. tests/test_ui.py checks the installed bundle still does this.
UI_PALETTE = ("#a6630c", "#c83243", "#b45091", "#8a63bf", "#434a93", "#137dae", "#04867d", "#308613", "#facb66",
              "#1f272d", "#445461", "#5f7281", "#8396a5", "#93320b", "#be501e", "#de7921", "#f2be88", "#115026",
              "#277c43", "#3ba65e", "#8ddda8", "#9e102c", "#c82d4c", "#e65b77", "#f792a6", "#0e538b", "#2272b4",
              "#4299e0", "#8acaff")  # fmt: skip


def ui_group_color(group_id: str) -> str:
    """The colour MLflow's UI gives a run group (or run) with this id by default."""
    t = n = 0
    for ch in group_id:
        t = (t + ord(ch)) % 255
        n = (n + t) % 255
    return UI_PALETTE[(t | n << 8) % len(UI_PALETTE)]


def _rgb(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


def _far(a: str, b: str, apart: float = 90.0) -> bool:
    """Two palette colours a reader tells apart: RGB distance at least ``apart`` (the palette's shades of one hue,
    #445461 and #5f7281, are 37 apart; its hues 100 or more)."""
    return sum((x - y) ** 2 for x, y in zip(_rgb(a), _rgb(b), strict=True)) ** 0.5 >= apart


UI_STYLES = ("{i} {label}", "{i}. {label}", "{i}) {label}", "({i}) {label}", "#{i} {label}", "{i}: {label}",
             "{i} · {label}", "{i} - {label}", "[{i}] {label}", "{i}/ {label}", "v{i} {label}",
             "{i}| {label}")  # fmt: skip
"""How ``ui_group_values`` numbers a label, in the order tried."""


def ui_group_values(labels: list[str], key: str) -> dict[str, str]:
    """label -> the value of tag ``key`` that names it, such that grouping by ``key`` in MLflow's UI draws every label
    in a colour a reader tells apart from the others': the labels numbered in order ("1 grpo", "2 dr_grpo", ...: the
    legend lists them in the sweep's order) in the first numbering style (UI_STYLES) under which all colours are far
    apart; when none is, each label in turn takes the first style whose colour is far from those already taken, or
    failing that, not yet taken (a sweep of more variants than the palette can separate)."""

    def colour(style: str, i: int, label: str) -> str:
        return ui_group_color(f"tag.{key}.{style.format(i=i, label=label)}")

    for style in UI_STYLES:
        cs = [colour(style, i, label) for i, label in enumerate(labels, 1)]
        if all(_far(a, b) for j, a in enumerate(cs) for b in cs[j + 1 :]):
            return {label: style.format(i=i, label=label) for i, label in enumerate(labels, 1)}
    out, used = {}, []
    for i, label in enumerate(labels, 1):
        far = [s for s in UI_STYLES if all(_far(colour(s, i, label), u) for u in used)]
        new = [s for s in UI_STYLES if colour(s, i, label) not in used]
        style = (far or new or UI_STYLES)[0]
        out[label] = style.format(i=i, label=label)
        used.append(colour(style, i, label))
    return out


WARM_START_EXPERIMENT = "creditbench-warm-starts"
"""SFT warm starts are tracked here, apart from the RL runs that start from them (a cell links to its warm start with
the tags ``warm_start.run_id`` and ``warm_start.path``): one cache, shared by every experiment and sweep."""


def open_client(uri: str):
    """An MlflowClient on ``uri``; an embedded SQLite store is created (or migrated) under a file lock beside it.
    MLflow builds a new store's tables with alembic migrations when the client is made, and they are not safe to run
    twice at once: of two runs started together on a fresh store (two `bench train` in two shells) one failed with
    alembic's "Online migration expected to match one row". The first process to get the lock builds the tables;
    the others wait, then find them built."""
    from mlflow.tracking import MlflowClient

    db = sqlite_path(uri)
    if db is None:
        return MlflowClient(uri)
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return MlflowClient(uri)


def ensure_experiment(client, name: str, uri: str) -> str:
    """The id of experiment ``name`` (created with the store's artifact root if missing), tagged with
    EXPERIMENT_KIND so the UI opens on its runs. Safe when several processes (a sweep's parallel warm starts on a
    fresh store) create it at once: the one that loses the race reads back the winner's."""
    from mlflow.exceptions import MlflowException

    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            client.create_experiment(name, artifact_location=artifact_root(uri))
        except MlflowException:
            if client.get_experiment_by_name(name) is None:  # not the race: a real failure
                raise
        exp = client.get_experiment_by_name(name)
    if exp.tags.get("mlflow.experimentKind") != EXPERIMENT_KIND:
        try:
            client.set_experiment_tag(exp.experiment_id, "mlflow.experimentKind", EXPERIMENT_KIND)
        except MlflowException:  # another process (a rank beside this one) tagged it first
            if client.get_experiment(exp.experiment_id).tags.get("mlflow.experimentKind") != EXPERIMENT_KIND:
                raise
    return exp.experiment_id


def git_commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return (sha.stdout.strip() or "unknown") + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class BenchLogger(MLFlowLogger):
    """MLFlowLogger with sanitised metric names, JSON tables, and a terminal status that says what happened."""

    def __init__(self, *, experiment_name: str, tracking_uri: str, **kwargs):
        ensure_experiment(open_client(tracking_uri), experiment_name, tracking_uri)
        super().__init__(experiment_name=experiment_name, tracking_uri=tracking_uri, **kwargs)
        self.status_override: str | None = None

    def log_metrics(self, metrics, step=None):
        super().log_metrics({sanitize(k): v for k, v in metrics.items()}, step)

    def log_table(self, rows: list[dict], artifact_file: str) -> None:
        if rows:
            columns = {k: [r[k] for r in rows] for k in rows[0]}
            self.experiment.log_table(self.run_id, data=columns, artifact_file=artifact_file)

    def log_text(self, text: str, artifact_file: str) -> None:
        self.experiment.log_text(self.run_id, text, artifact_file)

    def log_jsonl(self, rows: list[dict], artifact_file: str) -> None:
        """One JSON object per line (the per-problem evaluation outcomes the report reads back)."""
        self.log_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows), artifact_file)

    def log_json(self, obj, artifact_file: str) -> None:
        self.log_text(json.dumps(obj, indent=2, default=str), artifact_file)

    def finalize(self, status: str = "success") -> None:
        super().finalize(self.status_override or status)
