"""Every `replaylake` command explains itself: `--help` exits 0, shows an Examples section whose
`replaylake <command>` lines survive an 80-column terminal unbroken, and the listing's one-liner
(read from the job's file, so listing imports nothing) is the command's own first paragraph.
What users run is listed at the top level, maintainer tools under `dev`; their old top-level
spellings are refused naming the new one.

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
    assert doc.startswith(cli.docstring(cli.COMMANDS[path]))   # sql appends an epilog at import
    assert cli.COMMANDS[path].help == first


def test_a_command_listing_shows_what_its_job_file_says_now(tmp_path, monkeypatch):
    # one copy of the help: a job whose docstring changes is listed with the new words
    job = tmp_path / "jobs" / "fake.py"
    job.parent.mkdir()
    job.write_text('def main():\n    """Count the\n    sheep.\n\n    Examples:\n'
                   '        replaylake sheep\n    """\n')
    monkeypatch.setattr(cli, "_source", lambda module: job)
    assert cli.Job("jobs.fake").help == "Count the sheep."
    job.write_text('def main():\n    """Count the goats."""\n')
    cli._parsed.cache_clear()
    assert cli.Job("jobs.fake").help == "Count the goats."
    with pytest.raises(LookupError, match="no function 'run'"):
        cli.docstring(cli.Job("jobs.fake", "run"))


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


USER_COMMANDS = ["demo", "sql", "whatif", "audit", "export", "compact", "retain", "report", "lake"]


def test_top_level_help_at_80_columns_lists_the_user_commands_and_dev_only():
    out = help_of()
    listed = [m.group(1) for m in re.finditer(r"^│ ([a-z][a-z-]*) ", out, re.M)]
    assert listed == [*USER_COMMANDS, "dev"], out
    assert not [line for line in out.splitlines() if len(line) > WIDTH]
    assert "<bool>" not in out


def test_dev_lists_the_maintainer_tools_and_the_benchmarks():
    out = help_of("dev")
    for name in ("soak", "gpu-check", "bench"):
        assert re.search(rf"^│ {name} ", out, re.M), out
    out = help_of("dev", "bench")
    for path in cli.COMMANDS:
        if path.startswith("dev bench "):
            assert re.search(rf"^│ {path.split()[2]} ", out, re.M), (path, out)


@pytest.mark.parametrize(("old", "new"), [
    (["bench", "decide", "--sizes", "400"], "replaylake dev bench decide"),
    (["bench", "all", "--quick"], "replaylake dev bench all"),
    (["bench"], "replaylake dev bench"),
    (["soak", "--rounds", "1"], "replaylake dev soak"),
])
def test_an_old_spelling_is_one_error_line_naming_the_new_one(old, new):
    res = subprocess.run([sys.executable, "-m", "jobs.cli", *old], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, env={"COLUMNS": "80", "PATH": "/usr/bin:/bin"})
    spelled = " ".join(w for w in old if not w.startswith("-") and not w.isdigit())
    assert res.returncode == 2, res.stderr
    assert res.stderr == f"error: `replaylake {spelled}` is now `{new}`\n"
    assert res.stdout == ""


def test_a_group_lists_its_commands_and_a_typo_gets_a_suggestion():
    out = help_of("lake")
    for path in cli.COMMANDS:
        if path.startswith("lake "):
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
