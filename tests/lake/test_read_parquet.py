"""Reading compacted Parquet files: a large one is decoded in record batches (the same rows,
types and schema metadata as a whole read), and the seq statistics come from the seq column."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.lake import read
from tests.lake.test_lake_compression import _rows


def test_a_large_compacted_file_reads_in_batches_as_it_reads_whole(tmp_path, monkeypatch):
    path = tmp_path / "part.parquet"
    table = _rows(0, 40)                     # 40 rows of 800 kB of token ids: 32 MB of Arrow
    pq.write_table(table, path, compression="zstd")
    whole = read.read_parquet(path)          # under the threshold: one read
    monkeypatch.setattr(read, "_WHOLE_BYTES", 4 * 2**20)
    batched = read.read_parquet(path)        # over it: batches of about 1 MB (one row each)
    assert whole.column("seq").num_chunks == 1
    assert batched.column("seq").num_chunks == 40
    assert batched.equals(whole) and batched.equals(table)
    assert batched.schema.equals(whole.schema, check_metadata=True)


def test_the_highest_seq_of_a_compacted_file_is_read_from_its_seq_column(tmp_path):
    """The statistics are found by the column's leaf path: the list and map columns before
    `seq` make more Parquet columns than Arrow fields, and the column at seq's field index is
    another one (here `generation_s`, whose maximum is far above every seq)."""
    table = _rows(5, 3)
    table = table.set_column(table.schema.get_field_index("generation_s"), "generation_s",
                             pa.array([1e6, 2e6, 3e6]))
    path = tmp_path / "part.parquet"
    pq.write_table(table, path)              # no kept highest seq in its metadata
    meta = pq.read_metadata(path)
    assert read.seq_ranges(meta) == [(5, 7)]
    assert read._parquet_max_seq(path) == 7


def test_a_table_read_for_some_columns_holds_those_of_every_row_in_seq_order(tmp_path):
    """`read_table(columns=...)`: what a reader of a few small columns (salvage's seq scan, a
    restore's metric seqs) gets is the whole read's rows, those columns only, also on a table
    that is absent (its empty schema, those columns)."""
    from pipeline import ReplayBuffer
    from tests.support.lake import add_group
    lake = tmp_path / "lake"
    buf = ReplayBuffer.async_(lake=lake)
    for k in range(3):
        add_group(buf, f"g{k}", gs=k + 1)
    buf.close()
    whole = read.read_table(lake, "trajectories")
    some = read.read_table(lake, "trajectories", columns=["seq", "uid"])
    assert some.column_names == ["seq", "uid"] and whole.num_rows == 6
    assert some.equals(whole.select(["seq", "uid"]))
    empty = read.read_table(lake, "metrics", columns=["seq"])
    assert empty.column_names == ["seq"] and empty.num_rows == 0
