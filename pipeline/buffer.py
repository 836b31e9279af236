"""ReplayBuffer: orchestrates ingest, the lake journal, policies and sampling (no rules live here).

Threading: producers (many threads) and one consumer share one lock; `sample` waits on a condition
that producers notify, re-polling at least every `poll_interval`. `refill_fn` is called with the
lock released, because it registers new groups through this very buffer.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline import decide
from pipeline.batch import Batch
from pipeline.config import BufferConfig, async_config, sync_config
from pipeline.errors import IngestError, UnknownBatchError
from pipeline.ingest import (
    check_partition,
    validate_groups,
    validate_status,
    validate_trajectories,
)
from pipeline.journal import Journal
from pipeline.lake import LakeWriter
from pipeline.policies.context import PollContext
from pipeline.store import PartitionState


class ReplayBuffer:
    """The live buffer over an optional on-disk lake (``lake=None``: memory only).

    Opening an existing lake directory restores the buffer exactly as the last acknowledged
    write left it (same config required: classification depends on filter_groups_metric)."""

    def __init__(self, config: BufferConfig | None = None, *, lake: str | os.PathLike | None = None,
                 fsync: bool = False):
        self.config = config or sync_config()
        self._cond = threading.Condition(threading.RLock())
        self._parts: dict[str, PartitionState] = {}
        self._version = 0
        self._next_batch = 0
        self._next_call = 0
        self.lake_dir = lake
        self._listeners: list[Callable[[str, str, list[str], int | None], None]] = []
        writer = LakeWriter(lake, fsync=fsync) if lake is not None else None
        self._journal = Journal(writer)
        if lake is not None:
            from pipeline.restore import restore
            restore(self, lake)

    @classmethod
    def sync(cls, *, lake: str | os.PathLike | None = None, fsync: bool = False,
             **verl_kwargs: Any) -> ReplayBuffer:
        """verl's `ReplayBuffer` preset (keywords as verl's)."""
        return cls(sync_config(**verl_kwargs), lake=lake, fsync=fsync)

    @classmethod
    def async_(cls, *, lake: str | os.PathLike | None = None, fsync: bool = False,
               **verl_kwargs: Any) -> ReplayBuffer:
        """verl's `ReplayBufferAsync` preset (keywords as verl's)."""
        return cls(async_config(**verl_kwargs), lake=lake, fsync=fsync)

    # --- producers -----------------------------------------------------------------------------
    def _part(self, partition: str) -> PartitionState:
        p = self._parts.get(partition)
        if p is None:
            p = self._parts[partition] = PartitionState(partition, self.config.zero_variance.metric)
        return p

    def _lookup(self, partition: str, uid: str):
        p = self._parts.get(partition)
        return p.lookup(uid) if p is not None else None

    def add_listener(self, fn: Callable[[str, str, list[str], int | None], None]) -> None:
        """Call ``fn(kind, partition, uids, batch_id)`` after every evict / discard / select /
        release, under the buffer's lock (adapters mirror these effects onto their data plane)."""
        self._listeners.append(fn)

    def _emit(self, kind: str, partition: str, uids: list[str], batch_id: int | None) -> None:
        for fn in self._listeners:
            fn(kind, partition, uids, batch_id)

    def _changed(self) -> None:
        self._version += 1
        self._cond.notify_all()

    def register(self, data: Any = None, *, partition: str | None = None,
                 uids: list[str] | None = None, global_steps: int | None = None,
                 n: int | None = None) -> None:
        """Register prompt groups as `pending` (rows of partition, uid, global_steps[, n]), or the
        shorthand ``register(partition=, uids=, global_steps=, n=)``. All-or-nothing."""
        if data is None:
            data = {"partition": [partition] * len(uids or []), "uid": list(uids or []),
                    "global_steps": [global_steps] * len(uids or []),
                    "n": [n] * len(uids or [])}
        with self._cond:
            rows = validate_groups(data, self._lookup)
            events = rows.rename_columns(["partition", "uid", "global_steps", "n"])
            events = events.append_column("event", pa.array(["registered"] * rows.num_rows))
            stamped = self._journal.record("group_events", events.select(
                ["partition", "uid", "event", "global_steps", "n"]))
            self.apply_group_events(stamped)
            self._changed()

    def update_status(self, data: Any = None, *, partition: str | None = None,
                      uids: list[str] | None = None, status: str | None = None) -> None:
        """Move groups forward (pending -> running -> finished | failure). All-or-nothing."""
        if data is None:
            data = {"partition": [partition] * len(uids or []), "uid": list(uids or []),
                    "status": [status] * len(uids or [])}
        with self._cond:
            rows = validate_status(data, self._lookup)
            gs = [self._parts[p].groups[u].gs for p, u in
                  zip(rows.column("partition").to_pylist(), rows.column("uid").to_pylist())]
            events = pa.table({"partition": rows.column("partition"), "uid": rows.column("uid"),
                               "event": rows.column("status"),
                               "global_steps": pa.array(gs, pa.int64()),
                               "n": pa.nulls(rows.num_rows, pa.int32())})
            self.apply_group_events(self._journal.record("group_events", events))
            self._changed()

    def put(self, trajectories: Any) -> int:
        """Accept trajectories for in-flight groups; returns how many. All-or-nothing."""
        with self._cond:
            rows = validate_trajectories(trajectories, self._lookup,
                                         self.config.zero_variance.metric)
            stamped = self._journal.record("trajectories", rows)
            self.apply_trajectories(stamped)
            self._changed()
            return stamped.num_rows

    def reissue(self, global_steps: int, partition_id: str | None = None) -> dict[str, list[str]]:
        """After a restart: every pending/running group goes back to `pending` at the resume step
        and loses its partial trajectories; returns {partition: uids} for the caller to
        re-dispatch (their rollout workers died with the old process)."""
        if not isinstance(global_steps, int) or global_steps < 0:
            raise IngestError("reissue", [f"global_steps={global_steps!r} must be an int >= 0"])
        out: dict[str, list[str]] = {}
        with self._cond:
            for pid, part in sorted(self._parts.items()):
                if partition_id is not None and pid != partition_id:
                    continue
                uids = sorted(part.inflight)
                if not uids:
                    continue
                stamped = self._journal.record_rows("group_events", [
                    {"partition": pid, "uid": u, "event": "reissued", "global_steps": global_steps}
                    for u in uids])
                self.apply_group_events(stamped)
                out[pid] = uids
            self._changed()
        return out

    # --- apply (shared by live calls and restore) ----------------------------------------------
    def apply_group_events(self, rows: pa.Table) -> None:
        cols = [rows.column(c).to_pylist() for c in
                ("partition", "uid", "event", "global_steps", "n", "seq")]
        for p, u, ev, gs, n, seq in zip(*cols):
            part = self._part(p)
            if ev == "registered":
                part.apply_registered(u, gs, n)
            elif ev == "reissued":
                part.apply_reissued(u, gs)
            else:
                part.apply_status(u, ev, seq)

    def apply_trajectories(self, rows: pa.Table) -> None:
        parts = rows.column("partition").unique().to_pylist()
        for p in parts:
            sub = rows if len(parts) == 1 else rows.filter(pc.equal(rows["partition"], p))
            self._part(p).apply_trajectories(sub)

    # --- the consumer --------------------------------------------------------------------------
    def sample(self, global_steps: int, partition_id: str, batch_size: int,
               timeout: float | None = None) -> Batch:
        """Whole groups, oldest dispatch first, after the configured evictions (SPEC §3-§5)."""
        from pipeline.sampling import run_call
        return run_call(self, global_steps, partition_id, batch_size, consume=True,
                        timeout=timeout)

    def wait_for_sampleable(self, global_steps: int, partition_id: str, target_count: int,
                            timeout: float | None = None) -> tuple[list[str], dict[str, float]]:
        """Evict and refill as `sample` would until `target_count` groups are sampleable and the
        gate is open; consumes nothing (a following `sample` gets these groups). Returns the
        `target_count` oldest uids and the call's eviction metrics, whose ``reward_counts``
        attribute is the `{value: count}` of the zero-variance groups it evicted."""
        from pipeline.sampling import run_call
        return run_call(self, global_steps, partition_id, target_count, consume=False,
                        timeout=timeout)

    def get_sampleable_count(self, global_steps: int, partition_id: str) -> int:
        """How many groups `sample` could hand out now; evicts, refills and removes nothing."""
        check_partition(partition_id)
        ctx = PollContext(int(global_steps), partition_id, 1)
        with self._cond:
            part = self._parts.get(partition_id)
            if part is None:
                return 0
            return part.candidates.alive_count - decide.evaluate(part, self.config, ctx).count

    def lookup(self, partition_id: str, uid: str) -> Any:
        """The live group (uid, gs, n, status, rows, keys ...), a retired marker (removed, never
        accepted again), or None when the buffer has never seen it. For adapters and tests."""
        with self._cond:
            return self._lookup(partition_id, uid)

    def held_batches(self, partition_id: str) -> dict[int, list[tuple[str, int, int]]]:
        """Selected, unreleased batches: batch id -> its (uid, session_id, index) keys."""
        with self._cond:
            part = self._parts.get(partition_id)
            if part is None:
                return {}
            return {b: [(u, s, x) for u in uids for s, x in sorted(part.groups[u].keys)]
                    for b, uids in part.batches.items()}

    def sampleable_uids(self, partition_id: str) -> list[str]:
        """Every group the last poll left sampleable, oldest first (evicts nothing)."""
        with self._cond:
            part = self._parts.get(partition_id)
            return decide.oldest(part, None) if part is not None else []

    def release(self, batch: Batch | int) -> None:
        """The trainer is done with the batch: its trajectories leave memory (not the lake)."""
        batch_id = batch.batch_id if isinstance(batch, Batch) else int(batch)
        with self._cond:
            for pid, part in self._parts.items():
                if batch_id in part.batches:
                    self._journal.record_rows("decisions", [
                        {"partition": pid, "step": part.batch_step[batch_id], "call_id": -1,
                         "poll": 0,
                         "kind": "release", "uid": u, "batch_id": batch_id, "count": 1}
                        for u in part.batches[batch_id]])
                    uids = list(part.batches[batch_id])
                    part.apply_released(batch_id)
                    self._emit("release", pid, uids, batch_id)
                    return
        raise UnknownBatchError(f"batch {batch_id} is not held by this buffer (never sampled, or already "
                       "released)")

    def counts(self, partition_id: str) -> dict[str, int]:
        """Live groups of a partition per status (selected, unreleased groups: `sampled`)."""
        with self._cond:
            part = self._parts.get(partition_id)
            return part.counts() if part else {s: 0 for s in
                                               ("pending", "running", "finished", "failure",
                                                "sampled")}

    def partitions(self) -> list[str]:
        with self._cond:
            return sorted(self._parts)

    def close(self) -> None:
        if self._journal.lake is not None:
            self._journal.lake.close()

    def __enter__(self) -> ReplayBuffer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
