"""The compact per-group table every poll decides over: terminal groups not yet removed.

One row per terminal group, in numpy columns grown by doubling. A group is classified once, when it
turns terminal (finished groups are immutable), so a poll never rescans trajectories. Dead rows
(selected, evicted, discarded) are flagged and compacted away once they outnumber the live ones.
"""
from __future__ import annotations

import numpy as np
import polars as pl

FINISHED, FAILURE = 1, 2
ZV_NO, ZV_YES, ZV_MISSING = 0, 1, 2

_COLUMNS = {
    "gs": np.int64,        # dispatch global_steps
    "term_seq": np.int64,  # arrival seq of the terminal status (tie-break, unique)
    "status": np.int8,     # FINISHED | FAILURE (a finished group with no trajectory is FAILURE)
    "n_traj": np.int32,
    "zv": np.int8,         # ZV_NO | ZV_YES | ZV_MISSING (finished groups with >1 trajectory)
    "value": np.float64,   # the single metric value of a zero-variance group
    "alive": np.bool_,
}


class CandidateTable:
    """Terminal, not yet removed groups of one partition, as numpy columns plus a uid list."""

    def __init__(self, capacity: int = 1024) -> None:
        self._cols = {k: np.zeros(capacity, dtype=t) for k, t in _COLUMNS.items()}
        self.uids: list[str] = []
        self.row_of: dict[str, int] = {}
        self.n = 0
        self.alive_count = 0

    def add(self, uid: str, gs: int, term_seq: int, status: int, n_traj: int,
            zv: int, value: float) -> None:
        if self.n == len(self._cols["gs"]):
            for k, a in self._cols.items():
                self._cols[k] = np.concatenate([a, np.zeros_like(a)])
        i = self.n
        for k, v in (("gs", gs), ("term_seq", term_seq), ("status", status),
                     ("n_traj", n_traj), ("zv", zv), ("value", value), ("alive", True)):
            self._cols[k][i] = v
        self.uids.append(uid)
        self.row_of[uid] = i
        self.n += 1
        self.alive_count += 1

    def remove(self, uids: list[str]) -> None:
        for uid in uids:
            i = self.row_of.pop(uid)
            self._cols["alive"][i] = False
            self.alive_count -= 1
        if self.n > 1024 and self.alive_count * 2 < self.n:
            self._compact()

    def _compact(self) -> None:
        keep = np.flatnonzero(self._cols["alive"][: self.n])
        cap = max(1024, 2 * len(keep))
        for k, a in self._cols.items():
            fresh = np.zeros(cap, dtype=a.dtype)
            fresh[: len(keep)] = a[keep]
            self._cols[k] = fresh
        self.uids = [self.uids[i] for i in keep]
        self.row_of = {u: i for i, u in enumerate(self.uids)}
        self.n = len(keep)

    def frame(self) -> pl.DataFrame:
        """The live rows as a polars frame (numeric columns are views, not copies)."""
        n = self.n
        cols = {k: a[:n] for k, a in self._cols.items()}
        df = pl.DataFrame(cols).with_row_index("row")
        return df

    def get(self, uid: str) -> dict:
        i = self.row_of[uid]
        return {k: a[i].item() for k, a in self._cols.items()}
