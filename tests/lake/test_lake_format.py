"""The lake's files on disk: Arrow IPC streams exactly as Arrow writes them, and their checksums."""
from __future__ import annotations

import struct
import zlib
from pathlib import Path

import google_crc32c
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from jobs.cli import app
from pipeline import ReplayBuffer
from pipeline.lake.damage import check
from pipeline.lake.files import (
    CALL_KEY,
    CRC32,
    CRC32C,
    Record,
    pack_record,
    sum_path,
    unpack_records,
)
from pipeline.lake.read import LakeDamageError
from pipeline.lake.recovery import salvage
from pipeline.lake.stream import WRITE_PIECE, Stream
from pipeline.lake.verify import batches
from pipeline.lake.writer import LakeWriter, read_table, segment_files
from schemas import LAKE_TABLES
from tests.support.lake import add_group, lake_history
from tests.support.lake_damage import flip_bytes, write_ends

cli = CliRunner()


def metrics(partitions: list[str], first_seq: int) -> pa.Table:
    n = len(partitions)
    return pa.table({
        "partition": partitions, "step": list(range(n)), "batch_id": [None] * n,
        "name": [f"m{i}" for i in range(n)], "value": [float(i) for i in range(n)],
        "seq": list(range(first_seq, first_seq + n)),
        "ts": pa.array([0] * n, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
    }, schema=LAKE_TABLES["metrics"])


def rewritten_by_arrow(path: Path) -> bytes:
    """The stream's batches (with their custom metadata) written again by Arrow's stream writer."""
    with pa.memory_map(str(path)) as src:
        reader = pa.ipc.open_stream(src)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, reader.schema) as writer:
            while True:
                try:
                    batch, meta = reader.read_next_batch_with_custom_metadata()
                except StopIteration:
                    break
                writer.write_batch(batch, custom_metadata=meta)
    return sink.getvalue().to_pybytes()


def test_every_lake_stream_is_byte_for_byte_what_arrows_stream_writer_writes(tmp_path):
    writer = LakeWriter(tmp_path)
    writer.append("metrics", metrics(["a"], 0))                # one partition: no call key
    writer.append("metrics", metrics(["a", "b", "b"], 1))      # a multi-partition call
    writer.append("metrics", metrics(["b"], 4))
    writer.close()
    streams = sorted(tmp_path.rglob("*.arrow"))
    assert len(streams) == 3                                   # two segments and the log
    for path in streams:
        assert path.read_bytes() == rewritten_by_arrow(path), path
    with pa.memory_map(str(next(p for p in streams if "partition=b" in str(p)))) as src:
        reader = pa.ipc.open_stream(src)
        _, meta = reader.read_next_batch_with_custom_metadata()
        assert CALL_KEY in meta.keys()
    assert read_table(tmp_path, "metrics")["seq"].to_pylist() == [0, 1, 2, 3, 4]


def test_a_stream_refuses_a_batch_of_another_schema_and_stays_readable(tmp_path):
    stream = Stream(tmp_path / "m.arrow", LAKE_TABLES["metrics"], "metrics", fsync=False)
    stream.append(metrics(["a"], 0).to_batches()[0], None)
    with pytest.raises(pa.ArrowInvalid, match="another schema"):
        stream.append(pa.record_batch({"x": [1]}), None)
    stream.finish()
    assert [b.num_rows for b, _ in batches(tmp_path / "m.arrow")] == [1]


def test_a_write_larger_than_one_piece_lands_whole_under_one_checksum_record(tmp_path):
    # a batch of several MiB goes out in WRITE_PIECE-sized os.write calls; the file must hold the
    # same bytes Arrow writes, and the write must count as one record (one unit for recovery)
    schema = pa.schema([pa.field("blob", pa.large_binary())])
    big = pa.record_batch([pa.array([bytes(range(256)) * 4096 * 3, b"tail"], pa.large_binary())],
                          schema=schema)
    assert big.nbytes > 2 * WRITE_PIECE + 1
    path = tmp_path / "big.arrow"
    stream = Stream(path, schema, "big", fsync=False)
    stream.append(big, None)
    stream.append(big.slice(1), None)
    stream.finish()
    assert path.read_bytes() == rewritten_by_arrow(path)
    ends = [r.end for r in unpack_records(sum_path(path).read_bytes())]
    assert len(ends) == 3 and ends[-1] == path.stat().st_size        # two appends and the EOS
    assert [b.num_rows for b, _ in batches(path)] == [2, 1]


