"""Command line: ``python -m bench <command> [key=value ...]``.

    python -m bench train algorithm=grpo task=countdown model=tiny seed=0 trainer.max_steps=50
    python -m bench train resume=runs/<run dir> [trainer.max_steps=100]
    python -m bench list
    python -m bench main            # the README's first command: SFT warm start + GRPO on Countdown, tiny model
    python -m bench config algorithm=grpo task=countdown      # print the resolved config
Add ``--include DIR`` (repeatable) to register algorithm or task files from another directory.
"""

from __future__ import annotations

import argparse
import signal
import sys

from lightning.pytorch.utilities.exceptions import SIGTERMException

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


def cmd_train(args: list[str]) -> None:
    from bench.train import resume, train

    resume_dir = next((a.split("=", 1)[1] for a in args if a.startswith("resume=")), None)
    rest = [a for a in args if not a.startswith("resume=")]
    result = resume(resume_dir, rest) if resume_dir else train(compose(rest))
    first, last = result.first_eval, result.last_eval
    print(
        f"\nheld-out accuracy (greedy pass@1): step {result.eval_history[0][0]}: {first['eval/accuracy']:.3f}"
        f" -> step {result.eval_history[-1][0]}: {last['eval/accuracy']:.3f}"
    )
    print(f"MLflow run {result.run_id}; run directory {result.run_dir}")


def cmd_main(args: list[str]) -> None:
    from bench.train import train

    cfg = compose(MAIN_JOB + args)
    result = train(cfg)
    before, after = result.first_eval["eval/accuracy"], result.last_eval["eval/accuracy"]
    n = len(result.eval_history)
    print("\n" + "=" * 72)
    print("creditbench main job: SFT warm start + GRPO on Countdown (tiny model, CPU)")
    print(f"  held-out greedy accuracy after SFT (before RL): {before:.3f}")
    print(f"  held-out greedy accuracy after GRPO:            {after:.3f}   ({n} evaluations logged)")
    print(f"  MLflow run: {result.run_id}")
    print(f"  open the results: make ui   (then http://127.0.0.1:5000, experiment '{cfg.tracking.experiment}')")
    print("=" * 72)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=["train", "list", "main", "config"])
    parser.add_argument("--include", action="append", default=[], help="extra directory of algorithm/task files")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides")
    ns = parser.parse_intermixed_args(argv)
    try:
        _include(ns.include)
        if ns.command == "list":
            cmd_list()
        elif ns.command == "config":
            print(to_yaml(compose(ns.overrides)))
        elif ns.command == "main":
            cmd_main(ns.overrides)
        else:
            cmd_train(ns.overrides)
    except (ConfigError, RegistryError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except SIGTERMException:  # Lightning's SystemExit subclass would exit 0: a killed run must not look successful
        return 128 + signal.SIGTERM
    return 0
