"""`replaylake soak`: kill a scripted buffer run at every lake write point and check each restart.

    replaylake soak --rounds 5            # every kill point of both workloads, 5 seeds each

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
they write (`jobs.soak_jobs`): after each kill every reader must see the lake it saw before the
job (a connection made before it answers exactly as before), a re-run must leave exactly what an
untouched run leaves, and a restart must pass the checks above.

The test suite runs part of one round (over 300 kills, and each job point once); this job runs
every point, thousands of times.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from jobs.crash_workload import (
    STEPS,
    THRESHOLD,
    Reference,
    group_rows,
    history,
    open_buffer,
    reference,
    state,
    targets,
    workload,
)

__all__ = ["Reference", "check", "history", "kill_at", "open_buffer", "reference", "run_matrix",
           "state", "targets", "workload"]


_FORKS: Any = None
# imported (never run) by the fork server, so a kill child starts warm
_PRELOAD = ["jobs.crash_workload", "pyarrow", "pyarrow.compute", "pyarrow.parquet", "numpy",
            "polars", "pipeline", "pipeline.buffer", "pipeline.state.rebuild", "pipeline.decide.poll",
            "pipeline.lake.writer", "pipeline.lake.compaction", "pipeline.lake.retention",
            "jobs.soak_jobs"]


def forkserver():
    """Kill children are forked from a fork server that has imported the library and run
    nothing: forking this process instead would copy thread pools (polars', Arrow's) whose threads
    do not exist in the child, and the child would hang on its first parallel query."""
    global _FORKS
    if _FORKS is None:
        import multiprocessing
        _FORKS = multiprocessing.get_context("forkserver")
        _FORKS.set_forkserver_preload(["jobs.soak", *_PRELOAD])
    return _FORKS


def _child(kind: str, fsync: bool, seed: int, target: str, lake: str, acks: Any) -> None:
    """The workload with ``target`` armed; it must die there (exit 3: it never got there)."""
    from pipeline.lake import kill as lake_kill
    os.environ[lake_kill.ENV] = target

    def mark(_buf: Any) -> None:
        acks.value += 1

    try:
        workload(kind, Path(lake), fsync, seed, mark)
    except BaseException:
        os.write(2, traceback.format_exc().encode())
        os._exit(4)
    os._exit(3)


def kill_at(ref: Reference, target: str, lake: Path) -> int:
    """Run the workload on ``lake`` in a child that dies at ``target``; returns how many calls it
    had acknowledged."""
    shutil.rmtree(lake, ignore_errors=True)
    ctx = forkserver()
    acks = ctx.Value("i", 0, lock=False)
    proc = ctx.Process(target=_child, args=(ref.kind, ref.fsync, ref.seed, target, str(lake),
                                            acks))
    proc.start()
    proc.join()
    if proc.exitcode != -signal.SIGKILL:
        raise AssertionError(f"{target}: the child was not killed there (exit {proc.exitcode})")
    return int(acks.value)


def check(ref: Reference, lake: Path, calls: int) -> None:
    """Every check of a restart after a kill (raises AssertionError naming what broke)."""
    seen = history(lake)
    top = max((s for s, _, _ in seen), default=-1)
    assert top in ref.boundaries | {-1}, f"visible rows end inside a write (seq {top})"
    assert seen == [h for h in ref.history if h[0] <= top], "the history is not the reference's"
    assert top >= ref.acked[calls], f"acknowledged rows lost: seq {top} < {ref.acked[calls]}"
    check_restart(ref, lake, calls, seen)


def check_restart(ref: Reference, lake: Path, calls: int, seen: list[tuple]) -> None:
    """A buffer restored on ``lake`` (whose history reads ``seen``, ``calls`` calls of the
    workload acknowledged) equals the untouched run's state, keeps writing, and a second restart
    reads everything once; every audit passes."""
    from jobs.audit import run_audits
    top = max((s for s, _, _ in seen), default=-1)
    buf, _ = open_buffer(ref.kind, lake, ref.fsync, ref.seed)
    try:
        for k in (calls, calls + 1):
            if k < len(ref.acked) and top == ref.acked[k]:
                assert state(buf) == ref.states[k], f"restored state differs after call {k}"
        buf.register({"partition": ["train", "val"], "uid": ["after-t", "after-v"],
                      "global_steps": [STEPS + 1] * 2, "n": [2] * 2})
        buf.put(group_rows("after-t", "train", [0.0, 1.0], STEPS, STEPS)
                + group_rows("after-v", "val", [0.0, 1.0], STEPS, STEPS))
    finally:
        buf.close()
    buf, _ = open_buffer(ref.kind, lake, ref.fsync, ref.seed)
    buf.close()
    after = history(lake)
    seqs = [s for s, _, _ in after]
    assert len(seqs) == len(set(seqs)), "a seq is used twice after the restart"
    assert after[: len(seen)] == seen, "the restart changed what the crash left"
    keys = [(json.loads(r)["partition"], json.loads(r)["uid"], json.loads(r)["session_id"])
            for _, t, r in after if t == "trajectories"]
    assert len(keys) == len(set(keys)), "a trajectory is in the lake twice"
    assert keys.count(("train", "after-t", 0)) == 1 and keys.count(("val", "after-v", 1)) == 1
    # the audits read the whole history: what the crash left and what the restart added
    failed = [a for a in run_audits(lake, THRESHOLD) if a.status == "FAIL"]
    assert not failed, f"audits failed: {failed}"


def run_matrix(ref: Reference, workdir: Path, chosen: list[str] | None = None,
               progress: Callable[[int], Any] | None = None, workers: int = 1) -> list[str]:
    """Kill at every target (or ``chosen``); returns the problems found (empty: all survived).
    ``workers`` > 1 spreads the kills over that many fresh processes (spawned, not forked, so
    no database or thread state of this process is copied)."""
    todo = chosen if chosen is not None else targets(ref)
    return spread(_kill_each, ref, workdir, todo, progress, workers)


def spread(each: Callable[..., list[str]], ref: Any, workdir: Path, todo: list,
           progress: Callable[[int], Any] | None, workers: int) -> list[str]:
    """``each(ref, workdir / "w<i>", chunk, progress)`` over chunks of ``todo``, in this process
    or spread over ``workers`` spawned ones; every problem they return."""
    if workers <= 1:
        return each(ref, workdir / "w0", todo, progress)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    chunks = [todo[i:i + 8] for i in range(0, len(todo), 8)]
    problems: list[str] = []
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        futures = {pool.submit(each, ref, workdir / f"w{i}", chunk): len(chunk)
                   for i, chunk in enumerate(chunks)}
        for f in as_completed(futures):
            problems += f.result()
            if progress is not None:
                progress(futures[f])
    return problems


def _kill_each(ref: Reference, workdir: Path, todo: list[str],
               progress: Callable[[int], Any] | None = None) -> list[str]:
    import logging
    logging.getLogger("replaylake").setLevel(logging.ERROR)   # every kill leaves a stale lock
    problems = []
    lake = workdir / "killed"
    for target in todo:
        try:
            check(ref, lake, kill_at(ref, target, lake))
        except Exception as exc:               # report every failing point, not just the first
            problems.append(f"{ref.kind} seed {ref.seed} fsync={ref.fsync} {target}: {exc!r}")
        if progress is not None:
            progress(1)
    shutil.rmtree(workdir, ignore_errors=True)
    return problems


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
             "on (jobs/crash_interrupt.py)")] = True,
) -> None:
    """Kill the buffer at every lake write point, and compaction and retention at theirs, many
    times over; exit 1 on any broken restart or reader.

    Examples:
        replaylake soak --rounds 1 --no-fsync
        replaylake soak --rounds 10 --workers 2
        replaylake soak --rounds 1 --no-interrupts
    """
    from tqdm import tqdm

    from jobs.soak_jobs import job_reference, job_targets, run_jobs
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

    from jobs import crash_interrupt
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
    typer.run(main)
