"""A mistake on the command line itself (a missing option, a value that does not parse, an unknown
command or option, an option a job refuses) is one `error:` line and exit 2 like every other user
error, naming the option and where to read the command's help; never click's usage box. `--help`
and a group run without a command still show their help. Real child processes, real lakes."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.lake import ROOT, lake_counts, python_env, small_trained_lake
from tests.support.os_refusals import one_error_line, replaylake

PROG = "python -m jobs.cli"     # how click names the program these tests run


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small lake: 3 groups of 2 trajectories, 2 of them trained and released."""
    return small_trained_lake(tmp_path_factory.mktemp("usage") / "lake")


MISTAKES = [
    (["sql", "select 1"], f"error: --lake is required (try: {PROG} sql --help)"),
    (["sql", "--lake", "{lake}", "--format", "parquet", "select 1"],
     f"error: --format parquet writes a file: add --output FILE (try: {PROG} sql --help)"),
    (["sql", "--lake", "{lake}", "select 1", "extra"],
     f"error: got unexpected extra argument(s) (extra) (try: {PROG} sql --help)"),
    (["retain", "--lake", "{lake}", "--older-than", "abc"],
     "error: invalid value for '--older-than': Input should be a valid integer, unable to parse "
     f"string as an integer (try: {PROG} retain --help)"),
    (["retain", "--lake", "{lake}"],
     f"error: missing option '--older-than' (try: {PROG} retain --help)"),
    (["export", "--lake", "{lake}", "--out", "{lake}/../x", "--zzz"],
     f"error: no such option: --zzz (try: {PROG} export --help)"),
    (["--bogus"], f"error: no such option: --bogus (try: {PROG} --help)"),
]


@pytest.mark.parametrize(("args", "line"), MISTAKES, ids=[" ".join(a) for a, _ in MISTAKES])
def test_a_command_line_mistake_is_one_error_line_naming_the_option(lake, args, line) -> None:
    proc = replaylake(*(a.format(lake=lake) for a in args))
    assert one_error_line(proc) == line
    assert proc.stdout == ""


def test_a_mistyped_command_is_one_line_and_a_group_alone_still_shows_its_help() -> None:
    proc = replaylake("lake", "chek")
    assert one_error_line(proc) == (f"error: no such command 'chek'. Did you mean 'check'? "
                                    f"(try: {PROG} lake --help)")
    alone = replaylake("lake")
    assert "Usage:" in alone.stdout and "salvage" in alone.stdout, alone.stdout
    shown = replaylake("retain", "--help")
    assert shown.returncode == 0 and "--older-than" in shown.stdout and shown.stderr == ""


def test_a_job_run_with_dash_m_reports_a_usage_mistake_in_one_line_too(lake) -> None:
    proc = subprocess.run([sys.executable, "-m", "jobs.retain", "--lake", str(lake)], cwd=ROOT,
                          env=python_env(), capture_output=True, text=True, timeout=120)
    assert one_error_line(proc) == ("error: missing option '--older-than' "
                                    "(try: python -m jobs.retain --help)")


def test_retain_refuses_a_negative_age_before_any_progress_and_changes_nothing(lake) -> None:
    before = lake_counts(lake)
    proc = replaylake("retain", "--lake", str(lake), "--older-than", "-1")   # bar on by default
    assert one_error_line(proc) == ("error: --older-than -1: give a number of steps >= 0 "
                                    f"(try: {PROG} retain --help)")
    assert lake_counts(lake) == before
