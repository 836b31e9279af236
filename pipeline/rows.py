"""Live trajectory payload of one partition: appended Arrow chunks, addressed by global row id."""
from __future__ import annotations

import bisect

import numpy as np
import pyarrow as pa

from schemas import TRAJECTORIES


class TrajectoryRows:
    """Append-only chunks of trajectory rows; a chunk is freed once none of its rows is live.

    Appending keeps the producer's record batch as it is (no copy). Rows are addressed by a global
    row id (arrival order within the partition), so a group only keeps a list of ints.
    """

    def __init__(self) -> None:
        self._chunks: list[pa.Table | None] = []
        self._starts: list[int] = []
        self._live: list[int] = []
        self.size = 0

    def append(self, rows: pa.Table) -> range:
        """Store ``rows`` and return their global row ids."""
        first = self.size
        self._chunks.append(rows)
        self._starts.append(first)
        self._live.append(rows.num_rows)
        self.size += rows.num_rows
        return range(first, self.size)

    def take(self, row_ids: list[int] | np.ndarray) -> pa.Table:
        """The rows with these ids, in ascending id (= arrival) order."""
        ids = np.sort(np.asarray(row_ids, dtype=np.int64))
        if ids.size == 0:
            return TRAJECTORIES.empty_table()
        which = np.searchsorted(np.asarray(self._starts), ids, side="right") - 1
        parts = []
        for c in np.unique(which):
            chunk = self._chunks[c]
            if chunk is None:
                raise KeyError("row ids of a released chunk were asked for")
            local = ids[which == c] - self._starts[c]
            parts.append(chunk.take(pa.array(local)))
        return pa.concat_tables(parts) if len(parts) > 1 else parts[0]

    def drop(self, row_ids: list[int]) -> None:
        """Forget rows (released or evicted); frees whole chunks once they hold no live row."""
        for r in row_ids:
            c = bisect.bisect_right(self._starts, r) - 1
            self._live[c] -= 1
            if self._live[c] == 0:
                self._chunks[c] = None
