"""The front door and the manual hold up: README.md is short, every relative link in it and in docs/ resolves (to a
file, and to a heading where it names one), and every runnable block is checked: each `python -m bench` command
composes the config (or plans the sweep) it names, each `make` target exists, each script it runs is there, each
python block compiles. The example blocks that are whole files (a task, an algorithm) are trained by
tests/test_dropin.py."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from bench import ROOT
from bench.config import compose

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (hyphens and underscores kept), spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # a '# comment' in a code block is no heading
    return {slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


def test_the_readme_is_a_front_door_not_a_manual():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 210, f"README.md has {len(lines)} lines: move detail into docs/"
    assert len(PAGES) >= 8, "the manual's pages are missing from docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    bad = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked offline
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading '{anchor}' in {dest.name} (has {sorted(anchors(dest))})")
    assert not bad, bad


def commands(page: Path) -> list[str]:
    """The shell commands of a page's bash blocks, continuation lines joined, comments dropped."""
    out = []
    for lang, body in BLOCK.findall(page.read_text()):
        if lang not in ("bash", "sh"):
            continue
        for line in body.replace("\\\n", " ").splitlines():
            line = line.split(" # ")[0].split("  #")[0].strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


ALL = [(p.name, c) for p in PAGES for c in commands(p)]
PLACEHOLDER = re.compile(r"<[^>]+>|path/to|\.\.\.")


def makefile_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))


def bench_args(cmd: str) -> tuple[str, list[str]] | None:
    """(subcommand, its arguments) of a `python -m bench` command; None for any other command."""
    words = shlex.split(cmd)
    if "-m" not in words or words[words.index("-m") + 1] != "bench":
        return None
    rest = words[words.index("-m") + 2 :]
    rest = " ".join(rest).replace("[--launcher ray]", "").split()  # an optional flag, shown in brackets
    return rest[0], [w for w in rest[1:] if not w.startswith("--launcher") and w != "ray"]


def test_the_pages_hold_runnable_commands():
    assert len(ALL) >= 30 and sum(bench_args(c) is not None for _, c in ALL) >= 15, ALL


@pytest.mark.parametrize("page,cmd", ALL, ids=[f"{p}:{c[:60]}" for p, c in ALL])
def test_every_command_names_what_exists(page, cmd):
    """A make target that exists; a script that exists; a `bench train|config` whose config composes; a `bench
    sweep|report` whose sweep plans every cell. Commands with placeholders (<name>, path/to) are checked for their
    fixed part only."""
    words = shlex.split(cmd)
    env_free = [w for w in words if not re.match(r"^[A-Z_]+=", w)]
    if env_free and env_free[0] == "make":
        targets = [w for w in env_free[1:] if "=" not in w and not w.startswith("-")]
        assert set(targets) <= makefile_targets(), (cmd, sorted(set(targets) - makefile_targets()))
        return
    for w in words:
        if w.startswith("scripts/") and not PLACEHOLDER.search(w):
            assert (ROOT / w).exists(), (cmd, w)
    parsed = bench_args(cmd)
    if parsed is None or PLACEHOLDER.search(cmd):
        return
    sub, args = parsed
    args = [a for a in args if not a.startswith("--")]
    if sub in ("train", "config"):
        if any(a.startswith("resume=") for a in args):
            return
        compose(args)
    elif sub in ("sweep", "report"):
        from bench.run.sweep import load_plan

        spec, cells = load_plan(args[0], args[1:])
        assert cells
    else:
        assert sub in ("list", "ui", "main", "warm-start"), (cmd, sub)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_python_block_compiles(page):
    for lang, body in BLOCK.findall(page.read_text()):
        if lang == "python":
            compile(body, str(page), "exec")
