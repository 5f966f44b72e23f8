"""Every command the README and the user guide show is one this project accepts.

Each ``speccompile ...`` line of a code block (continuation lines joined, ``[optional]``
brackets dropped, shell variables given placeholder values) is parsed by the real click
command -- the subcommand exists, every flag is one of its options, every value has the
option's type and choice, nothing required is missing -- without running it (many name a
1.5B model or a GPU). ``make`` targets must be Makefile targets, ``python -m`` modules and
``python FILE`` scripts must exist. What the quick start's commands do is run for real on a
tiny model by tests/cli/test_cli.py and the MLC-LLM table by tests/cli/test_overrides.py.
"""
from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import click
import pytest

from speccompile.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs" / "guide").glob("*.md"))]


def shown_commands(path: Path) -> list[tuple[int, str]]:
    """(line, command) for each command line of the file's code blocks."""
    out, block, pending, start = [], False, "", 0
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            block, pending = not block, ""
            continue
        if not block:
            continue
        text = line.split(" # ")[0].split("   #")[0].rstrip()
        if not pending:
            start = number
        pending = f"{pending} {text.strip()}" if pending else text.strip()
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        if re.match(r"(speccompile|make|python3?|\.venv/bin/\w+)\b", pending):
            out.append((start, pending))
        pending = ""
    return out


COMMANDS = [(f"{p.relative_to(ROOT)}:{line}", cmd) for p in DOCS for line, cmd in shown_commands(p)]


def words(cmd: str) -> list[str]:
    cmd = re.sub(r"\$\{?(\w+)\}?", lambda m: f"/placeholder/{m.group(1).lower()}", cmd).replace("[", "").replace("]", "")
    return shlex.split(cmd)


def make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))


def test_the_docs_show_commands():
    """Guards the test below against reading nothing (a renamed folder, a changed fence)."""
    assert sum(c.startswith("speccompile") for _, c in COMMANDS) >= 40, COMMANDS


@pytest.mark.parametrize("where,cmd", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_every_command_shown_is_accepted(where, cmd):
    args = words(cmd)
    if args[0] == "make":
        targets = [a for a in args[1:] if "=" not in a and not a.startswith("-")]
        assert set(targets) <= make_targets(), f"{where}: {cmd}: no such Makefile target"
        return
    if args[0].startswith(("python", ".venv/bin/python")):
        if args[1] == "-m":
            assert importlib.util.find_spec(args[2]) is not None, f"{where}: no module {args[2]}"
        else:
            assert (ROOT / args[1]).exists(), f"{where}: no script {args[1]}"
        return
    assert args[0] == "speccompile", cmd
    name, rest = args[1], args[2:]
    ctx = click.Context(main, info_name="speccompile")
    command = main.get_command(ctx, name)
    assert command is not None, f"{where}: no command {name!r}"
    try:
        command.make_context(name, rest, parent=ctx)
    except click.UsageError as err:  # unknown flag, bad value or choice, missing argument
        pytest.fail(f"{where}: {cmd}\n  {err.format_message()}")
