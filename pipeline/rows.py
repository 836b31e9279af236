"""Live trajectory payload of one partition: appended Arrow chunks, addressed by global row id."""
from __future__ import annotations

import bisect

import numpy as np
import polars as pl
import pyarrow as pa

from pipeline.errors import InvariantError
from schemas import TRAJECTORIES


class TrajectoryRows:
    """Append-only chunks of trajectory rows; a chunk is freed once none of its rows is live.

    Appending keeps the producer's record batch as it is (no copy). Rows are addressed by a global
    row id (arrival order within the partition), so a group only keeps a list of ints. Beside each
    chunk lies its small `meta` frame (schemas.GROUP_TRAJECTORIES: what the group aggregates
    read), so classifying a group never touches the token payload.
    """

    def __init__(self) -> None:
        self._chunks: list[pa.Table | None] = []
        self._meta: list[pl.DataFrame | None] = []
        self._starts: list[int] = []
        self._live: list[int] = []
        self.size = 0
        self.live_bytes = 0       # Arrow bytes of the chunks still held (a chunk is freed whole)

    def append(self, rows: pa.Table, meta: pl.DataFrame) -> range:
        """Store ``rows`` (and their ``meta`` rows) and return their global row ids."""
        first = self.size
        self._chunks.append(rows)
        self._meta.append(meta)
        self._starts.append(first)
        self._live.append(rows.num_rows)
        self.size += rows.num_rows
        self.live_bytes += rows.nbytes
        return range(first, self.size)

    def _locate(self, row_ids: list[int] | np.ndarray):
        """(chunk index, local row ids) per chunk holding some of ``row_ids``, ascending."""
        ids = np.sort(np.asarray(row_ids, dtype=np.int64))
        which = np.searchsorted(np.asarray(self._starts), ids, side="right") - 1
        for c in np.unique(which):
            if self._chunks[c] is None:
                raise InvariantError("row ids of a released chunk were asked for")
            yield int(c), ids[which == c] - self._starts[c]

    def take(self, row_ids: list[int] | np.ndarray) -> pa.Table:
        """The rows with these ids, in ascending id (= arrival) order."""
        parts = [self._chunks[c].take(pa.array(local)) for c, local in self._locate(row_ids)]
        if not parts:
            return TRAJECTORIES.empty_table()
        return pa.concat_tables(parts) if len(parts) > 1 else parts[0]

    def take_meta(self, row_ids: list[int] | np.ndarray) -> pl.DataFrame | None:
        """The meta rows of these ids (None when there are none)."""
        parts = [self._meta[c][local] for c, local in self._locate(row_ids)]
        if not parts:
            return None
        return pl.concat(parts) if len(parts) > 1 else parts[0]

    def drop(self, row_ids: list[int]) -> None:
        """Forget rows (released or evicted); frees whole chunks once they hold no live row."""
        for r in row_ids:
            c = bisect.bisect_right(self._starts, r) - 1
            self._live[c] -= 1
            if self._live[c] == 0:
                self.live_bytes -= self._chunks[c].nbytes
                self._chunks[c] = None
                self._meta[c] = None
