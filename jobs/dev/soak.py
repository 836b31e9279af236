"""`replaylake dev soak`: kill a scripted buffer run at every lake write point and check each restart.

    replaylake dev soak --rounds 5            # every kill point of both workloads, 5 seeds each

A workload (ingest across two partitions, status changes, samples that evict, refill, select and
discard, releases, a batch held across steps) runs once untouched to learn its kill points (see
`pipeline.lake.kill`), its history and its state after every call. Then, for every point, a forked
child replays it with `REPLAYLAKE_KILL_AT` armed and dies there by SIGKILL. On the lake it left:

1. the lake holds exactly the untouched run's history up to a whole write: every acknowledged
   row and decision once, nothing of a torn or uncommitted write, no seq twice;
2. a restored buffer equals the untouched run's live state after the same call;
3. the restarted buffer keeps writing (a call across two partitions), and a second restart
   reads all of it once, with no seq and no trajectory twice;
4. the audit queries (sql/audits/) return no rows over all of it.

Then, on each workload's finished lake, compaction and retention are killed at every point where
they write (`jobs.dev.soak_jobs`): after each kill every reader must see the lake it saw before the
job (a connection made before it answers exactly as before), a re-run must leave exactly what an
untouched run leaves, and a restart must pass the checks above.

The test suite runs part of one round (over 300 kills, and each job point once); this job runs
every point, thousands of times.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from jobs.dev.crash_workload import Reference, reference, targets
from jobs.dev.kill_matrix import run_matrix
from jobs.dev.soak_jobs import job_reference, job_targets, run_jobs


def main(
    rounds: Annotated[int, typer.Option(help="seeds per workload (each: every kill point)")] = 3,
    fsync: Annotated[bool, typer.Option(help="also soak with fsync=True")] = True,
    workers: Annotated[int, typer.Option(help="processes killing in parallel")] = 2,
    workdir: Annotated[Path | None, typer.Option(help="scratch directory (default: a temp dir)")
                       ] = None,
    jobs: Annotated[bool, typer.Option(
        help="also kill compaction and retention at each of their points, on every "
             "workload's finished lake")] = True,
    interrupts: Annotated[bool, typer.Option(
        help="also strike every point with Ctrl-C and with a failing write, the process going "
             "on (jobs/dev/crash_interrupt.py)")] = True,
) -> None:
    """Kill the buffer at every lake write point, and compaction and retention at theirs, many
    times over; exit 1 on any broken restart or reader.

    Examples:
        replaylake dev soak --rounds 1 --no-fsync
        replaylake dev soak --rounds 10 --workers 2
        replaylake dev soak --rounds 1 --no-interrupts
    """
    from tqdm import tqdm

    base = Path(tempfile.mkdtemp(prefix="replaylake-soak-")) if workdir is None else workdir
    base.mkdir(parents=True, exist_ok=True)
    refs = [reference(kind, base, fsync=f, seed=s) for s in range(rounds)
            for kind in ("async", "sync") for f in ((False, True) if fsync else (False,))]
    jrefs = [job_reference(r, base) for r in refs] if jobs else []
    total = sum(len(r.points) for r in refs)
    job_kills = [t for j in jrefs for t in job_targets(j)]
    problems: list[str] = []
    job_problems: list[str] = []
    with tqdm(total=total + len(job_kills), unit="kill", desc="soak") as bar:
        for ref in refs:
            problems += run_matrix(ref, base, progress=bar.update, workers=workers)
        for jref in jrefs:
            job_problems += run_jobs(jref, base, progress=bar.update, workers=workers)
    strike_problems, struck = _strikes(refs, base, workers) if interrupts else ([], 0)
    for p in problems + job_problems + strike_problems:
        typer.echo(p)
    kinds = {p.split(".", 1)[1] for r in refs for p in r.points}
    typer.echo(f"{total} kills at {len({p for r in refs for p in r.points})} distinct points "
               f"({len(kinds)} kinds of write point, {len(refs)} runs); "
               f"{total - len(problems)} restarts correct, {len(problems)} broken")
    if jobs:
        per_job = {j: sum(k == j for k, _ in job_kills) for j in ("compact", "retain")}
        points = {t.rsplit(":", 1)[0] for _, t in job_kills}
        typer.echo(f"{per_job['compact']} compaction and {per_job['retain']} retention kills at "
                   f"{len(points)} distinct points ({len(jrefs)} lakes); "
                   f"{len(job_kills) - len(job_problems)} readers and restarts correct, "
                   f"{len(job_problems)} broken")
    if interrupts:
        typer.echo(f"{struck} strikes (Ctrl-C and failing writes, the process going on); "
                   f"{struck - len(strike_problems)} runs exact, {len(strike_problems)} broken")
    if workdir is None:
        shutil.rmtree(base, ignore_errors=True)
    if problems or job_problems or strike_problems:
        raise typer.Exit(1)


def _strikes(refs: list[Reference], base: Path, workers: int) -> tuple[list[str], int]:
    """The interrupt matrix at every point of every workload, both ways (see crash_interrupt)."""
    from tqdm import tqdm

    from jobs.dev import crash_interrupt
    todo = {id(r): [(t, h) for t in targets(r) for h in crash_interrupt.HOWS
                    if crash_interrupt.applies(t, h)] for r in refs}
    problems: list[str] = []
    with tqdm(total=sum(len(t) for t in todo.values()), unit="strike", desc="interrupts") as bar:
        for ref in refs:
            found, _ = crash_interrupt.run_strikes(ref, todo[id(ref)], base / "strikes",
                                                   workers=workers, progress=bar.update)
            problems += found
    return problems, sum(len(t) for t in todo.values())


if __name__ == "__main__":
    from jobs.cli import run
    run(main)       # through the one handler of user errors
