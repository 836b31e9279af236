"""`replaylake soak`: kill a scripted buffer run at every lake write point and check each restart.

    replaylake soak --rounds 5            # every kill point of both workloads, 5 seeds each

A workload (ingest across two partitions, status changes, samples that evict, refill, select and
discard, releases, a batch held across steps) runs once untouched to learn its kill points (see
`pipeline.lake_kill`), its history and its state after every call. Then, for every point, a forked
child replays it with `REPLAYLAKE_KILL_AT` armed and dies there by SIGKILL. On the lake it left:

1. the lake holds exactly the untouched run's history up to a whole write: every acknowledged
   row and decision once, nothing of a torn or uncommitted write, no seq twice;
2. a restored buffer equals the untouched run's live state after the same call;
3. the restarted buffer keeps writing (a call across two partitions), and a second restart
   reads all of it once, with no seq and no trajectory twice;
4. the audit queries (sql/audits/) return no rows over all of it.

The test suite runs one round of both workloads (several hundred kills); this job runs thousands.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

THRESHOLD = 2
STEPS = 4


def _rows(uid: str, part: str, rewards: list[float], lo: int, hi: int) -> list[dict]:
    return [{"partition": part, "uid": uid, "session_id": s, "min_global_steps": lo,
             "max_global_steps": hi, "reward": r, "prompt_ids": [1, 2, s],
             "response_ids": list(range(1 + (s + len(uid)) % 4))} for s, r in enumerate(rewards)]


def open_buffer(kind: str, lake: Path, fsync: bool, seed: int):
    """The workload's buffer; its refill_fn settles new groups at once (rollouts are instant)."""
    from pipeline import ReplayBuffer
    rng = random.Random(seed * 7919 + 1)
    box: dict[str, Any] = {"next": 0, "step": 1}

    def refill(k: int) -> None:
        buf, step = box["buf"], box["step"]
        uids = [f"r{step}x{box['next'] + i}" for i in range(k)]
        box["next"] += k
        buf.register(partition="train", uids=uids, global_steps=step, n=2)
        buf.put([r for u in uids for r in _rows(u, "train", [0.0, 1.0], step - 1, step - 1)])
        buf.update_status(partition="train", uids=uids,
                          status="failure" if rng.random() < 0.1 else "finished")

    common = dict(lake=lake, fsync=fsync, filter_groups_metric="reward", refill_fn=refill,
                  poll_interval=0.001)
    if kind == "async":
        buf = ReplayBuffer.async_(max_off_policy_threshold=THRESHOLD, **common)
    else:
        buf = ReplayBuffer.sync(train_batch_size=2, gen_batch_size=1,
                                max_inflight_gen_batches=2, **common)
    box["buf"] = buf
    return buf, box


def workload(kind: str, lake: Path, fsync: bool, seed: int, mark: Callable[[Any], None]) -> None:
    """The scripted run; ``mark(buf)`` after every acknowledged call."""
    rng = random.Random(seed)
    buf, box = open_buffer(kind, lake, fsync, seed)
    held = None
    for step in range(1, STEPS + 1):
        box["step"] = step
        groups = [(f"s{step}g{i}", "train") for i in range(3)]
        if step % 2 == 0:
            groups.append((f"s{step}v", "val"))
        uids = {p: [u for u, q in groups if q == p] for p in ("train", "val")}
        buf.register({"partition": [p for _, p in groups], "uid": [u for u, _ in groups],
                      "global_steps": [step] * len(groups), "n": [2] * len(groups)})
        mark(buf)
        for p, us in uids.items():
            if us:
                buf.update_status(partition=p, uids=us, status="running")
                mark(buf)
        rows = []
        for u, p in groups:
            flat = rng.random() < 0.3                     # zero variance: evicted, refilled
            lo = step - 1 - (3 if rng.random() < 0.25 else 0)   # some come back stale
            rows += _rows(u, p, [1.0, 1.0] if flat else [0.0, 1.0], max(lo, 0), step - 1)
        buf.put(rows)                                     # one call over both partitions
        mark(buf)
        for p, us in uids.items():
            if us:
                fail = [u for u in us if rng.random() < 0.15]
                buf.update_status(partition=p, uids=[u for u in us if u not in fail],
                                  status="finished")
                mark(buf)
                if fail:
                    buf.update_status(partition=p, uids=fail, status="failure")
                    mark(buf)
        batch = buf.sample(step, "train", 2, timeout=30)
        mark(buf)
        if held is not None:
            buf.release(held)
            mark(buf)
        held = batch                                      # held across the next step
        if uids["val"]:
            buf.release(buf.sample(step, "val", 1, timeout=30))
            mark(buf)
    buf.close()


def state(buf) -> dict:
    """What a restart must reproduce: per partition, counts, sampleable groups, held batches."""
    return {p: [buf.counts(p), buf.get_sampleable_count(STEPS + 1, p),
                sorted(buf.held_batches(p).items())] for p in buf.partitions()}


def history(lake: Path) -> list[tuple]:
    """Every visible row of every table (without wall-clock time), in seq order."""
    from pipeline.lake import read_table
    from schemas import LAKE_TABLES
    out = []
    for name, schema in LAKE_TABLES.items():
        t = read_table(lake, name)
        cols = [f.name for f in schema if f.name != "ts"]
        out += [(r["seq"], name, json.dumps(r, sort_keys=True, default=str))
                for r in t.select(cols).to_pylist()]
    return sorted(out)


