"""`replaylake dev bench check`: every figure that missed its goal and every failed section of a
`bench all` report is listed, and the exit code says whether the run met its goals."""
from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from jobs.bench.out import bound, figure
from jobs.bench.verl import default_figures
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
    entries = _entries(result.output)
    assert ("MISSED verl: verl adapter sample, 100 groups: 19.9 ms against 7.50 "
            "(verl 0.9.1 ms), 0.38 x verl's speed; goal >= 1.0x verl") in entries
    assert "FAILED memory: failed to run: MemoryError: boom" in entries
    assert not any("10,000 buffered" in e for e in entries)       # met: not listed
    assert entries[-1].startswith("1 of 3 goals missed, 1 section(s) failed")
    assert all(len(line) <= 80 for line in result.output.splitlines()[:-1])   # the path may not


def _entries(output: str) -> list[str]:
    """The report's entries, each unwrapped into one line (a continuation line is indented)."""
    entries: list[str] = []
    for line in output.splitlines():
        if line.startswith(" ") and entries:
            entries[-1] += " " + line.strip()
        else:
            entries.append(" ".join(line.split()))
    return entries


def test_a_miss_its_run_put_out_of_reach_is_listed_apart_with_its_bound(tmp_path: Path) -> None:
    """A verl figure carries the most TransferQueue's bare calls let any adapter reach in that
    run: a goal beyond it is BOUNDED, one within it stays MISSED; both fail the run."""
    by = "TransferQueue's bare calls"
    within = figure("verl, 100 groups, decisions", 13.4, "ms", "verl 0.9.1 ms", 6.15, 0.46,
                    "x verl's speed", ">= 1.0x verl", False, bound=bound(1.24, by, True))
    beyond = figure("verl, 100 groups, rewards", 30.6, "ms", "verl 0.9.1 ms", 6.15, 0.20,
                    "x verl's speed", ">= 1.0x verl", False, bound=bound(0.34, by, False))
    result = _check(_report(tmp_path, {"verl": {"figures": [within, beyond, MET]}}))
    assert result.exit_code == 1, result.output
    entries = _entries(result.output)
    assert [e.split()[0] for e in entries[:2]] == ["MISSED", "BOUNDED"]
    assert "out of reach" not in entries[0]
    assert entries[1].endswith("0.20 x verl's speed; goal >= 1.0x verl; out of reach in this "
                               "run: TransferQueue's bare calls allow at most 0.34x")
    assert entries[-1].startswith("2 of 3 goals missed (1 of them out of reach in this run: "
                                  "BOUNDED)")


def test_a_quick_run_or_a_file_that_is_no_report_is_refused_in_one_line(tmp_path: Path) -> None:
    result = _check(_report(tmp_path, {"decide": {"figures": [MET]}}, quick=True))
    assert result.exit_code == 2 and "--quick" in result.output
    other = tmp_path / "torch.json"
    other.write_text(json.dumps({"bench": "torch", "results": []}))
    result = _check(other)
    assert result.exit_code == 2 and "no 'sections'" in result.output
    result = _check(tmp_path / "missing.json")
    assert result.exit_code == 2 and "run `replaylake dev bench all` first" in result.output


def test_the_verl_default_mode_figures_carry_the_bound_transfer_queue_sets() -> None:
    """verl's time over the bare TransferQueue calls of each mode (same rounds) is the most the
    mode's ratio can reach: the goal is reachable exactly when that bound meets it."""
    r = {"impls": {"verl": {"median_ms": 6.0, "timed_calls": 15},
                   "ours": {"median_ms": 12.0, "timed_calls": 15, "after_ms": 5.0},
                   "ours_rewards": {"median_ms": 30.0, "timed_calls": 15, "after_ms": 3.0}},
         "tq_floor": {"decisions": {"median_ms": 6.0}, "rewards": {"median_ms": 18.0},
                      "clear_ms": 4.0}}
    r.update(verl_over_ours=6.0 / 12.0, verl_over_ours_rewards=6.0 / 30.0,   # as run_size puts them
             verl_over_floor=6.0 / 6.0, verl_over_floor_rewards=6.0 / 18.0)
    decisions, decisions_after, rewards, rewards_after = default_figures(r, 100, 1.0)
    assert decisions["ratio"] == 0.5 and decisions["meets_goal"] is False
    assert decisions["bound"]["ratio"] == 1.0 and decisions["bound"]["reachable"] is True
    assert rewards["ratio"] == 0.2
    assert rewards["bound"]["ratio"] == 6.0 / 18.0 and rewards["bound"]["reachable"] is False
    assert "decisions mirror (interleaved, 15 calls each)" in decisions["path"]
    # beside each, what its clears cost after the call (no goal, shown in the summary)
    assert (decisions_after["value"], decisions_after["ratio"]) == (5.0, 5.0 / 4.0)
    assert (rewards_after["value"], rewards_after["ratio"]) == (3.0, 3.0 / 4.0)
    for f in (decisions_after, rewards_after):
        assert f["meets_goal"] is None and f["in_summary"] and "after the call" in f["path"]
