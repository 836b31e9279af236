"""Lakes as a writer of an older schema left them: columns added later removed from the files.

``without_columns(lake, {table: [column, ...]})`` rewrites every segment of those tables (open
Arrow IPC segments with their checksum records, and compacted Parquet files) without the named
columns, and returns how many files it rewrote: what the readers must bring up to date
(schemas/evolve.py).
"""
from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.lake.files import pack_record, segment_files, sum_path
from pipeline.lake.read import batches


def without_columns(lake: Path, columns: Mapping[str, Sequence[str]],
                    tiers: Sequence[str] = ("live", "compacted")) -> int:
    n = 0
    for table, cols in columns.items():
        for path in segment_files(lake, table):
            if path.suffix == ".parquet" and "compacted" in tiers:
                t = pq.read_table(path)
                pq.write_table(t.drop_columns(list(cols)).replace_schema_metadata(
                    t.schema.metadata), path)
                n += 1
            elif path.suffix == ".arrow" and "live" in tiers:
                n += _rewrite_segment(path, cols)
    return n


def _rewrite_segment(path: Path, cols: Sequence[str]) -> int:
    parts = list(batches(path))
    if not parts:
        return 0
    schema = parts[0][0].schema
    old = pa.schema([f for f in schema if f.name not in cols], metadata=schema.metadata)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, old) as w:
        for b, meta in parts:
            w.write_batch(b.select(old.names), custom_metadata=meta)
    data = sink.getvalue().to_pybytes()
    path.write_bytes(data)
    sum_path(path).write_bytes(pack_record(len(data), zlib.crc32(data)))
    return 1
