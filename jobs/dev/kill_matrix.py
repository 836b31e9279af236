"""The kill matrix: the crash workload replayed in a child killed at one lake write point, and
every check of the restart after it (the soak runs it over every point; the tests over some).

A child is forked from a fork server and dies at its point by SIGKILL; on the lake it left the
history must end at a whole write, hold every acknowledged row once, and a restored buffer must
equal the untouched run's state, keep writing, restart again cleanly and pass every audit.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobs.dev.crash_workload import (
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
_PRELOAD = ["jobs.dev.crash_workload", "pyarrow", "pyarrow.compute", "pyarrow.parquet", "numpy",
            "polars", "pipeline", "pipeline.buffer", "pipeline.state.rebuild", "pipeline.decide.poll",
            "pipeline.lake.writer", "pipeline.lake.compaction", "pipeline.lake.retention",
            "jobs.dev.soak_jobs"]


def forkserver():
    """Kill children are forked from a fork server that has imported the library and run
    nothing: forking this process instead would copy thread pools (polars', Arrow's) whose threads
    do not exist in the child, and the child would hang on its first parallel query."""
    global _FORKS
    if _FORKS is None:
        import multiprocessing
        _FORKS = multiprocessing.get_context("forkserver")
        _FORKS.set_forkserver_preload(["jobs.dev.kill_matrix", *_PRELOAD])
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


