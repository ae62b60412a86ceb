"""Sweeps: algorithms x tasks x models x seeds x any config key, run as cells on a local pool or a Ray cluster.

    python -m bench sweep default            # conf/sweep/default.yaml (or a path to a sweep file)
    python -m bench sweep default --launcher ray --ray-address auto
    python -m bench report default

A sweep file declares ``axes`` (each a list of values; ``algorithm``, ``task`` and ``model`` select files, any other
key is a config override such as ``algorithm.clip_eps_high``), shared ``overrides`` and ``exclude`` patterns.
Each cell is a real ``python -m bench train`` process whose resolved config is written to
``<output_dir>/sweeps/<name>/cells/<id>.yaml``; the cell's identity ``<id>`` is the hash of that config without the
keys that do not change what it computes (tracking, output paths, threads, progress bar).

Exactly once: one driver per sweep (a lock file); every cell run is tagged ``sweep.cell=<id>``. On (re)start the
driver looks each cell up in MLflow: a FINISHED run means done; a KILLED run with a checkpoint (the cell was stopped
by SIGTERM or Ctrl-C at a step boundary) is resumed in the same MLflow run; anything else (a run left RUNNING by a
SIGKILL, a FAILED attempt) is deleted and the cell starts afresh. Cell processes die with the driver (Linux
PR_SET_PDEATHSIG), so a SIGKILLed driver leaves no orphan that could finish a cell twice.
"""

from __future__ import annotations

import ctypes
import fcntl
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from bench import ROOT
from bench.config import CONF, ConfigError, compose, config_hash, omegaconf_message, to_yaml
from bench.registry import RegistryError, did_you_mean, include_args
from bench.task import sft_task
from bench.tracking import WARM_START_EXPERIMENT, ensure_experiment, open_client, tracking_uri, ui_group_values

# Keys that do not change what a cell computes: left out of its identity.
NOT_IN_IDENTITY = (
    "tracking",
    "output_dir",
    "cache_dir",
    "task.data_root",  # where the data lies on this machine (BENCH_DATA), not what a cell computes
    "resume",
    "trainer.progress_bar",
    "trainer.num_threads",
    "trainer.checkpoint_every",
    "trainer.keep_checkpoint",
    "eval.share_start",  # a saving, not a change: the shared evaluation is the one the cell would compute
)
SELECTOR_AXES = ("algorithm", "task", "model")


@dataclass
class Resources:
    cpus_per_cell: int | None = None
    """Threads (and Ray CPUs) per cell; None: the machine's cores split evenly across the workers."""
    gpus_per_cell: float = 0.0
    """Ray GPUs per cell (fractions share a GPU)."""
    devices_per_cell: int = 1
    """Devices one cell's run spreads over (its ``trainer.devices``: Lightning's DDP, or ``trainer.strategy``). The
    local launcher hands each running cell a disjoint set of that many GPUs (CUDA_VISIBLE_DEVICES) and runs at most
    (GPUs // devices_per_cell) cells at once; on CPU each cell's processes share its threads. On Ray a cell's task asks
    for that many GPUs when gpus_per_cell > 0, and for devices_per_cell x cpus_per_cell CPUs."""


@dataclass
class ReportSpec:
    metric: str = "eval/accuracy"
    """The held-out metric the report summarises."""
    threshold: float | None = None
    """Steps/tokens-to-threshold target; None: the cells' mean starting value + 0.05."""
    x_axis: str = "step"
    """step | samples | tokens: the x-axis of the learning-curve PNGs."""
    out: str | None = None
    """Where the report goes; None: results/<sweep name>/."""
    baseline: str | None = None
    """The variant every other is compared with (paired where seeds match); None: the first algorithm of the axes."""
    target_effect: float = 0.02
    """The effect the power section asks about: how many seeds would detect a difference this large."""
    alpha: float = 0.05
    """Two-sided level of every interval and test."""
    power: float = 0.8
    """Power of the minimum detectable effect."""
    correction: str = "holm"
    """Multiple-comparison adjustment of the baseline comparisons: holm (family-wise) or bh (false discovery rate)."""
    interval: str = "t"
    """t: Student t on the seeds x problems variance (covers at few seeds); bootstrap: percentile hierarchical
    bootstrap (for many seeds; undercovers at 3-5, bench/stats.py)."""
    bootstrap_reps: int = 2000
    """Bootstrap replicates (rliable aggregates, probability of improvement, noise decomposition)."""
    fit_reps: int = 100
    """Seed-bootstrap refits behind the compute-curve fits' CIs."""
    settings: list[str] = field(default_factory=list)
    """Axes whose values are separate settings, each analysed like a task of its own (its own baseline comparisons
    and power), e.g. [task.horizon]; the first is the x-axis of the report's setting curves (horizon.png)."""
    until_step: int | None = None
    """Read every run only up to this training step: "final" is then the value at its last evaluation at or before
    it, the AUC covers 0..until_step, and the budget axes stop there too (early learning: which method is ahead after
    10 steps). None: the whole run."""
    join: list[str] = field(default_factory=list)
    """Other sweeps (names or files, in the same tracking store) whose finished cells of this sweep's tasks join the
    report as further variants, paired by seed: a new variant compared with a committed sweep's baseline without
    rerunning it. Their cells must share this sweep's warm starts and prompt streams for the pairing to mean anything
    (same task overrides, init and warm_start.seed); the report names each joined sweep and its commit."""
    ui_url: str | None = None
    """The MLflow UI's address, for the images of the report copy logged to the parent run (MLflow's markdown viewer
    shows only absolute image links); None: the tracking server when it is one, else http://127.0.0.1:5000 (make ui)."""


