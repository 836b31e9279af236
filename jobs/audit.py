"""`replaylake audit`: run every invariant query of sql/audits/ over a lake; exit 1 on a violation.

    replaylake audit --lake runs/demo/latest/lake --threshold 3

Each audit returns the rows that break its invariant (empty = pass). `certificate_holds` lists
every trained row over its bound (`stale_bound_respected` every selection over T); the rows a
strategy allows (`wait`: finished groups that waited; `mask`: the masked rows) are counted in a
note, and only the others fail the audit. Audits with
parameters need them on the command line (`stale_bound_respected` needs --threshold, the run's
max_off_policy_threshold under `drop`); without them they are reported as skipped, not passed.
Read-only and safe while a buffer writes (pipeline.analysis.views.connect takes a consistent snapshot).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer

SHOWN_ROWS = 5
# the audits listing selections or rows over their bound, some of which a strategy allows (each
# row carries the strategy its selection recorded)
OVER_BOUND_AUDITS = ("certificate_holds", "stale_bound_respected")


@dataclass(frozen=True)
class AuditResult:
    """One audit's outcome: `pass`, `FAIL` (with the violating rows) or `skipped` (why); a
    note says what it found that the run's strategy allows (a pass still)."""

    name: str
    status: str
    rows: list[dict]
    note: str = ""
    params: dict = field(default_factory=dict)     # the values its parameters were given


def run_audits(lake: Path, threshold: int | None = None) -> list[AuditResult]:
    """Every audit of sql/audits/ over ``lake``, by name. The threshold defaults to the one the
    lake recorded (a `drop` run's max_off_policy_threshold)."""
    from pipeline.analysis import connect
    from pipeline.decide import OVER_BOUND_ALLOWED
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
        params = {p.name: available[p.name] for p in q.params}
        rows = loader.run(con, q, **params).to_pylist()
        allowed = _allowed(q.name, rows, OVER_BOUND_ALLOWED)
        rows = [r for r in rows if not allowed or r.get("strategy") not in allowed]
        out.append(AuditResult(q.name, "FAIL" if rows else "pass", rows, "; ".join(
            f"{n:,} row(s) over the bound under `{s}`, which it allows: {OVER_BOUND_ALLOWED[s]} "
            f"(the certificates view lists them)" for s, n in allowed.items()), params))
    return out


def _allowed(audit: str, rows: list[dict], strategies: dict[str, str]) -> dict[str, int]:
    """The rows of an over-bound audit whose strategy allows them, counted per strategy."""
    if audit not in OVER_BOUND_AUDITS:
        return {}
    out: dict[str, int] = {}
    for r in rows:
        if r.get("strategy") in strategies:
            out[r["strategy"]] = out.get(r["strategy"], 0) + 1
    return out


def main(
    lake: Annotated[Path, typer.Option("--lake", help="the lake directory")],
    threshold: Annotated[int | None, typer.Option(
        "--threshold", min=1,
        help="override the max_off_policy_threshold the lake recorded")] = None,
) -> None:
    """Run every audit query over a lake; exit code 1 when any audit finds a violation.

    Examples:
        replaylake audit --lake runs/demo/latest/lake
    """
    from jobs.cli import echo_wrapped, terminal_width
    results = run_audits(lake, threshold)
    width = terminal_width()
    for r in results:
        head = f"{r.status:>7}  {r.name}" + (f" ({len(r.rows):,} violating row(s))" if r.rows
                                               else "")
        if r.note and len(head) + len(r.note) + 3 <= width:     # a short note: on its line
            typer.echo(f"{head} ({r.note})")
        else:
            typer.echo(head)
            if r.note:
                echo_wrapped(r.note, " " * 9, " " * 9)
        for row in r.rows[:SHOWN_ROWS]:   # one violating row: its columns, wrapped
            echo_wrapped(", ".join(f"{k}={v}" for k, v in row.items()), " " * 9 + "- ", " " * 11)
        if len(r.rows) > SHOWN_ROWS:     # the command that lists them all, runnable as shown
            params = "".join(f" --param {k}={v}" for k, v in r.params.items())
            echo_wrapped(f"(+{len(r.rows) - SHOWN_ROWS:,} more: replaylake sql --lake {lake} "
                         f"--name {r.name}{params})", " " * 9, " " * 10)
    failed = [r.name for r in results if r.status == "FAIL"]
    skipped = sum(r.status == "skipped" for r in results)
    typer.echo(f"{len(results) - len(failed) - skipped} passed, {len(failed)} failed, "
               f"{skipped} skipped" + (f": FAILED {', '.join(failed)}" if failed else ""))
    if failed:
        raise typer.Exit(1)


if __name__ == "__main__":
    from jobs.cli import run
    run(main)       # through the one handler of user errors
