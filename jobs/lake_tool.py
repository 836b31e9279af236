"""`replaylake lake check|salvage`: find damage in a lake, and set it aside keeping what verifies.

    replaylake lake check --lake runs/demo/latest/lake    # exit 1 when anything is damaged or missing
    replaylake lake salvage --lake runs/demo/latest/lake  # needs the lake closed (takes the lock)

`check` only reads and is safe while a buffer writes. A torn tail (the write a crash interrupted)
is listed but is not damage: readers ignore it. Damage is a file that does not verify, a logged
segment that is gone, a segment whose writer's log is gone (`unlogged`), or rows of groups whose
registration is gone (`orphans`). `salvage` is refused while a buffer holds the lake; it moves
damaged files whole into `<lake>/_quarantine/<when>/` and writes back every acknowledged write
that still verifies; a buffer then opens the lake again. The writes it could not keep are counted,
and their bytes stay in the quarantine.
"""
from __future__ import annotations

import typer

from jobs.cli import LakeArg, LakeOpt, one_lake


def check(lake_arg: LakeArg = None, lake_opt: LakeOpt = None) -> None:
    """List damaged, missing and torn files of a lake; exit code 1 when any is damaged/missing.

    Examples:
        replaylake lake check --lake runs/demo/latest/lake
    """
    from pipeline.lake import check as run_check
    from pipeline.lake import describe, require_lake
    report = run_check(require_lake(one_lake("lake check", lake_arg, lake_opt)))
    for line in describe(report):
        typer.echo(line)
    bad = report.damaged
    typer.echo(f"{report.streams} stream(s), {report.acknowledged_bytes} acknowledged byte(s) "
               f"verified; {len(bad)} damaged or missing"
               + ("; run `replaylake lake salvage` to set them aside" if bad else ""))
    if bad:
        raise typer.Exit(1)


def salvage(lake_arg: LakeArg = None, lake_opt: LakeOpt = None) -> None:
    """Quarantine what is damaged, keep every write that verifies (the lake must be closed).

    Examples:
        replaylake lake salvage --lake runs/demo/latest/lake
    """
    from pipeline.lake import describe, require_lake
    from pipeline.lake import salvage as run_salvage
    report = run_salvage(require_lake(one_lake("lake salvage", lake_arg, lake_opt)))
    for line in describe(report):
        typer.echo(line)
    if not report.damaged:
        typer.echo("nothing to salvage: no damaged or missing file")
        return
    for path in report.quarantined:
        typer.echo(f"quarantined  {path}")
    typer.echo(f"kept {report.kept_writes} acknowledged write(s) that verify; "
               f"lost {report.lost_writes} (their bytes are in the quarantine)")
    if report.set_aside_rows:
        typer.echo(f"set aside {report.set_aside_rows} row(s) of groups whose registration is "
                   "gone (listed in the quarantine's orphans.json); restores skip them")


if __name__ == "__main__":
    from jobs.cli import run
    run(check)       # through the one handler of user errors