@dataclass
class Variant:
    algorithm: str = "???"
    """The algorithm file (algorithms/<name>.py) the variant runs."""
    overrides: list[str] = field(default_factory=list)
    """key=value applied to the variant's cells after the algorithm's own overrides."""


@dataclass
class TaskVariant:
    task: str = "???"
    """The task file (tasks/<name>.py) the setting runs."""
    overrides: list[str] = field(default_factory=list)
    """key=value applied to the setting's cells after the sweep's shared overrides (e.g. a generator's parameters)."""


@dataclass
class SweepSpec:
    name: str = ""
    description: str = ""
    axes: dict[str, Any] = field(default_factory=dict)
    """Axis -> list of values, crossed in the order given (seed last reads best)."""
    overrides: list[str] = field(default_factory=list)
    """key=value applied to every cell (after conf/, before the axis values)."""
    exclude: list[Any] = field(default_factory=list)
    """Cells to skip: each a mapping of axis -> value or list of values (every axis must match; a list: any of it)."""
    algorithm_overrides: dict[str, list[str]] = field(default_factory=dict)
    """Algorithm -> key=value applied to its cells only, after the shared overrides (e.g. gtpo: the normalisation
    and dynamic sampling its comparison needs)."""
    variants: dict[str, Variant] = field(default_factory=dict)
    """Named variants, usable as values of the algorithm axis: name -> an algorithm and overrides applied to its cells
    after the algorithm's own (e.g. grpo_partial: GRPO rewarded with the partial score). The report labels its rows
    with the name."""
    tasks: dict[str, TaskVariant] = field(default_factory=dict)
    """Named task settings, usable as values of the task axis: name -> a task and overrides (e.g. rg_arith:
    reasoning_gym with one generator and its difficulty). The report analyses each as a task of its own, by name."""
    experiment: str | None = None
    """MLflow experiment; None: sweep-<name>."""
    launcher: str = "local"
    """local | ray."""
    workers: int = 2
    """Cells run at once (local launcher; with Ray the cluster's resources decide)."""
    max_retries: int = 1
    """A failed cell is retried this many times, then reported."""
    ray_address: str | None = None
    """None: start a local Ray cluster; 'auto' or host:port: join a running one."""
    resources: Resources = field(default_factory=Resources)
    report: ReportSpec = field(default_factory=ReportSpec)


def sweep_path(name: str) -> Path:
    p = Path(name)
    if p.suffix in (".yaml", ".yml") and p.exists():
        return p
    path = CONF / "sweep" / f"{name}.yaml"
    if not path.exists():
        avail = sorted(q.stem for q in (CONF / "sweep").glob("*.yaml"))
        raise ConfigError(f"unknown sweep {name!r}. Available: {', '.join(avail)}." + did_you_mean(name, avail))
    return path


def load_spec(name: str, overrides: list[str] = ()) -> SweepSpec:
    path = sweep_path(name)
    schema = OmegaConf.structured(SweepSpec)
    try:
        spec = OmegaConf.merge(schema, OmegaConf.load(path), OmegaConf.from_dotlist(list(overrides)))
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", "") or ""
        nested = {"resources": Resources, "report": ReportSpec}
        head, _, tail = key.partition(".")
        valid = list((nested[head] if tail and head in nested else SweepSpec).__dataclass_fields__)
        hint = did_you_mean(tail or head, valid) or f" Valid keys: {', '.join(valid)}."
        where = f"{path} or the sweep.* overrides" if overrides else str(path)
        raise ConfigError(f"bad sweep key {key!r} in {where}: {omegaconf_message(e)}.{hint}") from None
    except (
        TypeError,
        ValueError,
    ) as e:  # e.g. sweep.axes.algorithm.clip_eps_high=[...] against the list axes.algorithm
        raise ConfigError(
            f"sweep overrides {list(overrides)} do not fit {path} ({e}): a new axis whose key has dots is written "
            "whole, e.g. sweep.axes='{algorithm.clip_eps_high: [0.2, 0.3]}'."
        ) from None
    spec = OmegaConf.to_object(spec)
    spec.name = spec.name or path.stem
    for axis, values in spec.axes.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"sweep {spec.name}: axis {axis!r} must be a non-empty list of values, got {values!r}")
    if spec.launcher not in LAUNCHERS:
        raise ConfigError(f"sweep {spec.name}: unknown launcher {spec.launcher!r}; available: {', '.join(LAUNCHERS)}")
    numeric = [k for k in spec.report.settings if numeric_axis(spec.axes.get(k, []))]
    knob = spec.report.settings[0] if spec.report.settings else None
    if numeric and knob not in numeric:  # all-categorical settings (e.g. [trainer.precision]) draw no setting curves
        raise ConfigError(
            f"sweep {spec.name}: report.settings[0] = {knob!r} is the x-axis of the setting curves and must take "
            f"numbers (its values: {spec.axes[knob]}); put a numeric axis first, e.g. settings: [task.horizon] "
            "(the task is always part of a setting)."
        )
    return spec


