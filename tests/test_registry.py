"""Registries: file stem == name, broken modules are errors, extra directories can be included."""

from __future__ import annotations

import pytest

from bench.registry import ALGORITHMS, TASKS, Registry, RegistryError


def test_file_stems_are_names():
    """algorithms/grpo.py registers 'grpo'; tasks/countdown.py registers 'countdown'."""
    assert {"grpo", "sft"} <= set(ALGORITHMS.names()), ALGORITHMS.names()
    assert "countdown" in TASKS.names(), TASKS.names()
    assert ALGORITHMS.get("grpo").__name__ == "GRPO"


def test_broken_module_is_an_error_not_a_skip(tmp_path):
    """A task file that fails to import raises with the file's path; it is not silently skipped."""
    (tmp_path / "broken.py").write_text("import not_a_module_anywhere\n")
    reg = Registry("task", "tasks", "bench.task.Task")
    reg.include(tmp_path)
    with pytest.raises(RegistryError, match=r"broken\.py failed to import: ModuleNotFoundError"):
        reg.names()


def test_module_without_a_class_is_an_error(tmp_path):
    (tmp_path / "empty.py").write_text("X = 1\n")
    reg = Registry("task", "tasks", "bench.task.Task")
    reg.include(tmp_path)
    with pytest.raises(RegistryError, match="exactly one subclass of Task"):
        reg.names()


def test_include_registers_extra_task(tmp_path):
    """A Task subclass in an --include directory registers under its file stem."""
    (tmp_path / "echo.py").write_text(
        "from bench.task import Task\nclass Echo(Task):\n    description = 'repeat the word'\n"
    )
    reg = Registry("task", "tasks", "bench.task.Task")
    reg.include(tmp_path)
    assert reg.get("echo").__name__ == "Echo"
    assert "countdown" in reg.names()
