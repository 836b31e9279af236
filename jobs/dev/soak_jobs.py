"""The soak's rounds for the jobs that rewrite a lake: compaction and retention killed at every
point where they write (`pipeline.lake.kill`: `compact.*`, `retain.*`), on the lake a crash
workload left (`jobs.dev.crash_workload`).

Each workload's finished lake is compacted once untouched, and retained untouched at three
horizons in a row (so a file goes through several generations), learning each job's kill points
and what every reader says before and after it. Then, for every point, a fresh copy of the lake
gets a reader connected to it, a forked child runs the job with the point armed and dies there
by SIGKILL, and on what it left:

1. before anything is repaired, every reader sees the lake it saw before the job: the connection
   made before the job answers exactly as it did; a fresh connection and the lake reader give
   every row once, each with its whole payload or none of it (retention drops it, nothing else);
   the highest seq is the same; `lake check` finds no damage;
2. a re-run of the job leaves exactly what an untouched run leaves: the same files (no segment,
   checksum, temporary or superseded file behind), the same rows and answers, nothing for
   `lake check` to list; the connection made before the job still answers as it did;
3. a buffer restored on it equals the workload's final state, keeps writing, and a second restart
   reads everything once; every audit passes (`jobs.dev.kill_matrix.check_restart`).
"""
from __future__ import annotations

import os
import shutil
import signal
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs.dev.crash_workload import Reference, history
from jobs.dev.kill_matrix import check_restart, forkserver, spread

HORIZONS = (2, 1, 0)        # retention runs in a row: each drops the payload of more groups
QUERIES = (
    "select count(*), count(distinct seq), sum(reward) from trajectories",
    "select kind, count(*) from decisions group by kind order by kind",
    "select partition, uid, fate from groups order by partition, uid",
    "select seq, prompt_ids, response_ids, rollout_log_probs from trajectories order by seq",
)
PAYLOAD = len(QUERIES) - 1          # the one query whose rows retention changes


@dataclass
class JobReference:
    """What the untouched jobs did on one workload's finished lake."""

    ref: Reference
    lake: Path                      # the workload's lake, never compacted
    compacted: Path                 # ... compacted untouched (where retention starts)
    points: dict[str, list[str]]    # job -> the kill points it reached, in order
    before: dict[str, list]         # job -> the answers before it
    after: dict[str, list]          # job -> the answers after it
    histories: dict[str, list[tuple]]   # "lake" | "compacted" | "retained" -> history
    names: dict[str, list[str]]     # job -> the lake's Parquet files after it
    top: int


def run(job: str, lake: Path) -> None:
    """The job as the soak runs it: one compaction, or retention at each of HORIZONS."""
    from pipeline.lake import compact, retain
    if job == "compact":
        compact(lake)
        return
    for h in HORIZONS:
        retain(lake, h)


def answers(lake: Path, con: Any = None, queries: tuple[str, ...] | list[str] = QUERIES) -> list:
    """Every query's rows, on a fresh connection (or ``con``, left open)."""
    from pipeline.analysis import connect
    mine = con is None
    con = connect(lake) if mine else con
    try:
        return [con.sql(q).fetchall() for q in queries]
    finally:
        if mine:
            con.close()


def parquet_names(lake: Path) -> list[str]:
    """Every Parquet file of the lake, relative to it: which generation each segment is at."""
    from pipeline.lake import segment_files
    from schemas import LAKE_TABLES
    return sorted(str(p.relative_to(lake)) for t in LAKE_TABLES for p in segment_files(lake, t)
                  if p.suffix == ".parquet")


def _traced(job: str, lake: Path) -> list[str]:
    from pipeline.lake import kill as lake_kill
    os.environ[lake_kill.ENV] = "trace"
    try:
        lake_kill.arm()
        run(job, lake)
        return lake_kill.trace()
    finally:
        del os.environ[lake_kill.ENV]
        lake_kill.arm()


def job_reference(ref: Reference, workdir: Path) -> JobReference:
    """Run compaction and retention untouched on a copy of ``ref``'s finished lake."""
    lake = workdir / f"ref-{ref.kind}-{ref.seed}-{int(ref.fsync)}"
    base = workdir / f"jobs-{lake.name}"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    plain = shutil.copytree(lake, base / "lake")
    compacted = shutil.copytree(plain, base / "compacted")
    points = {"compact": _traced("compact", compacted)}
    retained = shutil.copytree(compacted, base / "retained")
    points["retain"] = _traced("retain", retained)
    from pipeline.lake import highest_seq
    return JobReference(
        ref, plain, compacted, points,
        before={"compact": answers(plain), "retain": answers(compacted)},
        after={"compact": answers(compacted), "retain": answers(retained)},
        histories={"lake": history(plain), "compacted": history(compacted),
                   "retained": history(retained)},
        names={"compact": parquet_names(compacted), "retain": parquet_names(retained)},
        top=highest_seq(plain))


