"""Live state of one partition: groups and their lifecycle, in-flight set, candidates, payload.

Every mutation is an `apply_*` method taking rows already validated and already written to the
lake. The restore path replays the lake through the very same methods, which is why restarting
on a lake gives back the same buffer.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from pipeline.candidates import (
    FAILURE,
    FINISHED,
    ZV_MISSING,
    ZV_NO,
    ZV_YES,
    Candidate,
    CandidateIndex,
)
from pipeline.ingest import metric_values
from pipeline.rows import TrajectoryRows


class Group:
    """One prompt group's lifecycle and the running aggregates its classification needs."""

    __slots__ = ("uid", "gs", "n", "status", "term_seq", "rows", "keys", "sessions",
                 "mmin", "mmax", "missing", "removed", "batch_id")

    def __init__(self, uid: str, gs: int, n: int | None):
        self.uid, self.gs, self.n = uid, gs, n
        self.status = "pending"
        self.term_seq: int | None = None
        self.rows: list[int] = []
        self.keys: set[tuple[int, int]] = set()
        self.sessions: set[int] = set()
        self.mmin = float("inf")
        self.mmax = float("-inf")
        self.missing = 0
        self.removed: str | None = None   # None while live; else selected|evicted|discarded
        self.batch_id: int | None = None

    def classify(self, filter_metric: str | None) -> tuple[int, int, float]:
        """(status code, zero-variance flag, value) when the group turns terminal."""
        if self.status == "failure" or not self.rows:
            return FAILURE, ZV_NO, float("nan")
        if filter_metric is None or len(self.rows) < 2:
            return FINISHED, ZV_NO, float("nan")
        if self.missing:
            return FINISHED, ZV_MISSING, float("nan")
        if self.mmin == self.mmax:  # exact equality of every value (min == max)
            return FINISHED, ZV_YES, self.mmin
        return FINISHED, ZV_NO, float("nan")


class _Retired:
    """Stands for a group that was selected, evicted, discarded or released."""

    removed = "retired"
    status = "removed"
    n = None
    keys: frozenset = frozenset()
    sessions: frozenset = frozenset()


RETIRED = _Retired()


class PartitionState:
    """Groups, in-flight set, candidate table and trajectory payload of one partition."""

    def __init__(self, partition: str, filter_metric: str | None):
        self.partition = partition
        self.filter_metric = filter_metric if partition != "val" else None
        self.groups: dict[str, Group] = {}
        self.inflight: dict[str, int] = {}      # uid -> global_steps of pending/running groups
        self.candidates = CandidateIndex()
        self.rows = TrajectoryRows()
        self.batches: dict[int, list[str]] = {}  # selected, not yet released
        self.batch_step: dict[int, int] = {}     # batch id -> step it was sampled at
        self.retired: set[str] = set()           # removed uids: never accepted again

    # --- producers ---------------------------------------------------------------------------
    def apply_registered(self, uid: str, gs: int, n: int | None) -> None:
        self.groups[uid] = Group(uid, gs, n)
        self.inflight[uid] = gs

    def apply_status(self, uid: str, status: str, seq: int) -> None:
        g = self.groups[uid]
        g.status = status
        if status in ("finished", "failure"):
            self.inflight.pop(uid, None)
            g.term_seq = seq
            code, zv, value = g.classify(self.filter_metric)
            self.candidates.add(Candidate(uid, g.gs, seq, code, len(g.rows), zv, value))

    def apply_reissued(self, uid: str, gs: int) -> None:
        """In-flight group back to pending at the resume step; its partial trajectories dropped."""
        g = self.groups[uid]
        self.rows.drop(g.rows)
        fresh = Group(uid, gs, g.n)
        self.groups[uid] = fresh
        self.inflight[uid] = gs

    def apply_trajectories(self, rows: pa.Table) -> None:
        ids = self.rows.append(rows)
        uids = rows.column("uid").to_pylist()
        sessions = rows.column("session_id").to_pylist()
        indexes = rows.column("index").to_pylist()
        values = metric_values(rows, self.filter_metric)
        vals = values.to_pylist() if values is not None else None
        for j, (u, s, x) in enumerate(zip(uids, sessions, indexes)):
            g = self.groups[u]
            g.rows.append(ids[j])
            g.keys.add((s, x))
            g.sessions.add(s)
            if vals is not None:
                v = vals[j]
                if v is None:
                    g.missing += 1
                else:
                    g.mmin = min(g.mmin, v)
                    g.mmax = max(g.mmax, v)

    # --- the consumer ------------------------------------------------------------------------
    def apply_removed(self, uids: list[str], how: str, batch_id: int | None = None,
                      step: int | None = None) -> None:
        """Selected groups keep their rows until release; evicted/discarded groups leave memory
        now (the lake keeps them). Either way the uid is retired: never accepted again."""
        self.candidates.remove(uids)
        for u in uids:
            self.retired.add(u)
            if how == "selected":
                g = self.groups[u]
                g.removed, g.batch_id = how, batch_id
                self.batches.setdefault(batch_id, []).append(u)
                self.batch_step[batch_id] = step
            else:
                g = self.groups.pop(u)
                self.rows.drop(g.rows)

    def apply_released(self, batch_id: int) -> None:
        self.batch_step.pop(batch_id, None)
        for u in self.batches.pop(batch_id, []):
            g = self.groups.pop(u)
            self.rows.drop(g.rows)

    def lookup(self, uid: str) -> Group | None:
        """The live group, a retired marker for removed uids, or None for unknown ones."""
        g = self.groups.get(uid)
        if g is None and uid in self.retired:
            return RETIRED
        return g

    # --- reads -------------------------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        """Live groups per status (selected-but-unreleased groups count as `sampled`)."""
        out = {"pending": 0, "running": 0, "finished": 0, "failure": 0, "sampled": 0}
        for g in self.groups.values():
            out["sampled" if g.removed == "selected" else g.status] += 1
        return out

    def oldest_inflight(self) -> int | None:
        return min(self.inflight.values()) if self.inflight else None

    def payload(self, uids: list[str]) -> pa.Table:
        rows: list[int] = []
        for u in uids:
            rows.extend(self.groups[u].rows)
        return self.rows.take(np.asarray(rows, dtype=np.int64))
