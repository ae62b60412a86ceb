"""Command line: ``python -m bench <command> [key=value ...]``.

    python -m bench train algorithm=grpo task=countdown model=tiny seed=0 trainer.max_steps=50
    python -m bench train resume=runs/<run dir> [trainer.max_steps=100]
    python -m bench list
    python -m bench main            # the README's first command: SFT warm start + GRPO on Countdown, tiny model
    python -m bench config algorithm=grpo task=countdown      # print the resolved config
    python -m bench train config_file=<config.yaml> [key=value ...]   # a saved config (a run's or a sweep cell's)
    python -m bench sweep <name> [--launcher ray] [sweep.workers=4] [key=value ...]   # conf/sweep/<name>.yaml
    python -m bench report <name> [--x-axis tokens] [--out DIR]  # results/<name>/: summary.md, CSVs, plots
    python -m bench export <name> --runs DIR    # a sweep's finished runs as files (to carry to another store)
    python -m bench import <name> --runs DIR    # ... recreated in this store: the sweep skips them, reports read them
    python -m bench ui [--port 5000] [--workers 1]   # the MLflow UI over the embedded store (make ui)
Add ``--include DIR`` (repeatable) to register algorithm or task files from another directory.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from lightning.pytorch.utilities.exceptions import SIGTERMException

from bench import dist as bench_dist
from bench.config import ConfigError, compose, to_yaml
from bench.registry import ALGORITHMS, TASKS, RegistryError

MAIN_JOB = ["algorithm=grpo", "task=countdown", "model=tiny", "init=sft"]


def _include(dirs: list[str]) -> None:
    for d in dirs:
        for reg in (ALGORITHMS, TASKS):
            reg.include(d)


def cmd_list() -> None:
    for title, reg in (("algorithms", ALGORITHMS), ("tasks", TASKS)):
        print(f"{title}:")
        for name, cls in sorted(reg.classes().items()):
            print(f"  {name:<22} {getattr(cls, 'description', '')}")
            for choice in getattr(cls, "choices", list)():
                print(f"    {name} {choice}")


def _pop(args: list[str], key: str) -> tuple[str | None, list[str]]:
    value = next((a.split("=", 1)[1] for a in args if a.startswith(f"{key}=")), None)
    return value, [a for a in args if not a.startswith(f"{key}=")]


def _config(args: list[str]):
    from bench.run.train import load_config

    path, rest = _pop(args, "config_file")
    return load_config(path, rest) if path else compose(rest)


def cmd_train(args: list[str]) -> None:
    from bench.run.train import resume, train

    resume_dir, rest = _pop(args, "resume")
    result = resume(resume_dir, rest) if resume_dir else train(_config(rest))
    if result.run_id is None:  # ranks 1.. of a run on several processes: rank 0 prints the summary
        return
    first, last = result.first_eval, result.last_eval
    print(
        f"\nheld-out accuracy (greedy pass@1): step {result.eval_history[0][0]}: {first['eval/accuracy']:.3f}"
        f" -> step {result.eval_history[-1][0]}: {last['eval/accuracy']:.3f}"
    )
    print(f"MLflow run {result.run_id}; run directory {result.run_dir}")


def cmd_main(args: list[str]) -> None:
    from bench.run.train import train

    cfg = compose(MAIN_JOB + args)
    result = train(cfg)
    before, after = result.first_eval["eval/accuracy"], result.last_eval["eval/accuracy"]
    n = len(result.eval_history)
    print("\n" + "=" * 72)
    print("creditbench main job: SFT warm start + GRPO on Countdown (tiny model, CPU)")
    print(f"  held-out greedy accuracy after SFT (before RL): {before:.3f}")
    print(f"  held-out greedy accuracy after GRPO:            {after:.3f}   ({n} evaluations logged)")
    print(f"  MLflow run: {result.run_id}")
    from mlflow.tracking import MlflowClient

    from bench.tracking import tracking_uri, ui_url

    exp = MlflowClient(tracking_uri(cfg.tracking.tracking_uri)).get_run(result.run_id).info.experiment_id
    print(f"  open the results: make ui, then {ui_url(exp)}  (experiment '{cfg.tracking.experiment}')")
    print("=" * 72)


def cmd_warm_start(args: list[str]) -> None:
    """Train (or reuse) the SFT warm start a config with init=sft needs; a sweep runs this once per seed."""
    from bench.run.train import ensure_sft

    print(f"warm start: {ensure_sft(_config(args))}")


def _sweep_name(ns) -> tuple[str, list[str]]:
    if not ns.overrides or "=" in ns.overrides[0]:
        raise ConfigError(f"python -m bench {ns.command} <sweep name or file> [key=value ...]: name the sweep")
    return ns.overrides[0], ns.overrides[1:]


def cmd_sweep(ns) -> None:
    from bench.run.report import report
    from bench.run.sweep import run_sweep

    name, rest = _sweep_name(ns)
    out = run_sweep(name, rest, ns.launcher)
    print(
        f"\nsweep {name}: {out['cells']} cells in {out['wall_clock_s'] / 60:.1f} min; MLflow experiment "
        f"{out['experiment']!r} ({out['uri']})"
    )
    if out["failed"]:
        print(f"failed cells: {out['failed']} (logs under runs/sweeps/{name}/logs)")
    path = report(name, rest, x_axis=ns.x_axis, out=ns.out)
    print(f"report: {path}")
    print(ui_hint(out["uri"], out["experiment_id"]))


def ui_hint(uri: str, experiment_id: str) -> str:
    """The line that ends a sweep: how to open its runs in the MLflow UI."""
    from bench.tracking import tracking_uri, ui_url

    url = ui_url(experiment_id)
    if uri == tracking_uri(None) and uri.startswith("sqlite:///"):  # the project's store: make ui serves it
        return f"compare the runs in the MLflow UI: make ui (or {sys.executable} -m bench ui), then open {url}"
    if uri.startswith("sqlite:///"):
        serve = f"MLFLOW_TRACKING_URI={uri} {sys.executable} -m bench ui"
        return f"compare the runs in the MLflow UI: {serve}, then open {url}"
    return f"compare the runs in the MLflow UI of {uri} (experiment id {experiment_id})"


def cmd_report(ns) -> None:
    from bench.run.report import report

    name, rest = _sweep_name(ns)
    print(f"report: {report(name, rest, x_axis=ns.x_axis, out=ns.out)}")


def _carried(ns):
    from bench.run.sweep import Sweep, load_plan

    name, rest = _sweep_name(ns)
    if not ns.runs:
        raise ConfigError(f"python -m bench {ns.command} {name} --runs DIR: name the folder of exported runs")
    spec, cells = load_plan(name, rest)
    return Sweep(spec, cells), Path(ns.runs)


def cmd_export(ns) -> None:
    from bench.run.carry import export_runs

    sweep, out = _carried(ns)
    print(f"exported {export_runs(sweep, out)} runs of sweep {sweep.spec.name!r} ({sweep.uri}) to {out}")


def cmd_import(ns) -> None:
    from bench.run.carry import import_runs

    sweep, src = _carried(ns)
    imported, skipped = import_runs(sweep, src)
    print(f"imported {imported} runs of sweep {sweep.spec.name!r} from {src} into {sweep.uri} ({skipped} cells "
          "already finished there, skipped)")  # fmt: skip


def port_holder(port: int) -> str:
    """Who listens on ``port`` (psutil: the process's id and command line), or "another process" (e.g. another
    user's, whose owner psutil may not see)."""
    import psutil

    try:
        for c in psutil.net_connections(kind="tcp"):
            if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid:
                return f"process {c.pid} ({' '.join(psutil.Process(c.pid).cmdline())[:120]})"
    except (psutil.Error, OSError):
        pass
    return "another process"


def cmd_ui(ns) -> None:
    """The MLflow UI over the embedded store, lean (one worker, no job runner; UI_WORKERS / UI_JOBS restore MLflow's
    defaults). A busy port is an error naming it, what holds it and how to choose another, before MLflow starts:
    MLflow itself printed "address already in use" and exited 0, leaving the browser on whatever held the port."""
    import os
    import socket

    from bench.tracking import tracking_uri

    port = ns.port
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            raise ConfigError(
                f"port {port} on 127.0.0.1 is already in use by {port_holder(port)} ({e.strerror}); the MLflow UI "
                f"was not started. Choose another port: make ui UI_PORT={port + 1} (or python -m bench ui --port "
                f"{port + 1}), or stop what holds {port}."
            ) from None
    uri = tracking_uri(None)
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "true" if ns.jobs else "false"}
    argv = [os.path.join(os.path.dirname(sys.executable), "mlflow"), "ui", "--backend-store-uri", uri,
            "--host", "127.0.0.1", "--port", str(port), "--workers", str(ns.workers)]  # fmt: skip
    print(f"MLflow UI over {uri}: http://127.0.0.1:{port}", flush=True)
    os.execve(argv[0], argv, env)


