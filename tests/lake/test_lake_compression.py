"""A writer with ``compression`` writes compressed record batches: every reader reads the same
rows, a scan's scratch copy stays compressed, and compaction turns the segment into Parquet."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pipeline.lake import compact, scan_lake
from pipeline.lake.frames import compressed
from pipeline.lake.read import read_table
from pipeline.lake.writer import LakeWriter, segment_files
from schemas import LAKE_TABLES

TOKENS = 200_000      # zeros: 800 kB of int32 a row in memory, almost nothing compressed


def _rows(first_seq: int, n: int) -> pa.Table:
    schema = LAKE_TABLES["trajectories"]
    offsets = np.arange(0, (n + 1) * TOKENS, TOKENS, dtype=np.int32)
    ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.zeros(n * TOKENS, np.int32)))
    cols = {f.name: pa.nulls(n, f.type) for f in schema}
    cols.update({"partition": pa.array(["train"] * n),
                 "uid": pa.array([f"g{first_seq + i}" for i in range(n)]),
                 "session_id": pa.array([0] * n), "index": pa.array([0] * n),
                 "is_padding": pa.array([False] * n), "versions_inferred": pa.array([False] * n),
                 "ts": pa.array([0] * n, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                 "min_global_steps": pa.array([0] * n),
                 "max_global_steps": pa.array([0] * n), "reward": pa.array([1.0] * n),
                 "prompt_ids": pa.array([[1, 2]] * n, pa.list_(pa.int32())),
                 "response_ids": ids, "n_response_tokens": pa.array([TOKENS] * n),
                 "seq": pa.array(range(first_seq, first_seq + n))})
    return pa.table({f.name: cols[f.name].cast(f.type) for f in schema}, schema=schema)


def _write(lake: Path, compression: str | None) -> Path:
    writer = LakeWriter(lake)
    writer.compression = compression
    for i in range(4):
        writer.append("trajectories", _rows(i * 3, 3))
    writer.close()
    [seg] = segment_files(lake, "trajectories")
    return seg


def test_a_compressed_segment_reads_as_the_plain_one_and_takes_little_room(tmp_path):
    plain = _write(tmp_path / "plain", None)
    small = _write(tmp_path / "small", "zstd")
    assert (compressed(plain), compressed(small)) == (False, True)
    assert small.stat().st_size * 50 < plain.stat().st_size
    assert read_table(tmp_path / "small", "trajectories").equals(
        read_table(tmp_path / "plain", "trajectories"))
    scan = scan_lake(tmp_path / "small")     # what SQL reads (the scratch copy)
    try:
        got = scan.tables["trajectories"].to_table(columns=["seq", "response_ids"])
    finally:
        scan.close()
    assert got["seq"].to_pylist() == list(range(12))
    assert pc.sum(pc.list_value_length(got["response_ids"])).as_py() == 12 * TOKENS


def test_a_scan_copies_a_compressed_segment_compressed(tmp_path):
    from pipeline.lake.scan import _live_copy
    seg = _write(tmp_path / "lake", "zstd")
    kind, mapped = _live_copy(seg, set(), tmp_path / "scratch.arrow")
    assert kind == "ipc" and mapped.size < 20 * seg.stat().st_size
    assert pa.ipc.open_file(mapped).read_all().num_rows == 12


def test_compaction_turns_a_compressed_segment_into_parquet(tmp_path):
    lake = tmp_path / "lake"
    _write(lake, "zstd")
    before = read_table(lake, "trajectories")
    assert len(compact(lake).compacted) == 1
    assert [p.suffix for p in segment_files(lake, "trajectories")] == [".parquet"]
    assert read_table(lake, "trajectories").equals(before)


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_a_segment_compacted_after_it_was_listed_is_read_from_its_parquet_copy(tmp_path,
                                                                               compression):
    """A scan lists an open segment, then compaction replaces it before the scan copies it (SQL
    running beside the buffer): the copy must read the Parquet file, not fail on the missing
    segment (which the check for compression opened first)."""
    from pipeline.lake.scan import _live_copy
    lake = tmp_path / "lake"
    seg = _write(lake, compression)
    before = read_table(lake, "trajectories")
    assert len(compact(lake).compacted) == 1 and not seg.exists()
    kind, mapped = _live_copy(seg, set(), tmp_path / "scratch.arrow")
    assert kind == "parquet"
    got = pq.read_table(pa.BufferReader(mapped))
    assert got.num_rows == before.num_rows == 12


def test_small_batches_of_a_compressed_segment_are_written_as_they_are(tmp_path):
    """A batch under 32 kB is not compressed (compressing one costs about 0.3 ms however small
    it is); the segment still counts as compressed when a later batch is, so a scan copies it
    compressed, and every reader reads both kinds in one stream."""
    from pipeline.lake.frames import RECORD_BATCH, _compressed, _header
    from pipeline.lake.scan import _live_copy
    lake = tmp_path / "lake"
    writer = LakeWriter(lake)
    writer.compression = "zstd"
    small = _rows(0, 2).set_column(LAKE_TABLES["trajectories"].get_field_index("response_ids"),
                                   LAKE_TABLES["trajectories"].field("response_ids"),
                                   pa.array([[1, 2], [3]], pa.list_(pa.int32())))
    small = small.set_column(small.schema.get_field_index("n_response_tokens"),
                             small.schema.field("n_response_tokens"), pa.array([2, 1]))
    writer.append("trajectories", small)
    writer.append("trajectories", _rows(2, 3))
    writer.close()
    [seg] = segment_files(lake, "trajectories")
    flags = []                                # per record batch message: compressed?
    data = seg.read_bytes()
    pos = 0
    while pos + 8 <= len(data):
        size = int.from_bytes(data[pos + 4:pos + 8], "little", signed=True)
        if size <= 0:
            break
        meta = data[pos + 8:pos + 8 + size]
        kind, body = _header(meta)
        if kind == RECORD_BATCH:
            flags.append(_compressed(meta))
        pos += 8 + size + body
    assert flags == [False, True]
    assert compressed(seg)
    got = read_table(lake, "trajectories")
    assert got["seq"].to_pylist() == list(range(5))
    assert got["response_ids"][0].as_py() == [1, 2]
    kind, mapped = _live_copy(seg, set(), tmp_path / "scratch.arrow")
    assert kind == "ipc" and mapped.size < 20 * seg.stat().st_size