def as_written_before_crc32c(root: Path) -> int:
    """Rewrite every checksum file of the lake with zlib CRC-32 records, exactly as the lake was
    written before CRC-32C (same layout, algorithm 0); returns how many records were rewritten."""
    n = 0
    for sums in root.rglob("*.arrow.crc"):
        data = sums.with_name(sums.name.removesuffix(".crc")).read_bytes()
        out, start = [], 0
        for rec in unpack_records(sums.read_bytes()):
            out.append(pack_record(rec.end, zlib.crc32(data[start:rec.end])))
            start = rec.end
        sums.write_bytes(b"".join(out))
        n += len(out)
    return n


def test_a_crc32_record_is_byte_for_byte_the_record_of_the_format_before_crc32c():
    head = struct.pack("<QI", 86936, 0xDEADBEEF)
    assert pack_record(86936, 0xDEADBEEF) == head + struct.pack("<I", zlib.crc32(head))
    assert unpack_records(pack_record(86936, 0xDEADBEEF)) == [Record(86936, 0xDEADBEEF, CRC32)]


def test_new_writes_are_checked_with_crc32c(tmp_path):
    writer = LakeWriter(tmp_path)
    writer.append("metrics", metrics(["a"], 0))
    writer.close()
    [seg] = tmp_path.rglob("metrics-*.arrow")
    records = unpack_records(sum_path(seg).read_bytes())
    assert [r.algorithm for r in records] == [CRC32C, CRC32C]     # the batch, the end marker
    data = seg.read_bytes()
    assert records[0].crc == google_crc32c.value(data[:records[0].end])


def test_a_lake_written_with_crc32_records_still_reads_checks_and_takes_new_writes(lake):
    with ReplayBuffer.sync(lake=lake) as buf:
        for i in range(20):
            add_group(buf, f"g{i:02d}", 1)
    before = lake_history(lake)
    assert as_written_before_crc32c(lake) > 60
    assert lake_history(lake) == before
    assert check(lake).findings == []
    res = cli.invoke(app, ["lake", "check", "--lake", str(lake)])
    assert res.exit_code == 0, res.output
    with ReplayBuffer.sync(lake=lake) as buf:                     # a restore, then new writes
        assert buf.counts("train")["finished"] == 20
        add_group(buf, "new", 2)
    algorithms = {r.algorithm for p in lake.rglob("*.arrow.crc")
                  for r in unpack_records(p.read_bytes())}
    assert algorithms == {CRC32, CRC32C}                          # old files and new side by side
    assert read_table(lake, "trajectories").num_rows == 42
    assert check(lake).findings == []


def test_damage_in_a_lake_written_with_crc32_records_is_still_refused_and_salvaged(lake):
    with ReplayBuffer.sync(lake=lake) as buf:
        for i in range(20):
            add_group(buf, f"g{i:02d}", 1)
    as_written_before_crc32c(lake)
    [seg] = segment_files(lake, "trajectories")
    ends = write_ends(seg)
    flip_bytes(seg, ends[4] + 100)                                # inside the sixth write
    with pytest.raises(LakeDamageError, match=f"damaged at byte {ends[4]}: checksum mismatch"):
        read_table(lake, "trajectories")
    report = salvage(lake)
    assert report.kept_writes == len(ends) - 1 and report.lost_writes == 1
    assert read_table(lake, "trajectories").num_rows == 38        # g05's two rows are gone
    assert check(lake).findings == []


def test_a_checksum_record_naming_an_unknown_algorithm_is_a_damaged_record():
    assert unpack_records(pack_record(100, 7, algorithm=9)) == [None]


@pytest.mark.parametrize("rows", [6, 100])      # a few rows, and more than the Python path takes
@pytest.mark.parametrize("chunks", [1, 2])
def test_each_partition_of_a_call_goes_to_the_window_of_its_oldest_step(tmp_path, rows, chunks):
    t = metrics(["b" if i % 3 else "a" for i in range(rows)], 0)
    steps = [rows * 400 + 100 - 400 * i for i in range(rows)]  # older and older: windows apart
    t = t.set_column(t.schema.get_field_index("step"), "step", pa.array(steps, pa.int64()))
    t = pa.concat_tables([t.slice(0, rows // 2), t.slice(rows // 2)]) if chunks == 2 else t
    assert t.column("step").num_chunks == chunks
    writer = LakeWriter(tmp_path, window=1000)
    writer.append("metrics", t)
    writer.close()
    lowest = {p: min(s for q, s in zip(t["partition"].to_pylist(), steps) if q == p)
              for p in ("a", "b")}
    dirs = sorted(p.parent.relative_to(tmp_path / "metrics").as_posix()
                  for p in segment_files(tmp_path, "metrics"))
    assert dirs == [f"partition={p}/window={lowest[p] // 1000:06d}" for p in ("a", "b")]
    assert read_table(tmp_path, "metrics")["seq"].to_pylist() == list(range(rows))