COMMANDS = {
    "train": lambda ns: cmd_train(ns.overrides),
    "list": lambda ns: cmd_list(),
    "main": lambda ns: cmd_main(ns.overrides),
    "config": lambda ns: print(to_yaml(_config(ns.overrides))),
    "warm-start": lambda ns: cmd_warm_start(ns.overrides),
    "sweep": cmd_sweep,
    "report": cmd_report,
    "export": cmd_export,
    "import": cmd_import,
    "ui": cmd_ui,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=list(COMMANDS))
    parser.add_argument("--include", action="append", default=[], help="extra directory of algorithm/task files")
    parser.add_argument("--launcher", choices=["local", "ray"], help="sweep: override the sweep file's launcher")
    parser.add_argument("--x-axis", choices=["step", "samples", "tokens"], help="report: x-axis of the curves")
    parser.add_argument(
        "--out",
        type=Path,
        help="sweep/report: write the report here (with overrides it otherwise goes beside results/<name>/)",
    )
    parser.add_argument("--runs", help="export/import: the folder of a sweep's exported runs")
    parser.add_argument("--port", type=int, default=5000, help="ui: the port (127.0.0.1)")
    parser.add_argument("--workers", type=int, default=1, help="ui: server workers (MLflow's default: 4)")
    parser.add_argument("--jobs", action="store_true", help="ui: start MLflow's job runner too")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides (sweep/report: the sweep name first)")
    ns = parser.parse_intermixed_args(argv)
    clean = False
    try:
        _include(ns.include)
        COMMANDS[ns.command](ns)
        clean = True
    except (ConfigError, RegistryError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # a sweep stopped by Ctrl-C or SIGTERM: its cells were checkpointed
        return 130
    except SIGTERMException:  # Lightning's SystemExit subclass would exit 0: a killed run must not look successful
        return 128 + signal.SIGTERM
    finally:
        bench_dist.shutdown(clean)  # under torchrun: the process group, before the interpreter's teardown
    return 0
