"""`replaylake audit`: run every invariant query of sql/audits/ over a lake; exit 1 on a violation.

    replaylake audit --lake runs/demo/latest/lake --threshold 3

Each audit returns the rows that break its invariant (empty = pass). `certificate_holds` lists
every trained row over its bound (`stale_bound_respected` every selection over its bound); the
rows a strategy allows (`wait`: finished groups that waited; `mask`: the masked rows) are counted
in a note, and only the others fail the audit. Audits with parameters need them: a `drop` lake's
recorded max_off_policy_threshold gives `stale_bound_respected` its bounds (under a per-dataset
mapping each group is held to its dataset's bound, or the "*" default, as the buffer judged it),
and `--threshold N` holds every group to the one bound N instead; without either they are
reported as skipped, not passed. Read-only and safe while a buffer writes
(pipeline.analysis.views.connect takes a consistent snapshot).
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from jobs.cli import LakeArg, LakeOpt

SHOWN_ROWS = 5
# the audits listing selections or rows over their bound, some of which a strategy allows (each
# row carries the strategy its selection recorded)
OVER_BOUND_AUDITS = ("certificate_holds", "stale_bound_respected")
BOUNDS_RELATION = "stale_bounds"    # the per-dataset bounds an audit joins on the group's dataset


@dataclass(frozen=True)
class AuditResult:
    """One audit's outcome: `pass`, `FAIL` (with the violating rows) or `skipped` (why); a
    note says what it found that the run's strategy allows (a pass still)."""

    name: str
    status: str
    rows: list[dict]
    note: str = ""
    params: dict = field(default_factory=dict)     # the values its parameters were given
    # the per-dataset bounds it joined (dataset -> bound; empty: every group held to the threshold)
    by_dataset: dict[str, int] = field(default_factory=dict)


# the strategies whose selections the recorded threshold bounds (`wait` and `mask` let rows
# over it be trained: the audits count those in a note)
BOUNDED_BY_THRESHOLD = ("drop", "admit")


def audit_bounds(recorded: dict[str, Any] | None, threshold: int | None
                 ) -> tuple[int | None, dict[str, int]]:
    """The staleness bounds the audits hold selections to, as (the bound of every group, the
    per-dataset bounds that replace it for their datasets): ``threshold`` for every group when
    one is asked for, else those of a `drop` or `admit` run's recorded max_off_policy_threshold
    (under `admit` the `stale` rule stays on as its safety net; one bound,
    or a mapping's named datasets with its "*" default), else none (the audits needing a
    threshold are skipped). The recorded setting is read by the buffer's own configuration, so
    a mapping means to the audit what it meant to the run."""
    from pipeline.config import ThresholdError, async_config
    if threshold is not None:
        return threshold, {}
    if not recorded or recorded.get("max_off_policy_strategy") not in BOUNDED_BY_THRESHOLD:
        return None, {}
    try:
        stale = async_config(max_off_policy_threshold=recorded.get("max_off_policy_threshold")).stale
    except ThresholdError as exc:
        raise ThresholdError(f"the lake recorded a max_off_policy_threshold the audit cannot "
                             f"read ({exc}); give the bound to hold every selection to with "
                             "--threshold N") from exc
    return stale.threshold, dict(stale.by_dataset)


def run_audits(lake: Path, threshold: int | None = None) -> list[AuditResult]:
    """Every audit of sql/audits/ over ``lake``, by name. Without ``threshold`` the bounds are
    the ones the lake recorded (a `drop` or `admit` run's max_off_policy_threshold, per dataset under a
    mapping); with it every group is held to that one bound."""
    import pyarrow as pa

    from pipeline.analysis import connect
    from pipeline.lake import config as lake_config
    from pipeline.lake import require_lake
    from schemas import STALE_BOUNDS
    from sql import loader

    recorded = lake_config.current(require_lake(lake))
    default, by_dataset = audit_bounds(recorded, threshold)
    con = connect(lake, filter_metric=(recorded or {}).get("filter_groups_metric") or "reward")
    con.register(BOUNDS_RELATION, pa.Table.from_pylist(
        [{"dataset": d, "bound": b} for d, b in by_dataset.items()], schema=STALE_BOUNDS))
    available = {"threshold": default}
    out = []
    for q in loader.in_folder("audits"):
        missing = [p.name for p in q.params if available.get(p.name) is None]
        if missing:
            out.append(AuditResult(q.name, "skipped", [], f"needs --{', --'.join(missing)}"))
            continue
        joined = by_dataset if BOUNDS_RELATION in q.tables else {}
        out.append(_audit(con, q, {p.name: available[p.name] for p in q.params}, joined))
    return out


