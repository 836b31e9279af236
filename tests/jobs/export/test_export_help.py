"""`replaylake export --help` at 80 columns: every line fits and the descriptions keep a column
wide enough to read (the `--progress/--no-progress` pair once squeezed them to ~20 characters)."""
from __future__ import annotations

from typer.testing import CliRunner

from jobs.cli import app

WIDTH = 80


def _help(*args: str) -> str:
    res = CliRunner().invoke(app, ["export", *args, "--help"],
                             env={"COLUMNS": str(WIDTH), "NO_COLOR": "1"})
    assert res.exit_code == 0, res.output
    return res.output


def test_export_help_fits_80_columns_with_a_readable_description_column() -> None:
    out = _help()
    assert not [line for line in out.splitlines() if len(line) > WIDTH]
    for option, text in [("--rows-per-shard", "rows per shard"),
                         ("--pad-token-id", "pad id of padded .pt shards"),
                         ("--no-progress", "no progress bar (for cron jobs and logs)"),
                         ("--lake", "the lake directory (same as LAKE)")]:
        line = next(line for line in out.splitlines()
                    if line.startswith("│") and f" {option} " in line)
        assert text in line, (option, line)           # on the option's own line, unbroken
        assert WIDTH - line.index(text) >= 40, line   # a column of 40 characters or more
    assert "--progress " not in out.replace("--no-progress", "")   # one flag shown, not a pair


def test_the_old_progress_flag_is_still_accepted() -> None:
    _help("--progress")                                # an unknown option would exit 2