def job_targets(jref: JobReference) -> list[tuple[str, str]]:
    """(job, `<point>:<occurrence>`) for every point each untouched job reached."""
    out = []
    for job, points in jref.points.items():
        seen: Counter[str] = Counter()
        for p in points:
            seen[p] += 1
            out.append((job, f"{p}:{seen[p]}"))
    return out


def _child(job: str, lake: str, target: str) -> None:
    from pipeline.lake import kill as lake_kill
    os.environ[lake_kill.ENV] = target
    lake_kill.arm()
    run(job, Path(lake))
    os._exit(3)


def kill_job(job: str, lake: Path, target: str) -> None:
    """Run ``job`` on ``lake`` in a child that dies at ``target``."""
    proc = forkserver().Process(target=_child, args=(job, str(lake), target))
    proc.start()
    proc.join()
    if proc.exitcode != -signal.SIGKILL:
        raise AssertionError(f"{job} at {target}: the child was not killed there "
                             f"(exit {proc.exitcode})")


def _whole_rows(seen: list[tuple], old: list[tuple], new: list[tuple], what: str) -> None:
    """Every row once, each as it was or as the untouched job left it (never anything else)."""
    assert [r[0] for r in seen] == [r[0] for r in old], f"{what}: not every row exactly once"
    bad = [s[0] for s, a, b in zip(seen, old, new) if s not in (a, b)]
    assert not bad, f"{what}: rows at seq {bad[:3]} are neither as before nor as after"


def check_job(jref: JobReference, job: str, lake: Path, held: Any) -> None:
    """Every check after a job was killed on ``lake``; ``held`` connected before the job."""
    from pipeline.lake import check, highest_seq
    old, new = jref.before[job], jref.after[job]
    h_old = jref.histories["lake" if job == "compact" else "compacted"]
    h_new = jref.histories["compacted" if job == "compact" else "retained"]
    assert answers(lake, held) == old, "a connection made before the job answers differently"
    now = answers(lake)
    assert now[:PAYLOAD] == old[:PAYLOAD], "the queries answer differently"
    _whole_rows(now[PAYLOAD], old[PAYLOAD], new[PAYLOAD], "SQL")
    _whole_rows(history(lake), h_old, h_new, "the lake reader")
    assert highest_seq(lake) == jref.top, "the highest seq changed"
    damaged = check(lake).damaged
    assert not damaged, f"lake check finds damage: {damaged[:2]}"
    run(job, lake)
    assert parquet_names(lake) == jref.names[job], "the re-run left other files"
    assert history(lake) == h_new and answers(lake) == new, "the re-run left other rows"
    assert check(lake).findings == [], "the re-run left something for lake check to list"
    assert answers(lake, held) == old, "a connection made before the job changed its answers"
    check_restart(jref.ref, lake, len(jref.ref.acked) - 1, h_new)


def _kill_jobs(jref: JobReference, workdir: Path, todo: list[tuple[str, str]],
               progress: Callable[[int], Any] | None = None) -> list[str]:
    import logging
    logging.getLogger("replaylake").setLevel(logging.ERROR)
    from pipeline.analysis import connect
    problems = []
    lake = workdir / "killed"
    for job, target in todo:
        shutil.rmtree(lake, ignore_errors=True)
        shutil.copytree(jref.lake if job == "compact" else jref.compacted, lake)
        held = connect(lake)
        try:
            kill_job(job, lake, target)
            check_job(jref, job, lake, held)
        except Exception as exc:               # report every failing point, not just the first
            r = jref.ref
            problems.append(f"{r.kind} seed {r.seed} fsync={r.fsync} {job} {target}: {exc!r}")
        finally:
            held.close()
        if progress is not None:
            progress(1)
    shutil.rmtree(workdir, ignore_errors=True)
    return problems


def run_jobs(jref: JobReference, workdir: Path, chosen: list[tuple[str, str]] | None = None,
             progress: Callable[[int], Any] | None = None, workers: int = 1) -> list[str]:
    """Kill the jobs at every target (or ``chosen``); the problems found (empty: all held)."""
    todo = chosen if chosen is not None else job_targets(jref)
    return spread(_kill_jobs, jref, workdir, todo, progress, workers)


__all__ = ["JobReference", "job_reference", "job_targets", "run_jobs", "kill_job", "check_job",
           "answers", "parquet_names", "HORIZONS", "QUERIES"]
