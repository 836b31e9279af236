"""Gathering stored payload rows for a batch: the right rows, in order, in memory of their own."""
from __future__ import annotations

import pyarrow as pa

from pipeline.state.payload import TrajectoryRows
from tests.support.lake import traj


def _chunk(uid: str, n: int, first_index: int = 0) -> pa.Table:
    return pa.Table.from_pylist([traj(uid, first_index + i) for i in range(n)])


def _addresses(table: pa.Table) -> set[int]:
    return {b.address for col in table.columns for chunk in col.chunks
            for b in chunk.buffers() if b is not None and b.size}


def test_rows_from_several_chunks_come_back_in_order_as_one_copy():
    store = TrajectoryRows()
    chunks = [_chunk("a", 4), _chunk("b", 4), _chunk("c", 4)]
    ids = [store.append(c) for c in chunks]
    wanted = [*ids[0][1:3], *ids[1][0:4:2], *ids[2]]          # a run, a gap, a whole chunk
    got = store.take(list(reversed(wanted)))                    # asked out of order
    expected = pa.concat_tables([chunks[0].slice(1, 2), chunks[1].take([0, 2]), chunks[2]])
    assert got.equals(expected)
    assert got.column(0).num_chunks == 1
    assert not _addresses(got) & set().union(*(_addresses(c) for c in chunks))


def test_rows_of_one_chunk_are_copied_too():
    store = TrajectoryRows()
    chunk = _chunk("a", 4)
    ids = store.append(chunk)
    got = store.take(list(ids[1:3]))
    assert got.equals(chunk.slice(1, 2))
    assert not _addresses(got) & _addresses(chunk)
