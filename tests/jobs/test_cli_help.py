"""Every `replaylake` command explains itself: `--help` exits 0, shows an Examples section whose
`replaylake <command>` lines survive an 80-column terminal unbroken, and the listing's one-liner
(kept in the command table so listing imports nothing) is the command's own first paragraph.

Parametrized over the command table: a command added without an example fails here."""
from __future__ import annotations

import inspect
import re
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from jobs import cli
from tests.support.lake import ROOT

runner = CliRunner()
WIDTH = 80


def help_of(*args: str) -> str:
    res = runner.invoke(cli.app, [*args, "--help"], env={"COLUMNS": str(WIDTH), "NO_COLOR": "1"})
    assert res.exit_code == 0, res.output
    return res.output


def examples(doc: str) -> list[str]:
    """The `replaylake ...` lines of a docstring's Examples section."""
    _, found, rest = doc.partition("\nExamples:\n")
    assert found, f"no 'Examples:' section in:\n{doc}"
    lines = []
    for line in rest.splitlines():
        if line.strip().startswith("replaylake "):
            lines.append(line.strip())
        elif line.strip() and not line.startswith((" ", "\t")):
            break                              # the next unindented paragraph ends the section
    return lines


@pytest.mark.parametrize("path", sorted(cli.COMMANDS))
def test_every_command_has_help_with_an_example_that_fits_80_columns(path):
    out = help_of(*path.split())
    doc = inspect.getdoc(cli.load(path)) or ""
    lines = examples(doc)
    assert lines, f"{path}: the Examples section has no 'replaylake {path} ...' line"
    assert all(x.startswith(f"replaylake {path} ") or x == f"replaylake {path}" for x in lines), \
        lines
    shown = [line.strip(" │") for line in out.splitlines()]
    assert "Examples:" in shown
    for x in lines:                            # each example on one line, never wrapped
        assert x in shown, f"{path}: example {x!r} is wrapped or missing in:\n{out}"
    too_long = [line for line in out.splitlines() if len(line) > WIDTH]
    assert not too_long, too_long
    assert "<bool>" not in out, f"{path}: a flag shows a value to type:\n{out}"


@pytest.mark.parametrize("path", sorted(cli.COMMANDS))
def test_the_listing_one_liner_is_the_commands_first_paragraph(path):
    doc = inspect.getdoc(cli.load(path)) or ""
    first = " ".join(doc.split("\n\n")[0].split())
    assert cli.COMMANDS[path].help == first


def test_top_level_help_lists_every_command_and_group_without_importing_jobs():
    code = ("import sys; from jobs.cli import app; "
            "sys.argv = ['replaylake', '--help']\n"
            "try:\n    app()\nexcept SystemExit:\n    pass\n"
            "print('JOBS', sorted(m for m in sys.modules if m.startswith(('jobs.', 'pipeline'))"
            " and m != 'jobs.cli'))\n"
            "print('HEAVY', sorted(m for m in ('duckdb', 'polars', 'torch', 'pandas') "
            "if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={"COLUMNS": "100", "PATH": "/usr/bin:/bin"}, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "JOBS []" in res.stdout and "HEAVY []" in res.stdout, res.stdout
    for top in {p.split()[0] for p in cli.COMMANDS}:
        assert re.search(rf"│ {re.escape(top)} ", res.stdout), top


def test_a_group_lists_its_commands_and_a_typo_gets_a_suggestion():
    out = help_of("bench")
    for path in cli.COMMANDS:
        if path.startswith("bench "):
            assert path.split()[1] in out
    res = runner.invoke(cli.app, ["lake", "chek"], env={"COLUMNS": "80"})
    assert res.exit_code == 2 and "Did you mean 'check'" in res.output


def test_running_a_command_imports_only_its_own_job():
    code = ("import sys; from jobs.cli import app; "
            "sys.argv = ['replaylake', 'lake', 'check', '--help']\n"
            "try:\n    app()\nexcept SystemExit:\n    pass\n"
            "print('JOBS', sorted(m for m in sys.modules if m.startswith('jobs.')"
            " and m != 'jobs.cli'))")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert "JOBS ['jobs.lake_tool']" in res.stdout, res.stdout


def test_every_command_starts_in_a_fresh_process():
    """In-process runs share imports made by earlier tests; a fresh interpreter per command
    catches an import cycle that only shows when a command's module is the first one loaded
    (`sql --list` loads the SQL catalogue before the library)."""
    broken = []
    for args in [*(p.split() + ["--help"] for p in sorted(cli.COMMANDS)), ["sql", "--list"]]:
        res = subprocess.run([sys.executable, "-m", "jobs.cli", *args], cwd=ROOT,
                             capture_output=True, text=True, timeout=120,
                             env={"COLUMNS": "80", "PATH": "/usr/bin:/bin"})
        if res.returncode != 0 or "Traceback" in res.stderr:
            broken.append((args, res.stderr[-500:]))
    assert not broken, broken


def test_the_command_page_lists_every_command_with_its_line_and_examples():
    page = (ROOT / "docs" / "cli.md").read_text()
    for path, job in cli.COMMANDS.items():
        assert f"### `replaylake {path}`\n\n{job.help}\n" in page, path
        for x in examples(inspect.getdoc(cli.load(path)) or ""):
            assert f"\n{x}\n" in page, (path, x)