def _arg(key: str, value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return f"{key}={text}"


def numeric_axis(values) -> bool:
    """Whether an axis takes numbers (a report setting's x-axis must: settings curves plot against it)."""
    return bool(values) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


def setting_name(key: str) -> str:
    """How a report.settings axis is named in the report: task.horizon -> horizon; other keys in full."""
    return key.removeprefix("task.")


@dataclass
class Cell:
    axes: dict[str, Any]
    cfg: DictConfig
    id: str
    name: str
    where: str = ""
    """The setting the report analyses it in: the task, plus the values of report.settings axes."""

    @property
    def label(self) -> str:
        return " ".join(f"{k.split('.')[-1]}={v}" for k, v in self.axes.items())


def _matches(value: Any, pattern: Any) -> bool:
    """An exclude pattern's value: one axis value, or a list of them (any matches)."""
    options = pattern if isinstance(pattern, list | tuple) else [pattern]
    return str(value) in {str(o) for o in options}


def plan(spec: SweepSpec, extra: list[str] = ()) -> list[Cell]:
    """Every cell of the grid (excludes removed), its config composed and validated now, not mid-sweep."""
    keys = list(spec.axes)
    cells, seen = [], {}
    for values in itertools.product(*(spec.axes[k] for k in keys)):
        axes = dict(zip(keys, values, strict=True))
        if any(all(_matches(axes.get(k), v) for k, v in ex.items()) for ex in spec.exclude):
            continue
        variant = spec.variants.get(str(axes.get("algorithm")))
        setting = spec.tasks.get(str(axes.get("task")))
        selected = {**axes, "algorithm": variant.algorithm} if variant else dict(axes)
        if setting:
            selected["task"] = setting.task
        args = [_arg(k, v) for k, v in selected.items() if k in SELECTOR_AXES]
        args += list(spec.overrides) + (list(setting.overrides) if setting else [])
        args += list(spec.algorithm_overrides.get(str(selected.get("algorithm")), []))
        args += list(variant.overrides) if variant else []
        args += [_arg(k, v) for k, v in axes.items() if k not in SELECTOR_AXES] + list(extra)
        try:
            cfg = compose(args)
        except ConfigError as e:
            if e.key in axes and e.key not in SELECTOR_AXES:
                raise ConfigError(
                    f"sweep {spec.name}: axis {e.key!r} is not a config key.{e.hint} Rename the axis in the sweep "
                    "file (or in the sweep.axes override)."
                ) from None
            raise ConfigError(f"sweep {spec.name}, cell {axes}: {e}") from None
        except RegistryError as e:
            raise ConfigError(f"sweep {spec.name}, cell {axes}: {e}") from None
        cid = config_hash(cfg, drop=NOT_IN_IDENTITY)
        if cid in seen:  # two axis values that resolve to the same run
            print(f"[sweep] note: {axes} is the same run as {seen[cid]}; running it once")
            continue
        seen[cid] = axes
        name = "-".join(str(axes[k]) for k in ("task", "algorithm") if k in axes) or cfg.algorithm.name
        name += "".join(f"-{k.split('.')[-1]}={v}" for k, v in axes.items() if k not in (*SELECTOR_AXES, "seed"))
        where = (str(axes["task"]) if setting else cfg.task.name) + "".join(
            f" {setting_name(k)}={axes[k]}" for k in spec.report.settings if k in axes
        )
        cells.append(Cell(axes, cfg, cid, f"{name}-s{cfg.seed}", where))
    if not cells:
        raise ConfigError(f"sweep {spec.name}: the grid is empty (every cell excluded?)")
    return cells


def variants(cells: list[Cell], settings: list[str] = ()) -> dict[str, str]:
    """Cell id -> its row label: the algorithm, plus each other axis (not task, seed or a report setting) whose value
    varies among that algorithm's cells (an axis held fixed for an algorithm by the excludes says nothing about it)."""

    def algo(c: Cell) -> str:
        return str(c.axes.get("algorithm", c.cfg.algorithm.name))

    def head(c: Cell) -> list[str]:  # the algorithm as a report setting names the section, not the row
        return [] if "algorithm" in settings else [algo(c)]

    varying = {
        a: [k for k in cells[0].axes if k not in ("task", "seed", "algorithm", *settings)
            and len({str(c.axes[k]) for c in cells if algo(c) == a}) > 1]
        for a in {algo(c) for c in cells}
    }  # fmt: skip
    return {c.id: " ".join([*head(c), *(f"{k.split('.')[-1]}={c.axes[k]}" for k in varying[algo(c)])]) for c in cells}


# ---- launchers: run one command to completion, return its exit status -----------------------------------------
def _die_with_parent() -> None:
    """Child side of fork: SIGKILL this process when the driver thread that started it dies (Linux)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except OSError:
        pass


class LocalLauncher:
    """Cells as subprocesses of the driver, ``workers`` at a time; with GPUs, each running cell holds its own
    ``resources.devices_per_cell`` of them."""

    def __init__(self, spec: SweepSpec):
        n = spec.resources.devices_per_cell
        gpus = _visible_gpus()
        self.free: list[str] | None = None
        self.concurrency = spec.workers
        if gpus:
            if len(gpus) < n:
                raise ConfigError(f"resources.devices_per_cell={n}: this machine has {len(gpus)} GPU(s) ({gpus})")
            self.free = gpus
            self.concurrency = min(spec.workers, len(gpus) // n)
        self.per_cell = n
        self.procs: set[subprocess.Popen] = set()
        self.lock = threading.Lock()
        self.stopping = False

    def run(self, argv: list[str], log: Path, cpus: int, gpus: float, env: dict[str, str]) -> int:
        held: list[str] = []
        if self.free is not None:  # at most `concurrency` cells run, so enough GPUs are free for this one
            with self.lock:
                held, self.free = self.free[: self.per_cell], self.free[self.per_cell :]
            env = {**env, "CUDA_VISIBLE_DEVICES": ",".join(held)}
        try:
            with log.open("a") as f, self.lock:
                # launched and registered under the lock: a stop() between the two once missed a cell starting up,
                # which then trained on after the driver was told to stop
                if self.stopping:
                    return -signal.SIGTERM
                proc = subprocess.Popen(
                    argv, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env, preexec_fn=_die_with_parent
                )
                self.procs.add(proc)
            try:
                return proc.wait()
            finally:
                with self.lock:
                    self.procs.discard(proc)
        finally:
            if held:
                with self.lock:
                    self.free = self.free + held

    def stop(self) -> None:
        """Graceful: SIGTERM lets each cell checkpoint at a step boundary and mark its MLflow run KILLED."""
        with self.lock:
            self.stopping = True  # and no cell starts after this
            for p in self.procs:
                p.send_signal(signal.SIGTERM)

    def close(self) -> None:
        pass


def _visible_gpus() -> list[str]:
    """The GPUs this driver may hand out (CUDA_VISIBLE_DEVICES when set), without initialising CUDA here."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        return [d for d in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


RAY_ASSIGNS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ONEAPI_DEVICE_SELECTOR")
"""What Ray sets in each task's environment to give it its accelerators: never taken from the driver's."""


def cell_env(worker: dict[str, str], driver: dict[str, str]) -> dict[str, str]:
    """A Ray cell's environment: the driver's (its paths, data root, tracking URI) over the Ray worker's, except the
    device assignment, which stays Ray's (a CUDA_VISIBLE_DEVICES exported in the driver's shell, or set by SLURM,
    would otherwise hand every cell the same GPUs)."""
    return {**worker, **{k: v for k, v in driver.items() if k not in RAY_ASSIGNS}}


def _ray_run(argv: list[str], cwd: str, env: dict[str, str]) -> tuple[int, str]:
    proc = subprocess.run(
        argv, cwd=cwd, env=cell_env(dict(os.environ), env), capture_output=True, text=True, preexec_fn=_die_with_parent
    )
    return proc.returncode, proc.stdout + proc.stderr


class RayLauncher:
    """Each cell a Ray task declaring its CPUs and GPUs; a local cluster by default, or ``ray_address``. The cell's
    process runs on whichever node Ray picks, so on a multi-node cluster the repository, data root, cache and
    MLflow tracking URI must be reachable at the same paths from every node (a tracking server, shared storage)."""

    def __init__(self, spec: SweepSpec):
        import ray

        self.ray, self.per_cell = ray, spec.resources.devices_per_cell
        if not ray.is_initialized():
            ray.init(address=spec.ray_address, include_dashboard=False, log_to_driver=False)
        self.remote = ray.remote(_ray_run)
        self.concurrency = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self.refs: set = set()
        self.lock = threading.Lock()

    def run(self, argv: list[str], log: Path, cpus: int, gpus: float, env: dict[str, str]) -> int:
        if gpus > 0 and self.per_cell > 1:  # whole GPUs, one per rank (Ray sets the task's CUDA_VISIBLE_DEVICES)
            gpus = float(self.per_cell)
        cpus *= self.per_cell  # each rank its threads
        ref = self.remote.options(num_cpus=cpus, num_gpus=gpus, max_retries=0).remote(argv, str(ROOT), env)
        with self.lock:
            self.refs.add(ref)
        try:
            rc, out = self.ray.get(ref)
        except Exception as e:  # a Ray-level failure (worker died, task cancelled) is a failed attempt
            rc, out = 1, f"ray task failed: {e!r}\n"
        finally:
            with self.lock:
                self.refs.discard(ref)
        with log.open("a") as f:
            f.write(out)
        return rc

    def stop(self) -> None:
        with self.lock:
            for ref in self.refs:
                self.ray.cancel(ref)

    def close(self) -> None:
        self.ray.shutdown()


LAUNCHERS: dict[str, Callable[[SweepSpec], Any]] = {"local": LocalLauncher, "ray": RayLauncher}


# ---- the driver --------------------------------------------------------------------------------------------------
class Sweep:
    def __init__(self, spec: SweepSpec, cells: list[Cell], *, uri: str | None = None):
        self.spec, self.cells = spec, cells
        self.uri = tracking_uri(uri or cells[0].cfg.tracking.tracking_uri)
        self.client = open_client(self.uri)
        self.experiment = spec.experiment or f"sweep-{spec.name}"
        self.exp_id = ensure_experiment(self.client, self.experiment, self.uri)
        self.dir = Path(cells[0].cfg.output_dir)
        self.dir = (self.dir if self.dir.is_absolute() else ROOT / self.dir) / "sweeps" / spec.name
        # The report's row label of each cell, and its value of the `variant` tag: the label with the ordinal that
        # gives every variant of the sweep its own group colour in the MLflow UI (bench.tracking.ui_group_values).
        self.labels = variants(cells, spec.report.settings)
        self.group_values = self.group_values_of(spec, cells)
        (self.dir / "cells").mkdir(parents=True, exist_ok=True)
        (self.dir / "logs").mkdir(parents=True, exist_ok=True)

    @staticmethod
    def group_values_of(spec: SweepSpec, cells: list[Cell]) -> dict[str, str]:
        """Report label -> the cells' `variant` tag (bench.tracking.ui_group_values)."""
        labels = variants(cells, spec.report.settings)
        return ui_group_values(list(dict.fromkeys(labels[c.id] for c in cells)), "variant")

    # -- MLflow bookkeeping
    def runs(self, **tags: str) -> list:
        filt = " and ".join([f"tags.sweep = '{self.spec.name}'"] + [f"tags.`{k}` = '{v}'" for k, v in tags.items()])
        return self.client.search_runs([self.exp_id], filt, max_results=50000)

    def parent_run(self, overrides: list[str] = ()) -> str:
        """The sweep's parent run (created once), with this invocation's command-line overrides recorded: the tag
        ``sweep.overrides`` holds the latest invocation's, ``invocations/<time>.json`` every invocation's."""
        found = self.runs(role="sweep")
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        if found:
            rid = found[0].info.run_id
            self.client.update_run(rid, status="RUNNING")
            self.client.set_tag(rid, "restarted", stamp)
            self._record(rid, overrides, stamp)
            return rid
        run = self.client.create_run(
            self.exp_id, run_name=f"sweep-{self.spec.name}", tags={"sweep": self.spec.name, "role": "sweep"}
        )
        rid = run.info.run_id
        self.client.log_text(rid, OmegaConf.to_yaml(OmegaConf.structured(self.spec)), "sweep.yaml")
        for k, v in self.spec.axes.items():
            self.client.log_param(rid, f"axis.{k}", json.dumps(v)[:6000])
        self.client.log_param(rid, "cells", len(self.cells))
        self._record(rid, overrides, stamp)
        return rid

    def _record(self, rid: str, overrides: list[str], stamp: str) -> None:
        self.client.set_tag(rid, "sweep.overrides", json.dumps(list(overrides))[:5000])
        record = {"time": stamp, "overrides": list(overrides), "argv": sys.argv, "cells": len(self.cells)}
        name = f"{stamp.replace(':', '')}-{time.time_ns() % 10**9:09d}"
        self.client.log_text(rid, json.dumps(record, indent=2), f"invocations/{name}.json")

    def cell_config(self, cell: Cell, parent: str, threads: int) -> Path:
        cfg = OmegaConf.create(OmegaConf.to_container(cell.cfg))
        cfg.tracking.tracking_uri = self.uri
        cfg.tracking.experiment = self.experiment
        cfg.tracking.run_name = cell.name
        cfg.tracking.parent_run_id = parent
        cfg.tracking.tags = {
            "sweep": self.spec.name,
            "sweep.cell": cell.id,
            "role": "cell",
            "variant": self.group_values[self.labels[cell.id]],
            **{f"axis.{k}": str(v) for k, v in cell.axes.items()},
        }
        cfg.trainer.progress_bar = False
        cfg.trainer.num_threads = threads
        if self.spec.resources.devices_per_cell > 1:  # one run on several devices (bench/dist.py)
            cfg.trainer.devices = self.spec.resources.devices_per_cell
        path = self.dir / "cells" / f"{cell.id}.yaml"
        path.write_text(to_yaml(cfg))
        return path

    def prepare(self, cell: Cell, threads: int | None = None) -> list[str] | None:
        """What this cell needs now: None (done), or the command that finishes it (a resume or a fresh start). A
        resume runs on ``threads`` (this invocation's share of the cores), not on the share saved with the run: a
        cell stopped under 2 workers and resumed under 1 ran on 1 core of 2 (26 s a step against 11)."""
        runs = self.runs(**{"sweep.cell": cell.id})
        if any(r.info.status == "FINISHED" for r in runs):
            for r in runs:  # leftovers of earlier attempts
                if r.info.status != "FINISHED":
                    self.client.delete_run(r.info.run_id)
            return None
        resumable = [
            r
            for r in runs
            if r.info.status == "KILLED" and (Path(r.data.tags.get("run_dir", "/nonexistent")) / "checkpoints").exists()
        ]
        keep = resumable[0] if resumable else None
        for r in runs:
            if r is not keep:  # a run left RUNNING by a SIGKILL, or a failed attempt: superseded by a fresh start
                self.client.delete_run(r.info.run_id)
        cmd = [sys.executable, "-m", "bench", "train", *include_args()]
        if keep is not None:
            share = [f"trainer.num_threads={threads}"] if threads else []
            return cmd + [f"resume={keep.data.tags['run_dir']}", *share]
        return cmd + [f"config_file={self.dir / 'cells' / f'{cell.id}.yaml'}"]

    def stale_warm_starts(self) -> None:
        """Warm-start runs left RUNNING by a killed driver: their cache entry was never completed; mark them."""
        exp = self.client.get_experiment_by_name(WARM_START_EXPERIMENT)
        found = exp and self.client.search_runs(
            [exp.experiment_id], f"tags.sweep = '{self.spec.name}' and tags.role = 'warm_start'", max_results=50000
        )
        for r in found or ():
            if r.info.status == "RUNNING":
                self.client.set_tag(r.info.run_id, "interrupted", "sweep driver stopped")
                self.client.set_terminated(r.info.run_id, "KILLED")

    # -- running
    def run(self, launcher_name: str | None = None, overrides: list[str] = ()) -> dict[str, list[str]]:
        lock = open(self.dir / "driver.lock", "w")  # noqa: SIM115 (held for the driver's lifetime)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                f"another driver is already running sweep {self.spec.name!r} (lock {self.dir / 'driver.lock'})"
            ) from None
        launcher = LAUNCHERS[launcher_name or self.spec.launcher](self.spec)
        workers = max(1, min(launcher.concurrency, len(self.cells)))
        per_cell = self.spec.resources.devices_per_cell  # processes per cell: they share the cell's cores
        threads = self.spec.resources.cpus_per_cell or share_cores(workers, per_cell)
        parent = self.parent_run(overrides)
        self.stale_warm_starts()
        paths = {c.id: self.cell_config(c, parent, threads) for c in self.cells}
        # One query for what is already done; each remaining cell is reconciled (resume / clean restart) when it runs.
        finished = {r.data.tags.get("sweep.cell") for r in self.runs(role="cell") if r.info.status == "FINISHED"}
        todo = [c for c in self.cells if c.id not in finished]
        done0 = len(self.cells) - len(todo)
        progress = Progress(self.spec.name, len(self.cells), done0, workers)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        stopping = threading.Event()

        def on_signal(signum, frame):
            if stopping.is_set():
                raise KeyboardInterrupt
            stopping.set()
            print(f"\n[sweep] signal {signum}: stopping the running cells at their next step boundary", flush=True)
            launcher.stop()

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        failed: dict[str, str] = {}
        earlier = float(self.client.get_run(parent).data.tags.get("sweep.wall_clock_s", 0))  # earlier invocations
        clock = threading.Lock()

        def record_driver_time() -> None:
            """After every cell and at the end, so that a driver killed outright (SIGKILL, a lost machine) has
            still recorded its time up to its last finished cell."""
            with clock:
                self.client.set_tag(parent, "sweep.wall_clock_s", f"{earlier + time.time() - progress.t0:.1f}")

        def warm(cfg_path: Path, key: str, warm_progress: WarmStartProgress) -> int:
            if stopping.is_set():
                return -1
            log = self.dir / "logs" / f"warm_start-{key}.log"
            argv = [sys.executable, "-m", "bench", "warm-start", *include_args(), f"config_file={cfg_path}",
                    f"trainer.num_threads={warm_threads}"]  # fmt: skip
            t0 = time.time()
            warm_progress.started(cfg_path, log)
            rc = launcher.run(argv, log, warm_threads, self.spec.resources.gpus_per_cell, env)
            reused = rc == 0 and "reusing SFT warm start" in log.read_text(errors="replace")
            warm_progress.finished(cfg_path, rc, reused, time.time() - t0)
            return rc

        def attempt(cell: Cell) -> tuple[Cell, int | None]:
            rc = 0
            for n in range(self.spec.max_retries + 1):
                if stopping.is_set():
                    return cell, None  # never started
                argv = self.prepare(cell, threads)
                if argv is None:
                    rc = 0
                    break
                progress.started(cell)
                log = self.dir / "logs" / f"{cell.name}-{cell.id}.log"
                t0 = time.time()
                rc = launcher.run(argv, log, threads, self.spec.resources.gpus_per_cell, env)
                if rc == 0:  # the cell's process time, start-up and warm-start wait included
                    for r in self.runs(**{"sweep.cell": cell.id}):
                        spent = float(r.data.tags.get("sweep.wall_clock_s", 0)) + time.time() - t0
                        self.client.set_tag(r.info.run_id, "sweep.wall_clock_s", f"{spent:.1f}")
                if rc == 0 or stopping.is_set():
                    break
                progress.note(f"{cell.label}: attempt {n + 1} failed (exit {rc}); log {log}")
            # Counted here, in the worker thread, before it takes the next cell (so "running" never overcounts).
            if rc == 0:
                progress.finished(cell)
                record_driver_time()
            elif stopping.is_set():
                progress.stopped(cell)
            else:
                progress.failed(cell, rc)
            return cell, rc

        try:
            with ThreadPoolExecutor(workers) as pool:
                # 1. Shared SFT warm starts, each (task, model, seed, warm-start config) trained once.
                from bench.run.train import warm_start_seed

                need = {}
                for c in todo:
                    if c.cfg.init == "sft":
                        key = config_hash(  # what ensure_sft's cache key depends on
                            {k: c.cfg[k] for k in ("model", "warm_start")}
                            | {"seed": warm_start_seed(c.cfg), "task": sft_task(c.cfg.task),
                               "max_new_tokens": c.cfg.rollout.max_new_tokens}
                        )  # fmt: skip
                        need.setdefault(key, paths[c.id])
                if need:
                    # The warm starts run before any cell and alone: they share the cores among themselves, not with
                    # the workers that are idle meanwhile (one warm start on 2 workers had 1 of 2 cores: 2x slower).
                    warm_threads = self.spec.resources.cpus_per_cell or share_cores(min(workers, len(need)), per_cell)
                    wp = WarmStartProgress(progress, len(need), workers, {paths[c.id]: c for c in todo})
                    try:
                        for rc in pool.map(lambda kv: warm(kv[1], kv[0], wp), need.items()):
                            if rc not in (0, -1):
                                progress.note(f"a warm start failed (exit {rc}); see {self.dir / 'logs'}")
                    finally:
                        wp.close()
                # 2. The cells.
                futures = [pool.submit(attempt, c) for c in todo]
                for fut in as_completed(futures):
                    cell, rc = fut.result()
                    if rc not in (None, 0) and not stopping.is_set():
                        failed[cell.id] = cell.label
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
            launcher.close()
        status = "KILLED" if stopping.is_set() else ("FAILED" if failed else "FINISHED")
        record_driver_time()
        self.client.set_tag(parent, "sweep.failed_cells", json.dumps(list(failed.values()))[:5000])
        self.client.set_tag(parent, "sweep.cells_done", str(progress.done))
        self.client.set_terminated(parent, status)
        progress.close()
        if stopping.is_set():
            raise KeyboardInterrupt
        return {"failed": list(failed.values())}


