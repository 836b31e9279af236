"""The crash matrix's scripted workloads and their untouched reference runs (see jobs/dev/kill_matrix.py).

Two workloads over two partitions: `async` (drop bound, zero-variance filter, refill) and `sync`
(DAPO credit, surplus discard). Each covers ingest across both partitions in one call, status
changes, samples that evict, refill, select and discard, releases, and a batch held across steps.
`reference` runs one untouched, tracing its kill points, and records its history (every visible
row, in seq order), where each write ends, and its live state after every acknowledged call.
"""
from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

THRESHOLD = 2
STEPS = 4


def group_rows(uid: str, part: str, rewards: list[float], lo: int, hi: int) -> list[dict]:
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
        buf.put([r for u in uids for r in group_rows(u, "train", [0.0, 1.0], step - 1, step - 1)])
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


def workload(kind: str, lake: Path, fsync: bool, seed: int, mark: Callable[[Any], None],
             wrap: Callable[[Any], Any] | None = None) -> None:
    """The scripted run; ``mark(buf)`` after every acknowledged call. ``wrap(buf)`` gives what
    the run (its refill_fn too) calls instead of the buffer (the interrupt tests retry there)."""
    rng = random.Random(seed)
    buf, box = open_buffer(kind, lake, fsync, seed)
    if wrap is not None:
        buf = box["buf"] = wrap(buf)
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
            rows += group_rows(u, p, [1.0, 1.0] if flat else [0.0, 1.0], max(lo, 0), step - 1)
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
    from pipeline.lake import kill as lake_kill
    from pipeline.lake import read_log
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
    from pipeline.lake import CALL_KEY, segment_files
    from pipeline.lake import verified_batches as batches
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
