"""Parquet as the lake writes and reads it: every byte of a compacted file's data is covered by a
checksum, verified before any of it is decoded.

Why: a segment protects each acknowledged write with its own CRC-32C record, and a compacted
file replaces those segments. Without checksums of its own, a flipped bit in a compacted file
would decode to other values (a reward, a token id) and be read as if nothing had happened, or
crash the decoder. So a file is written with

- the checksum of everything before its footer (the row groups: page headers and pages), stored
  in the footer's key-value metadata (`SUM_KEY`: algorithm, length, checksum) and verified in
  full before a reader decodes anything: damage there is a `LakeDamageError` naming the file,
  which `replaylake lake check` lists and salvage sets aside;
- a CRC-32 per data page as well (Parquet's own), which every reader checks as it decodes.

The footer itself is checked by parsing it and by the columns it names: still the lake's columns
of its table, with their types (a footer that no longer parses, or that renames or retypes a
column, is damage too).
Files compacted before the lake wrote checksums hold neither and are read as they are.
"""
from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from pipeline.errors import LakeDamageError
from pipeline.lake.files import (
    CRC32,
    CRC32C,
    WRITE_ALGORITHM,
    checksum,
    extend_checksum,
    mapped,
    table_of,
)
from schemas import LAKE_TABLES

SUM_KEY = b"replaylake:rows_checksum"   # "<algorithm>:<bytes covered>:<checksum>"
# what every compacted or rewritten file is written with
OPTIONS: dict[str, Any] = {"compression": "zstd", "write_page_checksum": True}


class _Summed(io.RawIOBase):
    """A file that keeps the running checksum and length of what was written to it."""

    def __init__(self, f: Any) -> None:
        self.f, self.length, self.crc = f, 0, 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        data = bytes(data)
        self.crc = extend_checksum(self.crc, data, WRITE_ALGORITHM)
        self.length += len(data)
        return self.f.write(data)

    def tell(self) -> int:
        return self.length


@contextmanager
def writer(path: Path, schema: pa.Schema) -> Iterator[pq.ParquetWriter]:
    """A Parquet writer to ``path`` whose footer gets the checksum of the rows written through it
    (write whole row groups, then leave the block)."""
    with open(path, "wb") as f:
        sink = _Summed(f)
        w = pq.ParquetWriter(sink, schema, **OPTIONS)
        try:
            yield w
        except BaseException:
            try:
                w.close()           # the file is a temporary one, left for its caller to remove
            except Exception:       # noqa: BLE001 - the first error is the one to raise
                pass
            raise
        w.add_key_value_metadata({SUM_KEY: f"{WRITE_ALGORITHM}:{sink.length}:{sink.crc}"})
        w.close()


def write_table(table: pa.Table, path: Path, row_group_size: int | None = None) -> None:
    """``table`` as one checksummed Parquet file at ``path``."""
    with writer(path, table.schema) as w:
        w.write_table(table, row_group_size=row_group_size)


def verify(data: pa.Buffer, path: Path) -> None:
    """Raise `LakeDamageError` unless the file ``path`` (its bytes ``data``, mapped) has a footer
    that parses and bytes before it that match the checksum it records (a file without one,
    written before the lake kept them, passes)."""
    try:
        meta = pq.read_metadata(pa.BufferReader(data))
    except (pa.ArrowException, OSError, ValueError) as exc:    # ValueError: a name not UTF-8
        raise LakeDamageError(path, 0, f"the Parquet footer cannot be read ({exc})") from exc
    recorded = (meta.metadata or {}).get(SUM_KEY)
    if recorded is None:
        return
    try:
        algorithm, length, crc = (int(x) for x in recorded.split(b":"))
        if algorithm not in (CRC32, CRC32C):
            raise ValueError(algorithm)
    except ValueError as exc:
        raise LakeDamageError(path, 0, f"its recorded checksum {recorded!r} is not one the lake "
                                       "writes") from exc
    _check_columns(meta, path)
    if data.size < length or checksum(data[:length], algorithm) != crc:
        raise LakeDamageError(path, 0, f"the bytes of its rows (0 to {length}) do not match the "
                                       "checksum the file records")


def _check_columns(meta: pq.FileMetaData, path: Path) -> None:
    """The footer of a checksummed file (written with the lake's schema of its table) still
    names that table's columns with their types, in order: a flipped bit in the footer that
    renames or retypes a column parses, but must not be read as other values."""
    expected = LAKE_TABLES.get(table_of(path))
    if expected is None:
        return
    try:
        got = meta.schema.to_arrow_schema()
        stored = {meta.schema.column(i).path.split(".")[0] for i in range(meta.num_columns)}
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise LakeDamageError(path, 0, f"the Parquet footer's schema cannot be read ({exc})") \
            from exc
    known = {f.name: f.type for f in expected}
    wrong = [f.name for f in got if known.get(f.name) != f.type]
    if wrong or [f.name for f in expected if f.name in got.names] != got.names or \
            stored != set(got.names):
        raise LakeDamageError(path, 0, f"its footer no longer describes the {table_of(path)} "
                                       f"table's columns (e.g. {(wrong or got.names)[:3]})")


def open_file(path: Path) -> pq.ParquetFile:
    """A compacted file, mapped once (the checksum and the decoding read the same pages),
    verified whole, then opened with every page checked as it is decoded."""
    data = mapped(Path(path))
    verify(data, Path(path))
    return opened(data)


def opened(data: pa.Buffer) -> pq.ParquetFile:
    """A verified file's mapped bytes, opened with every page checked as it is decoded."""
    return pq.ParquetFile(pa.BufferReader(data), page_checksum_verification=True)


def dataset_format() -> ds.ParquetFileFormat:
    """The dataset format scans of compacted files use (their buffers verified with `verify`
    first): pages checked as they are scanned."""
    return ds.ParquetFileFormat(default_fragment_scan_options=ds.ParquetFragmentScanOptions(
        page_checksum_verification=True))
