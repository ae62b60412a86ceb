"""File-stem registries for algorithms and tasks.

A module dropped into ``algorithms/`` or ``tasks/`` (or any directory given with ``--include``) registers the one
class it defines that subclasses the registry's base class, under the file's stem. A module that fails to import is
an error naming the file, never a silent skip. Unknown names fail with the available names and a did-you-mean.
A dropped-in file may bring its config defaults as a YAML beside it (``<dir>/<stem>.yaml``, the format of
``conf/task/<name>.yaml``); ``include_args`` is what a process passes its children so that they see the same files.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path

from bench import ROOT


class RegistryError(LookupError):
    pass


BASES = ("bench.rl.module.PolicyModule", "bench.task.Task")


def _import(path: str) -> type:
    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def did_you_mean(name: str, options: list[str]) -> str:
    close = difflib.get_close_matches(name, options, n=3, cutoff=0.5)
    return f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


class Registry:
    def __init__(self, kind: str, package: str, base_path: str):
        self.kind, self.package, self.base_path = kind, package, base_path
        self.dirs: list[Path] = [ROOT / package]
        self._classes: dict[str, type] | None = None

    @property
    def base(self) -> type:
        return _import(self.base_path)

    def include(self, directory: str | Path) -> None:
        d = Path(directory).resolve()
        if not d.is_dir():
            raise RegistryError(f"--include {directory}: not a directory")
        if d not in self.dirs:
            self.dirs.append(d)
            self._classes = None

    def _load(self, path: Path) -> type | None:
        in_package = path.parent == ROOT / self.package
        tag = hashlib.sha1(str(path.parent).encode()).hexdigest()[:8]
        modname = f"{self.package}.{path.stem}" if in_package else f"_bench_include_{tag}_{path.stem}"
        try:
            if in_package or modname in sys.modules:
                module = importlib.import_module(modname)
            else:
                spec = importlib.util.spec_from_file_location(modname, path)
                module = importlib.util.module_from_spec(spec)
                sys.modules[modname] = module
                spec.loader.exec_module(module)
        except Exception as e:
            raise RegistryError(
                f"{self.kind} module {path} failed to import: {type(e).__name__}: {e}. Fix the file (`python "
                f"{path}` shows the full traceback) or take it out of {path.parent}."
            ) from e
        base = self.base
        found = [
            v
            for v in vars(module).values()
            if isinstance(v, type) and issubclass(v, base) and v.__module__ == module.__name__
        ]
        if not found and not in_package:
            # an --include directory may hold algorithms and tasks side by side; a file that is neither is an error
            bases = tuple(_import(b) for b in BASES)
            if any(
                isinstance(v, type) and issubclass(v, bases) and v.__module__ == module.__name__
                for v in vars(module).values()
            ):
                return None
        if len(found) != 1:
            raise RegistryError(
                f"{path} must define exactly one subclass of {base.__name__}; found {[c.__name__ for c in found]}"
            )
        return found[0]

    def classes(self) -> dict[str, type]:
        if self._classes is None:
            classes: dict[str, type] = {}
            for d in self.dirs:
                for path in sorted(d.glob("*.py")):
                    if path.stem.startswith("_"):
                        continue
                    if path.stem in classes:
                        raise RegistryError(f"two {self.kind}s named {path.stem!r}: {path} and another directory")
                    cls = self._load(path)
                    if cls is not None:
                        classes[path.stem] = cls
            self._classes = classes
        return self._classes

    def names(self) -> list[str]:
        return sorted(self.classes())

    def source(self, name: str) -> Path:
        """The file that registered ``name``."""
        return Path(sys.modules[self.get(name).__module__].__file__).resolve()

    def config_yaml(self, name: str) -> Path | None:
        """The YAML of config defaults beside a dropped-in file (``<dir>/<name>.yaml``), or None."""
        path = self.source(name).with_suffix(".yaml")
        return path if path.parent != (ROOT / self.package).resolve() and path.is_file() else None

    def get(self, name: str) -> type:
        classes = self.classes()
        if name not in classes:
            raise RegistryError(
                f"unknown {self.kind} {name!r}. Available: {', '.join(sorted(classes))}."
                + did_you_mean(name, list(classes))
            )
        return classes[name]


ALGORITHMS = Registry("algorithm", "algorithms", "bench.rl.module.PolicyModule")
TASKS = Registry("task", "tasks", "bench.task.Task")


def include_args() -> list[str]:
    """``--include DIR`` for every directory this process included: a sweep passes them to every warm-start and cell
    process (local or on a Ray worker), so a dropped-in algorithm or task is known there too."""
    dirs = dict.fromkeys(d for reg in (ALGORITHMS, TASKS) for d in reg.dirs[1:])
    return [a for d in dirs for a in ("--include", str(d))]


class Choices(dict):
    """One choice table of an algorithm family: value name -> the function that implements it.

    The family's config field holds the name (a plain string, so a value registered from outside the tree is valid);
    ``check`` is the start-up validation. An algorithm file, in ``algorithms/`` or a directory given with
    ``--include``, adds a value with the decorator ``@TABLE.register("name")``; registering a name twice from two
    different places is an error (a re-import of the same file is not)."""

    def __init__(self, field: str, where: str, entries: dict | None = None):
        super().__init__(entries or {})
        self.field, self.where = field, where

    def register(self, name: str, fn=None):
        def add(f):
            old = self.get(name)
            if old is not None and (old.__module__, old.__qualname__) != (f.__module__, f.__qualname__):
                raise RegistryError(
                    f"{self.field}={name!r} is already registered (by {old.__module__}.{old.__qualname__}); "
                    f"pick another name for {f.__module__}.{f.__qualname__}"
                )
            self[name] = f
            return f

        return add if fn is None else add(fn)

    def check(self, value: str) -> None:
        if value not in self:
            raise ValueError(
                f"{self.field}={value!r} is not a registered choice. Available: {', '.join(self)}."
                + did_you_mean(str(value), list(self))
                + f" A new value is one function registered with @{self.where}.register({str(value)!r})"
                " in an algorithm file (docs/extending.md: 'A new choice')."
            )
