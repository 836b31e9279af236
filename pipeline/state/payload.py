"""Live trajectory payload of one partition: appended Arrow chunks, addressed by global row id."""
from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.errors import InvariantError
from schemas import TRAJECTORIES

# `take` gathers rows scattered over a chunk run by run when they hold more than this
_TAKE_BYTES = 8 * 2**20


def _slices(chunk: pa.Table, at: int, n: int) -> list[pa.RecordBatch]:
    """Rows ``at`` to ``at + n`` of a stored chunk as record batches, not copied. A put's rows
    are one record batch, and slicing it is cheaper than slicing the table."""
    whole = chunk.to_batches()
    return [whole[0].slice(at, n)] if len(whole) == 1 else chunk.slice(at, n).to_batches()


class Gather:
    """Rows of a partition's stored chunks, to be copied out by `table`: per chunk either a run
    ``(first, count)``, sliced, or scattered local row ids, taken."""

    __slots__ = ("steps", "num_rows")

    def __init__(self, steps: list[tuple[pa.Table, Any]], num_rows: int):
        self.steps, self.num_rows = steps, num_rows

    def table(self) -> pa.Table:
        """The rows, in memory of their own (nothing of a stored chunk is kept)."""
        steps = self.steps
        if len(steps) == 1 and type(steps[0][1]) is not tuple:
            chunk, local = steps[0]
            return chunk.take(pa.array(local))        # the whole batch, a copy already
        pieces: list[pa.RecordBatch] = []
        for chunk, how in steps:
            if type(how) is tuple:
                pieces.extend(_slices(chunk, *how))
            else:
                pieces.extend(chunk.take(pa.array(how)).to_batches())
        if not pieces:
            return TRAJECTORIES.empty_table()
        # concatenating copies, a single piece too
        return pa.Table.from_batches([pa.concat_batches(pieces)])


