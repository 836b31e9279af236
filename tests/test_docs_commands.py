"""Every shell line of README.md and docs/*.md runs as printed, against lakes the test makes.

A doc command that stops working (a lake path the demo does not write, a renamed option, a
query over a dropped view) fails here under its doc and line. Lines marked `# needs: ...` (a
GPU, vLLM, a cluster, the network, minutes of machine time) are checked for their syntax only,
and `make` lines for their targets; how blocks and markers are read:
tests/support/doc_commands.py.
"""
from __future__ import annotations

import shlex
import tempfile
from pathlib import Path

import pytest

from tests.support.doc_commands import (
    COMMAND_LANGS,
    DOCS,
    Command,
    Sandbox,
    blocks,
    check,
    doc_commands,
    make_lakes,
    syntax_problem,
)

COMMANDS = doc_commands()


def _unique(commands: list[Command]) -> list[Command]:
    """One of each command (the same line in several docs runs once; its first place names it)."""
    seen: dict[tuple, Command] = {}
    for c in commands:
        seen.setdefault((tuple(shlex.split(c.text, comments=True)), c.shown, c.needs,
                         tuple(sorted(c.env.items()))), c)
    return list(seen.values())


UNIQUE = _unique(COMMANDS)


@pytest.fixture(scope="module")
def sandbox():
    with tempfile.TemporaryDirectory(prefix="replaylake-doc-lakes-") as root:
        box = Sandbox(make_lakes(Path(root)))
        yield box
        box.close()


@pytest.mark.slow
@pytest.mark.parametrize("command", UNIQUE, ids=[c.where for c in UNIQUE])
def test_documented_command_runs_as_printed(command: Command, sandbox: Sandbox):
    problem = check(command, sandbox)
    assert problem is None, f"{command.where}: {command.text}\n{problem}"


def test_every_fenced_block_names_its_language():
    """A block without a language is neither run nor skipped on purpose: a command hidden in one
    would escape the test. Transcripts (`$ ` lines) belong in `console` blocks, which run."""
    unnamed = [b.where for doc in DOCS for b in blocks(doc) if not b.lang]
    assert not unnamed, f"name the language of these blocks (bash, console, text, ...): {unnamed}"
    hidden = [b.where for doc in DOCS for b in blocks(doc)
              if b.lang not in COMMAND_LANGS and any(x.startswith("$ ") for x in b.lines)]
    assert not hidden, f"`$ ` lines outside a console block: {hidden}"


def test_the_docs_hold_commands_of_every_kind_the_test_reads():
    """The reader finds the docs' commands: plain runs, transcripts with an error line, crontab
    lines with their variables, marked lines and `make` lines (an empty list would pass the
    parametrized test vacuously)."""
    assert len(COMMANDS) > 50
    assert any(c.shown.startswith("error:") for c in COMMANDS)
    assert any(c.env.get("LAKE") for c in COMMANDS)
    assert any("gpu" in c.needs for c in COMMANDS) and any("network" in c.needs for c in COMMANDS)
    assert any(c.first_word == "make" for c in COMMANDS)
    readme = [c for c in COMMANDS if c.where.startswith("README.md:")]
    assert any("runs/tt/lake" in c.text for c in readme)


# --- the check itself fails on what it is there to catch ------------------------------------


def test_a_command_naming_a_lake_the_demo_does_not_write_fails(sandbox: Sandbox):
    """The docs once said `--lake runs/demo/lake`; the demo writes runs/demo/latest/lake."""
    bad = Command("x.md:1", 'replaylake sql --lake runs/demo/lake "select 1"')
    assert "no lake at runs/demo/lake" in (check(bad, sandbox) or "")
    good = Command("x.md:1", 'replaylake sql --lake runs/demo/latest/lake "select 1"')
    assert check(good, sandbox) is None


def test_a_command_exiting_non_zero_fails_and_an_error_shown_must_match(sandbox: Sandbox):
    assert check(Command("x.md:1", "replaylake audit --lake runs/demo/latest/lake --nope"),
                 sandbox) is not None
    shown = Command("x.md:1", "replaylake audit --lake runs/demo/latest",
                    shown="error: runs/demo/latest is not a lake")
    assert "the doc shows exit 2" in (check(shown, sandbox) or "")


def test_a_marked_line_is_checked_for_its_arguments_and_its_marker():
    ok = Command("x.md:1", "replaylake dev gpu-check --repeats 20", needs=("gpu",))
    assert syntax_problem(ok) is None
    typo = Command("x.md:1", "replaylake dev gpu-check --repeat 20", needs=("gpu",))
    assert "--repeat" in (syntax_problem(typo) or "")
    unknown = Command("x.md:1", "replaylake dev gpu-check", needs=("tpu",))
    assert "not a known need" in (syntax_problem(unknown) or "")
    missing = Command("x.md:1", "replaylake dev benchmark all", needs=("minutes",))
    assert "no such command" in (syntax_problem(missing) or "")


def test_a_make_line_must_name_a_target_the_makefile_has():
    assert syntax_problem(Command("x.md:1", "make run    # the demo")) is None
    assert "no Makefile target runn" in (syntax_problem(Command("x.md:1", "make runn")) or "")