def share_cores(jobs: int, processes_per_job: int = 1) -> int:
    """Threads for each process when ``jobs`` jobs of ``processes_per_job`` processes share this machine's cores."""
    return max(1, (os.cpu_count() or 1) // (max(1, jobs) * processes_per_job))


def schedule_eta(mean_s: float, running_elapsed: list[float], queued: int, workers: int) -> float:
    """Seconds until ``queued`` jobs of ``mean_s`` each and the running ones (each ``mean_s`` − its elapsed time still
    to go) are done on ``workers`` slots, each queued job taking the first slot to free up (list scheduling). Unlike
    mean × remaining / workers, it counts the work the running jobs have done and the last round's idle slots."""
    import heapq

    free = sorted(max(mean_s - e, 0.0) for e in running_elapsed)
    free += [0.0] * max(workers - len(free), 0)
    heapq.heapify(free)
    for _ in range(queued):
        heapq.heappush(free, heapq.heappop(free) + mean_s)
    return max(free, default=0.0)


class Progress:
    """Cells done / running / failed / remaining with an ETA, as a tqdm bar and one line per event (logs stay
    readable when the output is not a terminal)."""

    def __init__(self, name: str, total: int, done: int, workers: int):
        from tqdm.auto import tqdm

        self.name, self.total, self.done, self.workers = name, total, done, workers
        self.running, self.n_failed, self.durations, self.start = {}, 0, [], {}
        self.t0 = time.time()
        self.lock = threading.Lock()
        self.bar = tqdm(
            total=total,
            initial=done,
            desc=f"sweep {name}",
            unit="cell",
            dynamic_ncols=True,
            disable=not sys.stderr.isatty(),  # the event lines below carry the same counts in logs
        )
        self.note(f"{total} cells: {done} already done, {total - done} to run on {workers} worker(s)")

    def _line(self, event: str) -> None:
        remaining = self.total - self.done - self.n_failed - len(self.running)
        eta = ""
        if self.durations:
            mean, now = sum(self.durations) / len(self.durations), time.time()
            elapsed = [now - self.start[c] for c in self.running if c in self.start]
            eta = f", ETA {schedule_eta(mean, elapsed, remaining, self.workers) / 60:.1f} min"
        self.bar.set_postfix(running=len(self.running), failed=self.n_failed)
        self.bar.write(
            f"[sweep {self.name}] {event} | done {self.done}/{self.total}, running {len(self.running)}, "
            f"failed {self.n_failed}, remaining {remaining}, elapsed {(time.time() - self.t0) / 60:.1f} min{eta}"
        )

    def note(self, text: str) -> None:
        with self.lock:
            self.bar.write(f"[sweep {self.name}] {text}")

    def started(self, cell: Cell) -> None:
        with self.lock:
            self.running[cell.id] = cell
            self.start.setdefault(cell.id, time.time())
            self._line(f"start  {cell.label}")

    def finished(self, cell: Cell) -> None:
        with self.lock:
            self.running.pop(cell.id, None)
            self.done += 1
            if cell.id in self.start:
                self.durations.append(time.time() - self.start[cell.id])
            self.bar.update(1)
            self._line(f"done   {cell.label}")

    def failed(self, cell: Cell, rc: int) -> None:
        with self.lock:
            self.running.pop(cell.id, None)
            self.n_failed += 1
            self._line(f"FAILED {cell.label} (exit {rc})")

    def stopped(self, cell: Cell) -> None:
        with self.lock:
            self.running.pop(cell.id, None)
            self._line(f"stopped {cell.label}")

    def close(self) -> None:
        self.bar.close()


class WarmStartProgress:
    """One line per SFT warm start as it finishes (trained or reused, done / total), and while they train a line every
    ``every_s`` seconds with each running one's step (read from its log: the run prints ``[progress]`` lines) and an
    ETA from their measured seconds per step (list scheduling over the workers)."""

    def __init__(self, progress: Progress, total: int, workers: int, cell_of: dict[Path, Cell], every_s: float = 60):
        self.progress, self.total, self.workers, self.cell_of = progress, total, workers, cell_of
        self.done = self.trained = self.reused = self.failed = 0
        self.trained_s: list[float] = []
        self.running: dict[Path, tuple[Path, float]] = {}  # config -> (its log, start time)
        self.every_s, self.stop = every_s, threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)
        progress.note(f"{total} SFT warm start(s) to train or reuse (their own MLflow experiment), then the cells")
        self.thread.start()

    def started(self, cfg_path: Path, log: Path) -> None:
        with self.progress.lock:
            self.running[cfg_path] = (log, time.time())

    def _where(self, cfg_path: Path) -> str:
        c = self.cell_of.get(cfg_path)  # by its setting (plan's `where`): two settings of one task, two warm starts
        return f"{c.where} {c.cfg.model.name} seed {c.cfg.seed}" if c is not None else cfg_path.stem

    def heartbeat(self) -> str | None:
        """The progress line of the running warm starts, or None when none has printed a step yet."""
        import re

        from bench.run.train import PROGRESS_RE

        with self.progress.lock:
            running = dict(self.running)
        parts, left, rates, total = [], [], [], 0
        for cfg_path, (log, _) in running.items():
            try:
                found = re.findall(PROGRESS_RE, log.read_text(errors="replace")[-20000:])
            except OSError:
                found = []
            if not found:
                parts.append(f"{self._where(cfg_path)} starting")
                continue
            step, total, per = int(found[-1][0]), int(found[-1][1]), float(found[-1][2])
            parts.append(f"{self._where(cfg_path)} step {step}/{total}")
            left.append((total - step) * per)
            rates.append(per)
        if not rates:
            return None
        queued = self.total - self.done - len(running)
        mean = total * sum(rates) / len(rates)  # one warm start, at the running ones' pace
        eta = schedule_eta(mean, [mean - x for x in left], queued, self.workers)
        return (f"[sweep {self.progress.name}] warm starts {self.done}/{self.total} done, running: {', '.join(parts)}"
                f" | ETA {eta / 60:.1f} min")  # fmt: skip

    def _beat(self) -> None:
        while not self.stop.wait(self.every_s):
            line = self.heartbeat()
            if line:
                self.progress.bar.write(line)

    def close(self) -> None:
        self.stop.set()

    def finished(self, cfg_path: Path, rc: int, reused: bool, seconds: float) -> None:
        with self.progress.lock:
            self.running.pop(cfg_path, None)
            self.done += 1
            if rc != 0:
                self.failed += 1
                what = f"FAILED (exit {rc})"
            elif reused:
                self.reused += 1
                what = "reused"
            else:
                self.trained += 1
                self.trained_s.append(seconds)
                what = f"trained in {seconds:.0f} s"
            left = self.total - self.done
            eta = ""
            if self.trained_s and left:
                mean, now = sum(self.trained_s) / len(self.trained_s), time.time()
                elapsed = [now - t0 for _, t0 in self.running.values()]
                eta = f", ETA {schedule_eta(mean, elapsed, left - len(elapsed), self.workers) / 60:.1f} min"
            self.progress.bar.write(
                f"[sweep {self.progress.name}] warm start {self.done}/{self.total} ({self._where(cfg_path)}): {what} | "
                f"trained {self.trained}, reused {self.reused}, failed {self.failed}, remaining {left}{eta}"
            )


def load_plan(name: str, overrides: list[str] = ()) -> tuple[SweepSpec, list[Cell]]:
    """``overrides``: ``sweep.<key>=...`` edit the sweep file's fields; anything else is a config override for every
    cell (and so part of each cell's identity: pass the same ones to ``report``)."""
    spec = load_spec(name, [o[len("sweep.") :] for o in overrides if o.startswith("sweep.")])
    return spec, plan(spec, [o for o in overrides if not o.startswith("sweep.")])


def run_sweep(name: str, overrides: list[str] = (), launcher: str | None = None) -> dict:
    """Plan the sweep and run it to completion."""
    spec, cells = load_plan(name, overrides)
    sweep = Sweep(spec, cells)
    t0 = time.time()
    out = sweep.run(launcher, list(overrides))
    out.update(experiment=sweep.experiment, cells=len(cells), wall_clock_s=time.time() - t0, uri=sweep.uri,
               experiment_id=sweep.exp_id)  # fmt: skip
    return out
