"""Gathering stored payload rows for a batch: the right rows, in order, in memory of their own."""
from __future__ import annotations

import numpy as np
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


def _long_rows(n: int, tokens: int) -> pa.Table:
    """``n`` rows of ``tokens`` token ids each, as one stored chunk (a put of long answers)."""
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * tokens)
    ids = pa.ListArray.from_arrays(offsets, pa.array(np.arange(n * tokens, dtype=np.int32)))
    return pa.table({"seq": pa.array(np.arange(n)), "response_ids": ids})


# a pool of the gather's own, to read its high-water mark; it lives as long as the module, as
# the buffers allocated from it must not outlive it
_POOL = pa.proxy_memory_pool(pa.default_memory_pool())


def _gathered(store: TrajectoryRows, ids: np.ndarray) -> tuple[pa.Table, int]:
    """``store.take(ids)`` and the most bytes Arrow held for it at once (once per process)."""
    before = pa.default_memory_pool()
    assert _POOL.max_memory() == 0
    pa.set_memory_pool(_POOL)
    try:
        got = store.take(ids)
    finally:
        pa.set_memory_pool(before)
    return got, _POOL.max_memory()


def test_a_large_batch_in_many_runs_is_gathered_in_one_copy():
    """A chunk of 4,096 long rows (32 MB of ids) asked in 128 runs: the runs are sliced and copied
    once, without the index of every value Arrow's `take` builds for a list column first (which
    held about three times the batch while it was gathered)."""
    store = TrajectoryRows()
    chunk = _long_rows(4096, 2000)
    first = store.append(chunk).start
    runs = np.concatenate([np.arange(k, k + 16) for k in range(0, 4096, 32)])
    got, peak = _gathered(store, first + runs)
    assert got.equals(chunk.take(pa.array(runs)))
    assert not _addresses(got) & _addresses(chunk)
    assert got.nbytes <= peak <= 1.2 * got.nbytes, (peak, got.nbytes)


def test_few_small_scattered_rows_are_taken():
    """Rows scattered over a chunk holding little are taken (one `take`): the same rows, copied."""
    store = TrajectoryRows()
    chunk = _long_rows(256, 4)
    first = store.append(chunk).start
    scattered = np.arange(0, 256, 2)                       # 128 runs of one row
    got = store.take(first + scattered)
    assert got.equals(chunk.take(pa.array(scattered)))
    assert not _addresses(got) & _addresses(chunk)


def test_rows_are_found_after_many_puts_and_releases():
    """A chunk is kept per put for the life of the partition; locating rows must stay right as
    their number passes the growth of the starts' array (every 64, 128, ... puts)."""
    store = TrajectoryRows()
    chunks, ids = [], []
    for k in range(300):
        chunks.append(_chunk(f"g{k}", 1 + k % 3))
        ids.append(store.append(chunks[-1]))
    for k in range(0, 250):                       # most of the early puts released
        store.drop(ids[k])
    for k in (250, 255, 256, 299):
        got = store.take(list(ids[k]))
        assert got.equals(chunks[k])
    got = store.take([ids[299][0], ids[251][0], ids[280][-1]])
    assert got.equals(pa.concat_tables([chunks[251].slice(0, 1), chunks[280].slice(
        len(ids[280]) - 1, 1), chunks[299].slice(0, 1)]))


def test_a_gather_does_not_convert_every_put_ever_made(monkeypatch):
    """A chunk's start is kept for each put of the partition's life. A gather used to convert
    that whole list to an array (after 100,000 puts a 256-row gather took 3.1 ms): no array it
    builds may grow with the number of puts."""
    import pipeline.state.payload as payload
    store = TrajectoryRows()
    chunk = _chunk("a", 2)
    ids = [store.append(chunk) for _ in range(5000)]
    sizes: list[int] = []
    real = np.asarray

    def asarray(a, *args, **kw):
        sizes.append(len(a))
        return real(a, *args, **kw)

    monkeypatch.setattr(payload.np, "asarray", asarray)
    got = store.take([*ids[4999], *ids[17]])
    monkeypatch.undo()
    assert got.num_rows == 4
    assert max(sizes) < 100, sizes