class TrajectoryRows:
    """Append-only chunks of trajectory rows; a chunk is freed once none of its rows is live.

    Appending keeps the producer's record batch as it is (no copy, no derived frame): a put only
    stores a reference, which is what keeps small puts cheap and memory near the payload. Rows
    are addressed by a global row id (arrival order within the partition), so a group only keeps
    a list of ints. What the group aggregates read is gathered from the chunks' small columns
    when a group turns terminal (`chunks`), never from the token payload.
    """

    def __init__(self) -> None:
        self._chunks: list[pa.Table | None] = []
        self._starts: list[int] = []
        # the same starts as an int64 array for `_locate`'s vectorised search, grown by doubling
        # (a chunk is appended per put and its entry stays: converting the list at every take
        # cost a long run time in the number of puts it ever made)
        self._starts_np = np.zeros(64, dtype=np.int64)
        self._live: list[int] = []
        self._nbytes: list[int | None] = []   # a chunk's Arrow bytes, measured when first asked
        self._unsized: list[int] = []         # chunks appended since `held_bytes` was last read
        self._sized_bytes = 0
        self._per_row: dict[int, float] = {}  # a chunk's Arrow bytes per row, for `take`
        self.size = 0

    def append(self, rows: pa.Table) -> range:
        """Store ``rows`` and return their global row ids."""
        first = self.size
        self._unsized.append(len(self._chunks))
        self._chunks.append(rows)
        self._nbytes.append(None)
        self._starts.append(first)
        n = len(self._starts)
        if n > len(self._starts_np):
            self._starts_np = np.concatenate([self._starts_np, np.zeros_like(self._starts_np)])
        self._starts_np[n - 1] = first
        self._live.append(rows.num_rows)
        self.size += rows.num_rows
        return range(first, self.size)

    @property
    def held_bytes(self) -> int:
        """Arrow bytes of the chunks still held (a chunk is freed whole).

        Measured lazily: `Table.nbytes` walks every buffer range (tens of µs for a small put),
        and only a buffer with a byte budget ever asks."""
        for c in self._unsized:
            chunk = self._chunks[c]
            if chunk is not None:
                self._nbytes[c] = chunk.nbytes
                self._sized_bytes += self._nbytes[c]
        self._unsized.clear()
        return self._sized_bytes

    def _locate(self, row_ids: list[int] | np.ndarray):
        """(chunk index, local row ids) per chunk holding some of ``row_ids``, ascending: one
        sort and one search, then a slice of the sorted ids per chunk (a batch of single-group
        puts spans as many chunks as groups)."""
        ids = np.sort(np.asarray(row_ids, dtype=np.int64))
        if not len(ids):
            return
        which = np.searchsorted(self._starts_np[:len(self._starts)], ids, side="right") - 1
        cuts = (np.flatnonzero(which[1:] != which[:-1]) + 1).tolist()
        for a, b in zip([0, *cuts], [*cuts, len(ids)]):
            c = int(which[a])
            if self._chunks[c] is None:
                raise InvariantError("row ids of a released chunk were asked for")
            yield c, ids[a:b] - self._starts[c]

    def take(self, row_ids: list[int] | np.ndarray) -> pa.Table:
        """The rows with these ids, in ascending id (= arrival) order, in memory of their own (a
        batch never keeps a stored chunk alive after its rows are released): `plan` made now."""
        return self.plan(row_ids).table()

    def plan(self, row_ids: list[int] | np.ndarray) -> Gather:
        """How to gather the rows with these ids (`Gather.table` copies them out). It holds the
        chunks it reads, so it stays valid after those rows are dropped: Arrow chunks are never
        changed, only let go.

        A group's rows usually arrive together, so the ids asked of a chunk are mostly one run:
        that is sliced (no copy) and everything is copied once at the end, by concatenating the
        pieces' record batches into one (no table of pieces to build and combine: a batch of
        single-group puts has a piece per group). Rows scattered over a chunk are taken with
        Arrow's `take` (its cost is per column and chunk, however few rows it takes), unless they
        hold more than `_TAKE_BYTES`: for a list column `take` first builds an index of every
        value it copies (a batch of 4,096 answers of 12,000 tokens, 188 MB of token ids, held
        about 600 MB while gathered), so large rows are sliced run by run instead and copied
        once."""
        steps: list[tuple[pa.Table, Any]] = []
        n_rows = 0
        for c, local in self._locate(row_ids):
            chunk = self._chunks[c]
            first, n = int(local[0]), len(local)
            n_rows += n
            if int(local[-1]) - first + 1 == n:                  # sorted and unique: one run
                steps.append((chunk, (first, n)))
            elif n * self._row_bytes(c) > _TAKE_BYTES:
                starts = (np.flatnonzero(np.diff(local) != 1) + 1).tolist()   # where runs begin
                bounds = [0, *starts, n]
                steps.extend((chunk, (int(local[a]), b - a)) for a, b in zip(bounds, bounds[1:]))
            else:
                steps.append((chunk, local))
        return Gather(steps, n_rows)

    def _row_bytes(self, c: int) -> float:
        """Arrow bytes per row of chunk ``c`` (measured once per chunk)."""
        got = self._per_row.get(c)
        if got is None:
            chunk = self._chunks[c]
            got = self._per_row[c] = chunk.nbytes / max(chunk.num_rows, 1)
        return got

    def chunks(self, row_ids: list[int] | np.ndarray) -> Iterator[tuple[pa.Table, np.ndarray]]:
        """(chunk, local row ids) holding ``row_ids``, in ascending id order (reads that need only
        a few small columns of the rows take them per chunk, without gathering whole rows)."""
        for c, local in self._locate(row_ids):
            yield self._chunks[c], local

    def drop(self, row_ids: range | list[int]) -> None:
        """Forget rows (released or evicted); frees whole chunks once they hold no live row.

        A group's row ids are usually a `range` (its rows arrived in one put): that is taken a
        chunk's run at a time (one bisect per chunk touched, not one per row: a release of many
        groups bisecting row by row was a visible part of it)."""
        if type(row_ids) is range and row_ids.step == 1:
            self._drop_run(row_ids.start, row_ids.stop)
            return
        for r in row_ids:
            self._take_live(bisect.bisect_right(self._starts, r) - 1, 1)

    def drop_all(self, row_ids: list[range | list[int]]) -> None:
        """`drop` of several groups' rows at once: adjoining ranges (groups that arrived in one
        put) are merged into one run first, so a released batch costs a bisect per chunk."""
        start = stop = 0
        for ids in row_ids:
            if type(ids) is range and ids.step == 1:
                if ids.start == stop:
                    stop = ids.stop
                    continue
                self._drop_run(start, stop)
                start, stop = ids.start, ids.stop
            else:
                self.drop(ids)
        self._drop_run(start, stop)

    def _drop_run(self, r: int, stop: int) -> None:
        starts = self._starts
        while r < stop:
            c = bisect.bisect_right(starts, r) - 1
            k = (min(stop, starts[c + 1]) if c + 1 < len(starts) else stop) - r
            self._take_live(c, k)
            r += k

    def _take_live(self, c: int, k: int) -> None:
        """``k`` rows of chunk ``c`` are no longer live; the chunk is freed when its count
        reaches zero (from above, as ``k`` single drops would)."""
        before = self._live[c]
        self._live[c] = before - k
        if before > 0 >= before - k:
            if self._nbytes[c] is not None:
                self._sized_bytes -= self._nbytes[c]
            self._chunks[c] = None
            self._per_row.pop(c, None)
