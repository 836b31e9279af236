"""`replaylake compact` and `replaylake retain` from the command line: help with an example, and a
run on a real lake that reports what it did."""
from __future__ import annotations

import subprocess
import sys

import pytest

from pipeline.lake.writer import read_table, segment_files
from tests.support.lake import ROOT, python_env
from tests.support.sql_runs import simulate_async


def cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jobs.cli", *args], cwd=ROOT,
                          env=python_env(**env), capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", ["compact", "retain"])
def test_each_job_has_help_with_an_example(command):
    out = cli(command, "--help")
    assert out.returncode == 0, out.stderr
    assert "Examples:" in out.stdout and f"replaylake {command} --lake" in out.stdout


def test_compact_then_retain_on_a_real_lake(tmp_path):
    lake = tmp_path / "lake"
    simulate_async(lake, steps=6)
    rows = read_table(lake, "trajectories").num_rows
    out = cli("compact", "--lake", str(lake), "--no-progress")
    assert out.returncode == 0, out.stderr
    assert "compacted" in out.stdout and "MB/s" in out.stdout
    assert not [p for p in segment_files(lake, "trajectories") if p.suffix == ".arrow"]
    out = cli("retain", "--lake", str(lake), "--older-than", "2", "--no-progress")
    assert out.returncode == 0, out.stderr
    assert "horizon step 4" in " ".join(out.stdout.split())     # wrapped to the terminal
    assert read_table(lake, "trajectories").num_rows == rows


def test_retain_on_a_history_shorter_than_asked_says_so(tmp_path):
    """--older-than beyond the lake's history: nothing is that old (it printed "horizon step
    -94: 0 group(s) old enough")."""
    lake = tmp_path / "lake"
    simulate_async(lake, steps=6)
    out = cli("retain", "--lake", str(lake), "--older-than", "100", "--no-progress")
    assert out.returncode == 0, out.stderr
    said = " ".join(out.stdout.split())
    assert "nothing is 100 steps old yet (the newest step is 6): no payload dropped" in said, said
    assert "horizon step -" not in said


def test_a_missing_lake_is_a_clear_error(tmp_path):
    out = cli("compact", "--lake", str(tmp_path / "nope"))
    assert out.returncode == 2 and "no lake at" in out.stderr


def test_the_summaries_are_wrapped_to_the_terminal_width(tmp_path):
    lake = tmp_path / "lake"
    simulate_async(lake, steps=6)
    for args in (["compact"], ["retain", "--older-than", "2"]):
        narrow = cli(*args, "--lake", str(lake), "--no-progress", COLUMNS="80")
        assert narrow.returncode == 0, narrow.stderr
        lines = narrow.stdout.splitlines()
        assert len(lines) > 1 and max(map(len, lines)) <= 80, narrow.stdout
        assert all(line.startswith("  ") for line in lines[1:]), narrow.stdout
        wide = cli(*args, "--lake", str(lake), "--no-progress", COLUMNS="300")
        assert len(wide.stdout.splitlines()) == 1, wide.stdout     # as wide as the terminal
