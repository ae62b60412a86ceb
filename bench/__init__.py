"""creditbench: a benchmark harness for RL on language models with verifiable rewards."""

from pathlib import Path

__version__ = "0.1.0"
ROOT = Path(__file__).resolve().parent.parent
