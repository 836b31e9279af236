"""The per-partition index of terminal groups not yet removed: what every poll decides over.

Incremental by design (SPEC §9: verl re-lists and re-sorts every group on every call):
- each group is classified once, when it turns terminal (finished groups are immutable);
- groups that turned terminal since the last committed poll are `fresh`: rules that depend only on
  a group's own data (zero variance, failure) need to look at fresh groups only;
- a rule that fires as time passes (staleness) declares a horizon: only groups dispatched before it
  can newly match, and those are found by walking the front of a heap ordered by
  (global_steps, terminal seq) without touching the rest;
- the k oldest groups come off the same heap in O(k log k).
So a poll costs O(fresh + newly matching + k log n), not O(buffer size).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

FINISHED, FAILURE = 1, 2
ZV_NO, ZV_YES, ZV_MISSING = 0, 1, 2


@dataclass(frozen=True, slots=True)
class Candidate:
    """One terminal group as the rules see it (immutable once terminal)."""

    uid: str
    gs: int          # dispatch global_steps
    term_seq: int    # arrival seq of the terminal status: unique, the tie-break after gs
    status: int      # FINISHED | FAILURE (a finished group without trajectories is FAILURE)
    n_traj: int
    zv: int          # ZV_NO | ZV_YES | ZV_MISSING (finished, > 1 trajectory, filter on)
    value: float     # the single metric value of a zero-variance group


class Columns:
    """Rows to examine as numpy columns: the shape every policy mask is written against."""

    def __init__(self, rows: list[Candidate]):
        self.rows = rows
        self.gs = np.fromiter((r.gs for r in rows), np.int64, len(rows))
        self.term_seq = np.fromiter((r.term_seq for r in rows), np.int64, len(rows))
        self.status = np.fromiter((r.status for r in rows), np.int8, len(rows))
        self.n_traj = np.fromiter((r.n_traj for r in rows), np.int32, len(rows))
        self.zv = np.fromiter((r.zv for r in rows), np.int8, len(rows))
        self.value = np.fromiter((r.value for r in rows), np.float64, len(rows))

    def __len__(self) -> int:
        return len(self.rows)


class CandidateIndex:
    """Alive terminal groups of one partition: a dict, a lazily-cleaned heap and the fresh list."""

    def __init__(self) -> None:
        self.alive: dict[str, Candidate] = {}
        self.fresh: list[str] = []
        self._heap: list[tuple[int, int, str]] = []

    @property
    def alive_count(self) -> int:
        return len(self.alive)

    def add(self, c: Candidate) -> None:
        self.alive[c.uid] = c
        self.fresh.append(c.uid)
        heapq.heappush(self._heap, (c.gs, c.term_seq, c.uid))

    def remove(self, uids: list[str]) -> None:
        for u in uids:
            del self.alive[u]
        h = self._heap
        while h and not self._live(h[0]):   # selected/stale groups sit at the front: drop them now
            heapq.heappop(h)
        if len(h) > 64 and len(h) > 2 * len(self.alive):
            self._heap = [e for e in self._heap if self._live(e)]
            heapq.heapify(self._heap)

    def settle(self) -> None:
        """A committed poll examined every fresh group: from now on only horizons revisit them."""
        self.fresh = []

    def _live(self, e: tuple[int, int, str]) -> bool:
        c = self.alive.get(e[2])
        return c is not None and c.term_seq == e[1]

    def before(self, horizon: int) -> list[Candidate]:
        """Alive groups with gs < horizon, by walking only the heap's front (no pops)."""
        out, h, stack = [], self._heap, [0] if self._heap else []
        while stack:
            i = stack.pop()
            if i < len(h) and h[i][0] < horizon:
                if self._live(h[i]):
                    out.append(self.alive[h[i][2]])
                stack.extend((2 * i + 1, 2 * i + 2))
        return out

    def to_examine(self, horizon: int | None) -> list[Candidate]:
        """Fresh groups plus those a time-dependent rule may newly match, each once."""
        rows = {u: self.alive[u] for u in self.fresh if u in self.alive}
        if horizon is not None:
            for c in self.before(horizon):
                rows.setdefault(c.uid, c)
        return list(rows.values())

    def oldest(self, k: int | None) -> list[str]:
        """The k oldest alive groups by (gs, term_seq), oldest first; all of them if k is None."""
        if k is None:
            return [c.uid for c in sorted(self.alive.values(), key=lambda c: (c.gs, c.term_seq))]
        out: list[str] = []
        h = self._heap
        front = [(h[0], 0)] if h else []
        while front and len(out) < k:
            entry, i = heapq.heappop(front)
            if self._live(entry):
                out.append(entry[2])
            for j in (2 * i + 1, 2 * i + 2):
                if j < len(h):
                    heapq.heappush(front, (h[j], j))
        return out

    def missing_metric(self) -> list[str]:
        """Fresh finished groups lacking the filter metric (sorted uids)."""
        return sorted(u for u in self.fresh if u in self.alive and self.alive[u].zv == ZV_MISSING)