def _audit(con: Any, q: Any, params: dict[str, Any], by_dataset: dict[str, int]) -> AuditResult:
    """One audit run with ``params``: its violating rows, those a strategy allows counted apart."""
    from pipeline.decide import OVER_BOUND_ALLOWED
    from sql import loader
    rows = loader.run(con, q, **params).to_pylist()
    allowed = _allowed(q.name, rows, OVER_BOUND_ALLOWED)
    rows = [r for r in rows if not allowed or r.get("strategy") not in allowed]
    note = "; ".join(f"{n:,} row(s) over the bound under `{s}`, which it allows: "
                     f"{OVER_BOUND_ALLOWED[s]} (the certificates view lists them)"
                     for s, n in allowed.items())
    return AuditResult(q.name, "FAIL" if rows else "pass", rows, note, params, by_dataset)


def listing_command(lake: Path, r: AuditResult) -> str:
    """The `replaylake sql` command listing every violating row of ``r``, runnable as shown: the
    named query with its parameters; under per-dataset bounds (which `replaylake sql` does not
    read from the lake) the query as a table macro, with the bounds it joined given inline."""
    where = shlex.quote(str(lake))
    if not r.by_dataset:
        params = "".join(f" --param {k}={v}" for k, v in r.params.items())
        return f"replaylake sql --lake {where} --name {r.name}{params}"
    bounds = ", ".join(f"({_sql_text(d)}, {b})" for d, b in r.by_dataset.items())
    args = ", ".join(str(v) for v in r.params.values())
    sql = (f"with {BOUNDS_RELATION}(dataset, bound) as (values {bounds}) "
           f"select * from {r.name}({args})")
    return f"replaylake sql --lake {where} {_shell_word(sql)}"


def _shown(value: Any) -> str:
    """A violating row's value as `replaylake sql` prints it: NULL for a missing one."""
    from jobs.sql.render import cell
    return cell(value)


def _sql_text(value: str) -> str:
    """``value`` as an SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


def _shell_word(text: str) -> str:
    """``text`` as one shell word: in double quotes while it holds nothing a shell expands there
    (so its SQL string literals read as written), else as `shlex.quote` writes it."""
    return f'"{text}"' if not set(text) & set('"$`\\!') else shlex.quote(text)


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
    lake_arg: LakeArg = None,
    lake_opt: LakeOpt = None,
    threshold: Annotated[int | None, typer.Option(
        "--threshold", min=1,
        help="hold every selection to this one staleness bound instead of the bounds the "
             "lake recorded (a drop run's max_off_policy_threshold, per dataset under a "
             "mapping)")] = None,
) -> None:
    """Run every audit query over a lake; exit code 1 when any audit finds a violation.

    Examples:
        replaylake audit --lake runs/demo/latest/lake
        replaylake audit runs/demo/latest/lake
    """
    from jobs.cli import echo_wrapped, one_lake, terminal_width
    lake = one_lake("audit", lake_arg, lake_opt)
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
            echo_wrapped(", ".join(f"{k}={_shown(v)}" for k, v in row.items()), " " * 9 + "- ",
                         " " * 11)
        if len(r.rows) > SHOWN_ROWS:     # the command that lists them all, on a line of its own,
            typer.echo(f"{' ' * 9}(+{len(r.rows) - SHOWN_ROWS:,} more; all of them:)")
            typer.echo(f"{' ' * 9}{listing_command(lake, r)}")      # unwrapped: it pastes
    failed = [r.name for r in results if r.status == "FAIL"]
    skipped = sum(r.status == "skipped" for r in results)
    typer.echo(f"{len(results) - len(failed) - skipped} passed, {len(failed)} failed, "
               f"{skipped} skipped" + (f": FAILED {', '.join(failed)}" if failed else ""))
    if failed:
        raise typer.Exit(1)


if __name__ == "__main__":
    from jobs.cli import run
    run(main)       # through the one handler of user errors
