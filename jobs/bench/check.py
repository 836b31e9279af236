"""`replaylake dev bench check`: a `bench all` run's figures against their goals, every miss listed.

Goals are held by benchmarks, never by timed assertions in tests: this command is how a
maintainer (or a scheduled job) asks whether one run met them. It reads the JSON `bench all`
wrote, prints one entry per figure that missed its goal (with its value, the reference from the
same run and the goal) and one per section that failed to run, and exits 1 if there is any; a run
made with ``--quick`` is refused, because its sizes are a smoke test and its figures judge
nothing. A miss whose goal the run itself put out of reach is listed apart, as BOUNDED, with what
bounds it: the verl adapter's default mode makes TransferQueue calls that verl makes too, timed
bare in the same rounds, and verl's time over theirs is the most any adapter could reach.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from jobs.bench.table import figure_line, number


def misses(report: dict[str, Any]) -> tuple[list[str], list[str], list[str], int]:
    """(figures that missed a goal within reach, figures that missed a goal their run put out of
    reach, sections that failed, figures with a goal) of a report. A goal is out of reach when
    the figure carries a bound (the most its ratio could reach in that run, set by a system
    every implementation calls) below it."""
    missed, bounded, failed, judged = [], [], [], 0
    for section, body in report.get("sections", {}).items():
        if "error" in body:
            failed.append(f"{section}: failed to run: {body['error']}")
            continue
        for f in body["figures"]:
            if f["meets_goal"] is None:
                continue
            judged += 1
            if f["meets_goal"]:
                continue
            limit = f.get("bound")
            if limit is not None and not limit["reachable"]:
                bounded.append(f"{section}: {figure_line(f)}; out of reach in this run: "
                               f"{limit['by']} allow at most {number(limit['ratio'])}x")
            else:
                missed.append(f"{section}: {figure_line(f)}")
    return missed, bounded, failed, judged


def _say(tag: str, line: str) -> None:
    """One entry, wrapped to the terminal's width under its tag (an 80-column terminal reads
    each one whole)."""
    from jobs.cli import echo_wrapped
    echo_wrapped(line, f"{tag:<8}", " " * 8)


def main(report: Path = typer.Argument(Path("runs/bench/all.json"),
                                       help="the JSON `replaylake dev bench all` wrote")) -> None:
    """List every figure of a `bench all` run that missed its goal; exit 1 if any did.

    Examples:
        replaylake dev bench check
        replaylake dev bench check runs/bench/all.json
    """
    from pipeline.errors import ConfigError
    if not report.is_file():
        raise ConfigError(f"no benchmark report at {report}: run `replaylake dev bench all` "
                          "first (it writes runs/bench/all.json), or name the JSON it wrote")
    try:
        data = json.loads(report.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{report} is not a `bench all` report (not JSON: {exc})") from None
    if not isinstance(data, dict) or "sections" not in data:
        raise ConfigError(f"{report} is not a `bench all` report (no 'sections'); the single "
                          "benchmarks' JSON files carry no goals table")
    if data.get("quick"):
        raise ConfigError(f"{report} was written by `bench all --quick`: its sizes are a smoke "
                          "test and judge no goal; run `replaylake dev bench all` without --quick")
    missed, bounded, failed, judged = misses(data)
    for tag, lines in (("FAILED", failed), ("MISSED", missed), ("BOUNDED", bounded)):
        for line in lines:
            _say(tag, line)
    if missed or bounded or failed:
        out_of_reach = (f" ({len(bounded)} of them out of reach in this run: BOUNDED)"
                        if bounded else "")
        typer.echo(f"{len(missed) + len(bounded)} of {judged} goals missed{out_of_reach}, "
                   f"{len(failed)} section(s) failed ({report})")
        raise typer.Exit(1)
    typer.echo(f"all {judged} goals met ({report})")


if __name__ == "__main__":
    from jobs.cli import run
    run(main)       # through the one handler of user errors
