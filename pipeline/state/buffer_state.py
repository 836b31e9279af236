"""The buffer's state, in one home: lock, version, partitions, journal, id counters, listeners.

Every change goes through `commit(table, rows)`: stamp the rows with seq numbers, write them to the
lake (when there is one), then `apply` them. Restore replays the lake through the very same
`apply`, decisions included, so a restarted buffer is the buffer that was acknowledged before the
crash. Nothing outside this module touches the lock, the counters or the journal.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from itertools import groupby
from operator import itemgetter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline import interrupts
from pipeline.errors import InvariantError
from pipeline.state.journal import Journal
from pipeline.state.partition import PartitionState

_DECISION_RUN = itemgetter(0, 1, 3, 4)   # rows of one effect: partition, kind, batch_id, step

Listener = Callable[[str, str, list[str], "int | None"], None]


def _pylist(col: pa.ChunkedArray) -> list:
    """A column's values (an all-null one, e.g. `n` of the shorthand, without converting)."""
    return [None] * len(col) if col.null_count == len(col) else col.to_pylist()


class BufferState:
    """Lock, partitions and journal of one buffer (see the module docstring)."""

    def __init__(self, journal: Journal, filter_metric: str | None):
        self.cond = threading.Condition(threading.RLock())
        self.journal = journal
        self.filter_metric = filter_metric
        self.parts: dict[str, PartitionState] = {}
        self.version = 0          # bumps on every change: a waiting sample re-polls
        self.next_batch = 0
        self.next_call = 0
        self.listeners: list[Listener] = []
        self.broken: str | None = None   # why memory may differ from the lake (see `commit`)

    # --- partitions and groups ---------------------------------------------------------------
    def part(self, partition: str) -> PartitionState:
        p = self.parts.get(partition)
        if p is None:
            p = self.parts[partition] = PartitionState(partition, self.filter_metric)
        return p

    def lookup(self, partition: str, uid: str) -> Any:
        p = self.parts.get(partition)
        if p is None:
            return None
        g = p.groups.get(uid)       # a live group: `PartitionState.lookup` without its call
        return g if g is not None else p.lookup(uid)

    def new_call(self) -> int:
        with self.cond:
            call_id = self.next_call
            self.next_call += 1
            return call_id

    # --- the one write path --------------------------------------------------------------------
    def commit(self, table: str, rows: pa.Table | list[dict]) -> pa.Table | None:
        """Stamp, write durably, apply, wake waiters. Call with the lock held.

        Whole or not at all, in memory and on disk alike: an interrupt meanwhile is held to the
        end (`pipeline.interrupts`), a failed write is taken back before it raises (nothing
        applied), and a write that is on disk is always applied. Should applying it fail (a bug),
        memory no longer matches the lake: the state then refuses every later change, and
        reopening the lake restores what is on disk."""
        if self.broken is not None:
            raise InvariantError(self.broken)
        with interrupts.held():
            stamped = self.journal.record(table, rows) if isinstance(rows, pa.Table) else \
                self.journal.record_rows(table, rows)
            effects: list[tuple[str, str, list[str], int | None]] = []
            if stamped is not None:
                try:
                    self.apply(table, stamped, effects)
                except BaseException as exc:
                    again = ("close it and open the lake again (a restart restores exactly what "
                             "is on disk)") if self.journal.lake is not None else "make a new one"
                    self.broken = (f"applying {stamped.num_rows} acknowledged row(s) of table "
                                   f"{table!r} to memory failed ({exc!r}): this buffer no longer "
                                   f"matches what it acknowledged and takes no more changes; "
                                   f"{again}")
                    raise InvariantError(self.broken) from exc
            self.version += 1
            self.cond.notify_all()
            # listeners last: one that raises (an adapter's data plane) leaves the state whole
            for effect in effects:
                for fn in self.listeners:
                    fn(*effect)
        return stamped

    def apply(self, table: str, rows: pa.Table,
              effects: list[tuple[str, str, list[str], int | None]] | None = None) -> None:
        """Apply stamped rows of one lake table (live calls and restore alike); ``effects`` gets
        what the listeners are to be told of, (kind, partition, uids, batch_id) each."""
        if table == "group_events":
            self._apply_group_events(rows)
        elif table == "trajectories":
            self._apply_trajectories(rows)
        elif table == "decisions":
            self._apply_decisions(rows, effects)
        # metric rows are history only

    def _apply_group_events(self, rows: pa.Table) -> None:
        """Row by row in order, handed to the partition a run of one partition and event at a
        time (a poll registers, then finishes, ~64 groups: one call each, not 64)."""
        uid, steps, ns, seqs, prompt_ids = (_pylist(rows.column(c)) for c in
                                            ("uid", "global_steps", "n", "seq", "prompt_id"))
        at = 0
        for (p, ev), run in groupby(zip(rows.column("partition").to_pylist(),
                                        rows.column("event").to_pylist())):
            end = at + len(list(run))
            part = self.part(p)
            if ev == "registered":
                part.apply_registered_many(uid[at:end], steps[at:end], ns[at:end],
                                           prompt_ids[at:end])
            elif ev == "reissued":
                for u, gs in zip(uid[at:end], steps[at:end]):
                    part.apply_reissued(u, gs)
            else:
                part.apply_status_many(uid[at:end], ev, seqs[at:end])
            at = end

    def _apply_trajectories(self, rows: pa.Table) -> None:
        parts = rows.column("partition").unique().to_pylist()
        for p in parts:
            sub = rows if len(parts) == 1 else rows.filter(pc.equal(rows["partition"], p))
            self.part(p).apply_trajectories(sub)

    def _apply_decisions(self, rows: pa.Table,
                         effects: list[tuple[str, str, list[str], int | None]] | None) -> None:
        cols = [rows.column(c).to_pylist() for c in
                ("partition", "kind", "uid", "batch_id", "step", "call_id")]
        calls = [c for c in cols[5] if c is not None and c >= 0]
        if calls:
            self.next_call = max(self.next_call, max(calls) + 1)
        for (p, kind, batch_id, step), grp in groupby(zip(*cols), key=_DECISION_RUN):
            part = self.part(p)
            uids = list(dict.fromkeys(r[2] for r in grp))   # 2 reasons -> 2 rows, 1 removal
            if batch_id is not None:
                self.next_batch = max(self.next_batch, batch_id + 1)
            if kind == "evict":
                part.apply_removed(uids, "evicted")
            elif kind == "discard":
                part.apply_removed(uids, "discarded")
            elif kind == "select":
                part.apply_removed(uids, "selected", batch_id, step)
            elif kind == "release":
                uids = part.apply_released(batch_id)
            else:
                continue   # refill rows change nothing in memory
            if effects is not None:
                effects.append((kind, p, uids, batch_id))
