"""`replaylake audit`: run every invariant query of sql/audits/ over a lake; exit 1 on a violation.

    replaylake audit --lake runs/demo/latest/lake --threshold 3

Each audit returns the rows that break its invariant (empty = pass). Audits with parameters need
them on the command line (`stale_bound_respected` needs --threshold, the run's
max_off_policy_threshold under `drop`); without them they are reported as skipped, not passed.
Read-only and safe while a buffer writes (pipeline.analysis.views.connect takes a consistent snapshot).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

SHOWN_ROWS = 5


@dataclass(frozen=True)
class AuditResult:
    """One audit's outcome: `pass`, `FAIL` (with the violating rows) or `skipped` (why)."""

    name: str
    status: str
    rows: list[dict]
    note: str = ""


def run_audits(lake: Path, threshold: int | None = None) -> list[AuditResult]:
    """Every audit of sql/audits/ over ``lake``, by name. The threshold defaults to the one the
    lake recorded (a `drop` run's max_off_policy_threshold)."""
    from pipeline.analysis import connect
    from pipeline.lake import config as lake_config
    from pipeline.lake import require_lake
    from sql import loader

    recorded = lake_config.current(require_lake(lake))
    if threshold is None and recorded and recorded.get("max_off_policy_strategy") == "drop":
        threshold = recorded.get("max_off_policy_threshold")
    con = connect(lake, filter_metric=(recorded or {}).get("filter_groups_metric") or "reward")
    available = {"threshold": threshold}
    out = []
    for q in loader.in_folder("audits"):
        missing = [p.name for p in q.params if available.get(p.name) is None]
        if missing:
            out.append(AuditResult(q.name, "skipped", [], f"needs --{', --'.join(missing)}"))
            continue
        rows = loader.run(con, q, **{p.name: available[p.name] for p in q.params}).to_pylist()
        out.append(AuditResult(q.name, "FAIL" if rows else "pass", rows))
    return out


def main(
    lake: Annotated[Path, typer.Option("--lake", help="the lake directory")],
    threshold: Annotated[int | None, typer.Option(
        "--threshold", help="override the max_off_policy_threshold the lake recorded")] = None,
) -> None:
    """Run every audit query over a lake; exit code 1 when any audit finds a violation.

    Examples:
        replaylake audit --lake runs/demo/latest/lake
    """
    results = run_audits(lake, threshold)
    for r in results:
        extra = f" ({r.note})" if r.note else f" ({len(r.rows)} violating row(s))" if r.rows else ""
        typer.echo(f"{r.status:>7}  {r.name}{extra}")
        for row in r.rows[:SHOWN_ROWS]:
            typer.echo(f"           {row}")
    failed = [r.name for r in results if r.status == "FAIL"]
    skipped = sum(r.status == "skipped" for r in results)
    typer.echo(f"{len(results) - len(failed) - skipped} passed, {len(failed)} failed, "
               f"{skipped} skipped" + (f": FAILED {', '.join(failed)}" if failed else ""))
    if failed:
        raise typer.Exit(1)


if __name__ == "__main__":
    from jobs.cli import run
    run(main)       # through the one handler of user errors
