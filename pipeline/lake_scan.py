"""The lake as lazy pyarrow datasets: what a query reads is only the columns and rows it names.

Why: reading every table into memory to answer `select count(*) from decisions` costs the whole
lake's size in memory, token payload included. A pyarrow dataset registered in DuckDB is scanned
when a query runs, with the query's projection and filters pushed into the scan, one record batch
at a time, so a metadata query never touches the payload columns and an aggregate's memory is a
few row groups, whatever the lake's size.

Compacted Parquet files (`replaylake compact`) are scanned where they lie. Live IPC segments
cannot be scanned in place: only replaylake's reader knows which of their bytes were acknowledged
(checksum file), which batches belong to an uncommitted multi-partition call, and where a torn
tail starts. So each live segment is read once through that reader (`lake_read.batches`, the very
rules every reader applies) and its committed batches are streamed, gathered into record batches
of about `SCRATCH_BATCH_BYTES`, to an uncompressed Arrow IPC file in a scratch directory, which
the dataset then scans lazily, memory mapped. The scratch directory lives as long as the scan.

Why memory mapped: over a plain file, pyarrow's IPC reader (26.0.1, checked) answers a scan that
projects some of the columns by reading every record batch's metadata ahead on its I/O threads,
whose completions point at the reader. A scan abandoned before its end (a `LIMIT`, a reader
dropped after one batch) frees the reader while those reads are in flight, and the process dies
with a segmentation fault when they complete. A memory-mapped file is zero-copy: the reader takes
its whole-file path and every read completes at once, on the calling thread. Pages a query touches
are the file's own (the kernel can drop them), mapped until the scan ends.

The snapshot is cut at one seq for every table, exactly as `analysis._consistent` does for
in-memory tables (computed from the `seq` column alone), so a scan taken while a buffer writes is
a prefix of its history.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipeline.errors import LakeError
from pipeline.lake_files import CALL_KEY, table_of
from pipeline.lake_read import (
    LakeDamageError,
    batches,
    committed_calls,
    compacted_path,
    live_files,
    missing_segments,
    read_log,
)
from schemas import LAKE_TABLES
from schemas.evolve import DERIVED, missing_columns, upgrade_batch


@dataclass
class LakeScan:
    """One snapshot of the lake as datasets; ``close()`` removes its scratch files."""

    tables: dict[str, ds.Dataset]
    scratch: Path
    parquet_files: int = 0
    live_segments: int = 0
    cut: int | None = None
    _closed: bool = field(default=False, repr=False)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            shutil.rmtree(self.scratch, ignore_errors=True)


def cut_seq(seqs: dict[str, np.ndarray], first: str) -> int | None:
    """The seq every table must be cut at for a consistent prefix, None when no cut is needed.

    The tables were read one after the other, ``first`` first; the journal numbers the rows of
    every table from one dense counter in write order. Every row up to the largest seq of the
    table read first was written before any later read began, so every table holds it; past it,
    the first gap in the union of seqs is a row written after its table was read (or a torn
    tail). Gaps below that point are permanent and stay as they are."""
    head = seqs[first]
    floor = int(head.max()) if len(head) else -1
    above = np.unique(np.concatenate([s[s > floor] for s in seqs.values()]))
    if len(above) == 0:
        return None
    start = floor + 1 if floor >= 0 else int(above[0])
    gaps = np.flatnonzero(above != start + np.arange(len(above)))
    if len(gaps) == 0:
        return None
    return start + int(gaps[0]) - 1


# A scratch file's record batches gather a segment's writes up to about this many bytes: the
# segment holds one batch per write (often a few rows), and a scan of a mapped file maps the pages
# around every batch it reads (the kernel's fault-around), so few large batches keep a metadata
# query's mapped pages a small fraction of the file. Holds at most this much before writing it.
SCRATCH_BATCH_BYTES = 8 << 20


def _live_copy(path: Path, committed: set[tuple[str, str]], out: Path) -> Path | None:
    """Stream the committed batches of a live segment into ``out`` (in batches of about
    SCRATCH_BATCH_BYTES); the file to scan (the segment's Parquet copy if it was compacted since
    it was listed), None if nothing counts."""
    table = table_of(path)
    schema = LAKE_TABLES[table]
    rows = 0
    pending: list[pa.RecordBatch] = []
    size = 0
    try:
        with pa.ipc.new_file(out, schema) as w:
            for batch, meta in batches(path):
                call = (meta or {}).get(CALL_KEY)
                if call is not None and (table, call.decode()) not in committed:
                    continue
                if batch.schema != schema:
                    batch = upgrade_batch(table, batch)
                pending.append(batch)
                size += batch.nbytes
                rows += batch.num_rows
                if size >= SCRATCH_BATCH_BYTES:
                    w.write_batch(pa.concat_batches(pending))
                    pending, size = [], 0
            if pending:
                w.write_batch(pa.concat_batches(pending))
    except LakeDamageError:
        out.unlink(missing_ok=True)
        if compacted_path(path).exists():
            return compacted_path(path)
        raise
    if rows == 0:
        out.unlink()
        return None
    return out


def _old_parquet_copy(path: Path, table: str, out: Path) -> Path:
    """A compacted file written before a derived column existed (`schemas.evolve`), streamed
    row group by row group into ``out`` with that column computed; other files are scanned in
    place (a missing nullable column reads as null)."""
    if not set(missing_columns(table, pq.read_schema(path))) & DERIVED.keys():
        return path
    with pa.ipc.new_file(out, LAKE_TABLES[table]) as w:
        for batch in pq.ParquetFile(path).iter_batches():
            w.write_batch(upgrade_batch(table, batch))
    return out


# the scratch IPC files are scanned memory mapped (see the module doc: never on I/O threads)
_MAPPED = pafs.LocalFileSystem(use_mmap=True)


def _dataset(schema: pa.Schema, parquet: list[Path], ipc: list[Path]) -> ds.Dataset:
    parts = []
    if parquet:
        parts.append(ds.dataset([str(p) for p in parquet], format="parquet", schema=schema))
    if ipc:
        parts.append(ds.dataset([str(p) for p in ipc], format="ipc", schema=schema,
                                filesystem=_MAPPED))
    if not parts:
        return ds.dataset(schema.empty_table())
    return parts[0] if len(parts) == 1 else ds.dataset(parts)


def scan_lake(lake_dir: str | os.PathLike, scratch_root: str | os.PathLike | None = None
              ) -> LakeScan:
    """Every lake table as a lazily scanned dataset, all cut at one seq (see module doc)."""
    root = Path(lake_dir)
    if not root.is_dir():
        raise LakeError(f"no lake directory at {root}")
    scratch = Path(tempfile.mkdtemp(prefix="replaylake-scan-", dir=scratch_root))
    scan = LakeScan({}, scratch)
    try:
        log = read_log(root)
        committed = committed_calls(root, log)
        gone = missing_segments(root, log)
        if gone:
            raise LakeDamageError(gone[0], 0, "the segment is missing (its writer logged it)")
        seqs: dict[str, np.ndarray] = {}
        for table, schema in LAKE_TABLES.items():
            parquet, ipc = [], []
            for i, path in enumerate(live_files(root, table)):
                if path.suffix == ".parquet":
                    got = _old_parquet_copy(path, table, scratch / f"{table}-{i:06d}.arrow")
                    (parquet if got.suffix == ".parquet" else ipc).append(got)
                    continue
                scan.live_segments += 1
                got = _live_copy(path, committed, scratch / f"{table}-{i:06d}.arrow")
                if got is not None:
                    (parquet if got.suffix == ".parquet" else ipc).append(got)
            scan.parquet_files += len(parquet)
            data = _dataset(schema, parquet, ipc)
            seqs[table] = data.to_table(columns=["seq"]).column("seq").to_numpy()
            scan.tables[table] = data
        scan.cut = cut_seq(seqs, next(iter(LAKE_TABLES)))
        if scan.cut is not None:
            for table, data in scan.tables.items():
                if len(seqs[table]) and seqs[table].max() > scan.cut:
                    scan.tables[table] = data.filter(ds.field("seq") <= scan.cut)
    except BaseException:
        scan.close()
        raise
    return scan


__all__ = ["LakeScan", "scan_lake", "cut_seq"]