@dataclass
class Reference:
    kind: str
    fsync: bool
    seed: int
    points: list[str]
    history: list[tuple]
    boundaries: set[int]              # the last seq of every write (a call's atomic unit)
    acked: list[int]                  # highest visible seq after call k (acked[0]: none yet)
    states: list[dict]


def reference(kind: str, workdir: Path, *, fsync: bool = False, seed: int = 0) -> Reference:
    """Run the workload untouched (tracing its kill points) and record what it did."""
    from pipeline import lake_kill
    from pipeline.lake_read import read_log
    lake = workdir / f"ref-{kind}-{seed}-{int(fsync)}"
    shutil.rmtree(lake, ignore_errors=True)
    acked, states = [-1], [{}]

    def mark(buf) -> None:
        seqs = [s for s, _, _ in history(lake)]
        acked.append(max(seqs, default=-1))
        states.append(state(buf))

    os.environ[lake_kill.ENV] = "trace"
    try:
        workload(kind, lake, fsync, seed, mark)
        points = lake_kill.trace()
    finally:
        del os.environ[lake_kill.ENV]
    hist = history(lake)
    bounds = _write_ends(lake, read_log(lake))
    return Reference(kind, fsync, seed, points, hist, bounds, acked, states)


def _write_ends(lake: Path, log) -> set[int]:
    from pipeline.lake_files import CALL_KEY, segment_files
    from pipeline.lake_read import batches
    from schemas import LAKE_TABLES
    ends = set()
    for name in LAKE_TABLES:
        for path in segment_files(lake, name):
            for b, meta in batches(path):
                if b.num_rows and CALL_KEY not in (meta or {}):
                    ends.add(int(b.column("seq")[b.num_rows - 1].as_py()))
    kinds = log.column("kind").to_pylist()
    ends.update(s for k, s in zip(kinds, log.column("last_seq").to_pylist()) if k == "commit")
    return ends


def targets(ref: Reference) -> list[str]:
    """`<point>:<occurrence>` for every point the untouched run reached."""
    seen: dict[str, int] = {}
    out = []
    for p in ref.points:
        seen[p] = seen.get(p, 0) + 1
        out.append(f"{p}:{seen[p]}")
    return out


_FORKS: Any = None
# imported (never run) by the fork server, so a kill child starts warm
_PRELOAD = ["pyarrow", "pyarrow.compute", "pyarrow.parquet", "numpy", "polars", "pipeline",
            "pipeline.buffer", "pipeline.restore", "pipeline.sampling", "pipeline.lake"]


def _forkserver():
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
    from pipeline import lake_kill
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
    ctx = _forkserver()
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
    from jobs.audit import run_audits
    seen = history(lake)
    top = max((s for s, _, _ in seen), default=-1)
    assert top in ref.boundaries | {-1}, f"visible rows end inside a write (seq {top})"
    assert seen == [h for h in ref.history if h[0] <= top], "the history is not the reference's"
    assert top >= ref.acked[calls], f"acknowledged rows lost: seq {top} < {ref.acked[calls]}"
    buf, _ = open_buffer(ref.kind, lake, ref.fsync, ref.seed)
    try:
        for k in (calls, calls + 1):
            if k < len(ref.acked) and top == ref.acked[k]:
                assert state(buf) == ref.states[k], f"restored state differs after call {k}"
        buf.register({"partition": ["train", "val"], "uid": ["after-t", "after-v"],
                      "global_steps": [STEPS + 1] * 2, "n": [2] * 2})
        buf.put(_rows("after-t", "train", [0.0, 1.0], STEPS, STEPS)
                + _rows("after-v", "val", [0.0, 1.0], STEPS, STEPS))
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
    if workers <= 1:
        return _kill_each(ref, workdir / "w0", todo, progress)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    chunks = [todo[i:i + 8] for i in range(0, len(todo), 8)]
    problems: list[str] = []
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        futures = {pool.submit(_kill_each, ref, workdir / f"w{i}", chunk): len(chunk)
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
) -> None:
    """Kill the buffer at every lake write point, many times over; exit 1 on any broken restart."""
    from tqdm import tqdm
    base = Path(tempfile.mkdtemp(prefix="replaylake-soak-")) if workdir is None else workdir
    base.mkdir(parents=True, exist_ok=True)
    refs = [reference(kind, base, fsync=f, seed=s) for s in range(rounds)
            for kind in ("async", "sync") for f in ((False, True) if fsync else (False,))]
    total = sum(len(r.points) for r in refs)
    problems: list[str] = []
    with tqdm(total=total, unit="kill", desc="soak") as bar:
        for ref in refs:
            problems += run_matrix(ref, base, progress=bar.update, workers=workers)
    for p in problems:
        typer.echo(p)
    kinds = {p.split(".", 1)[1] for r in refs for p in r.points}
    typer.echo(f"{total} kills at {len({p for r in refs for p in r.points})} distinct points "
               f"({len(kinds)} kinds of write point, {len(refs)} runs); "
               f"{total - len(problems)} restarts correct, {len(problems)} broken")
    if workdir is None:
        shutil.rmtree(base, ignore_errors=True)
    if problems:
        raise typer.Exit(1)


if __name__ == "__main__":
    typer.run(main)
