"""`replaylake dev bench check`: every figure that missed its goal and every failed section of a
`bench all` report is listed, and the exit code says whether the run met its goals."""
from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from jobs.bench.out import figure
from jobs.cli import app


def _report(tmp_path: Path, sections: dict, quick: bool = False) -> Path:
    path = tmp_path / "all.json"
    path.write_text(json.dumps({"quick": quick, "machine": "test", "cpus": 2,
                                "sections": sections}))
    return path


def _check(path: Path):
    return CliRunner().invoke(app, ["dev", "bench", "check", str(path)])


MET = figure("sample, 10,000 buffered", 3.0, "ms", "naive ms", 1.4, 0.47, "x", "<= 5 ms", True)
MISSED = figure("verl adapter sample, 100 groups", 19.9, "ms", "verl 0.9.1 ms", 7.5, 0.38,
                "x verl's speed", ">= 1.0x verl", False)
NO_GOAL = figure("after release", 10.0, "MB RSS left", "RSS growth MB", 100.0, 0.1, "left", "",
                 None)


def test_a_run_that_met_every_goal_exits_0_and_counts_them(tmp_path: Path) -> None:
    result = _check(_report(tmp_path, {"decide": {"figures": [MET, NO_GOAL]}}))
    assert result.exit_code == 0, result.output
    assert "all 1 goals met" in result.output


def test_every_miss_and_failed_section_is_listed_and_the_run_fails(tmp_path: Path) -> None:
    result = _check(_report(tmp_path, {
        "decide": {"figures": [MET, NO_GOAL]}, "verl": {"figures": [MISSED, MET]},
        "memory": {"error": "MemoryError: boom"}}))
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert ("MISSED  verl: verl adapter sample, 100 groups: 19.9 ms against 7.50 "
            "(verl 0.9.1 ms), 0.38 x verl's speed; goal >= 1.0x verl") in lines
    assert "FAILED  memory: failed to run: MemoryError: boom" in lines
    assert not any("10,000 buffered" in line for line in lines)       # met: not listed
    assert "1 of 3 goals missed, 1 section(s) failed" in result.output


def test_a_quick_run_or_a_file_that_is_no_report_is_refused_in_one_line(tmp_path: Path) -> None:
    result = _check(_report(tmp_path, {"decide": {"figures": [MET]}}, quick=True))
    assert result.exit_code == 2 and "--quick" in result.output
    other = tmp_path / "torch.json"
    other.write_text(json.dumps({"bench": "torch", "results": []}))
    result = _check(other)
    assert result.exit_code == 2 and "no 'sections'" in result.output
    result = _check(tmp_path / "missing.json")
    assert result.exit_code == 2 and "run `replaylake dev bench all` first" in result.output
