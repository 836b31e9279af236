"""`replaylake dev bench check`: a `bench all` run's figures against their goals, every miss listed.

Goals are held by benchmarks, never by timed assertions in tests: this command is how a
maintainer (or a scheduled job) asks whether one run met them. It reads the JSON `bench all`
wrote, prints one line per figure that missed its goal (with its value, the reference from the
same run and the goal) and one per section that failed to run, and exits 1 if there is any; a run
made with ``--quick`` is refused, because its sizes are a smoke test and its figures judge
nothing.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from jobs.bench.table import figure_line


def misses(report: dict[str, Any]) -> tuple[list[str], list[str], int]:
    """(figures that missed their goal, sections that failed, figures with a goal) of a report."""
    missed, failed, judged = [], [], 0
    for section, body in report.get("sections", {}).items():
        if "error" in body:
            failed.append(f"{section}: failed to run: {body['error']}")
            continue
        for f in body["figures"]:
            if f["meets_goal"] is None:
                continue
            judged += 1
            if not f["meets_goal"]:
                missed.append(f"{section}: {figure_line(f)}")
    return missed, failed, judged


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
    missed, failed, judged = misses(data)
    for line in failed + missed:
        typer.echo(f"MISSED  {line}" if line in missed else f"FAILED  {line}")
    if missed or failed:
        typer.echo(f"{len(missed)} of {judged} goals missed, {len(failed)} section(s) failed "
                   f"({report})")
        raise typer.Exit(1)
    typer.echo(f"all {judged} goals met ({report})")


if __name__ == "__main__":
    from jobs.cli import run
    run(main)       # through the one handler of user errors
