"""The lake as lazy pyarrow datasets: what a query reads is only the columns and rows it names.

Why: reading every table into memory to answer `select count(*) from decisions` costs the whole
lake's size in memory, token payload included. A pyarrow dataset registered in DuckDB is scanned
when a query runs, with the query's projection and filters pushed into the scan, one record batch
at a time, so a metadata query never touches the payload columns and an aggregate's memory is a
few row groups, whatever the lake's size.

Every file a scan reads is memory mapped once, when the scan is taken, and the datasets read
those mappings, never a path. Why: DuckDB scans a registered dataset afresh at every query, and a
dataset of paths reopens its files each time; a job that replaces a file (retention's rewrite) or
deletes it (compaction, once its copy is in place) would hand a connection made before it bytes
that do not match what it planned over, or no file at all. A mapping keeps the very file the scan
listed readable, whatever happens to its name, until the scan is dropped.

Compacted Parquet files (`replaylake compact`) are mapped where they lie. Live IPC segments
cannot be scanned in place: only replaylake's reader knows which of their bytes were acknowledged
(checksum file), which batches belong to an uncommitted multi-partition call, and where a torn
tail starts. So each open segment is read once through that reader (`lake.read.batches`, the very
rules every reader applies) and its committed batches are streamed, gathered into record batches
of about `SCRATCH_BATCH_BYTES`, to an Arrow IPC file in a scratch directory (uncompressed, unless
the segment was written compressed: see `lake.writer`)
(`pipeline.lake.scratch`), which is mapped and unlinked at once: the scan reads the mapping lazily,
and once `scan_lake` returns nothing of it is left on disk, however its process ends later.

Memory mapped also because, over a plain file, pyarrow's IPC reader (26.0.1, checked) answers a
scan that projects some of the columns by reading every record batch's metadata ahead on its I/O
threads, whose completions point at the reader. A scan abandoned before its end (a `LIMIT`, a
reader dropped after one batch) frees the reader while those reads are in flight, and the process
dies with a segmentation fault when they complete. A mapped buffer is zero-copy: every read of it
completes at once, on the calling thread. Pages a query touches are the file's own (the kernel can
drop them), mapped until the scan is dropped.

The snapshot is cut at one seq for every table, exactly as `analysis._consistent` does for
in-memory tables (computed from the `seq` column alone), so a scan taken while a buffer writes is
a prefix of its history.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from pipeline.errors import LakeError
from pipeline.lake import kill as lake_kill
from pipeline.lake import parquet, scratch
from pipeline.lake.files import CALL_KEY, mapped, table_of
from pipeline.lake.frames import compressed
from pipeline.lake.names import newest_copy, read_newest
from pipeline.lake.read import (
    LakeDamageError,
    batches,
    burnt_ranges,
    committed_calls,
    current_files,
    first_seq,
    missing_segments,
    read_log,
)
from schemas import LAKE_TABLES
from schemas.evolve import DERIVED, missing_columns, upgrade_batch


@dataclass
class LakeScan:
    """One snapshot of the lake as datasets over mapped files; ``close()`` drops the mappings
    (nothing of a scan is left on disk once `scan_lake` has returned)."""

    tables: dict[str, ds.Dataset]
    parquet_files: int = 0
    open_segments: int = 0
    cut: int | None = None

    def close(self) -> None:
        self.tables.clear()


def cut_seq(seqs: dict[str, np.ndarray], first: str,
            burnt: list[tuple[int, int]] | tuple = (), pending: list[int] | tuple = ()
            ) -> int | None:
    """The seq every table must be cut at for a consistent prefix, None when no cut is needed.

    The tables were read one after the other, ``first`` first; the journal numbers the rows of
    every table from one dense counter in write order. Every row up to the largest seq of the
    table read first was written before any later read began, so every table holds it; past it,
    the first gap in the union of seqs is a row written after its table was read (or a torn
    tail). Gaps below that point are permanent and stay as they are, and so are the ``burnt``
    ranges the log records (seqs of a write that failed or was torn by a crash, of writes a
    salvage set aside): those count as present, so acknowledged rows after them are never cut.

    ``pending``: the first seq of each part the readers left out because its call (written in
    several parts: partitions or tables) had no commit record when the log was read. Unless a
    burnt range holds it (a crash's call, burnt by the next writer), that call was in flight and
    its commit record was written after the log was read: rows written after it (even in the
    table read first) are cut with it, or a reader would see, say, a batch's release without
    the selection written before it."""
    cut = _gap_cut(seqs, first, burnt)
    flight = [p for p in pending if not any(a <= p <= b for a, b in burnt)]
    if flight:
        cut = min(flight) - 1 if cut is None else min(cut, min(flight) - 1)
    return cut


def _gap_cut(seqs: dict[str, np.ndarray], first: str, burnt: list[tuple[int, int]] | tuple
             ) -> int | None:
    head = seqs[first]
    floor = int(head.max()) if len(head) else -1
    top = max((int(s.max()) for s in seqs.values() if len(s)), default=floor)
    filled = [np.arange(max(a, floor + 1), min(b, top) + 1, dtype=np.int64)
              for a, b in burnt if b > floor and a <= top]
    above = np.unique(np.concatenate([s[s > floor] for s in seqs.values()] + filled))
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


def _taken(out: Path) -> pa.Buffer:
    """A scratch file, mapped and then unlinked: from here on it takes no room on disk."""
    lake_kill.hit("scan.scratch_written")
    try:
        return mapped(out)
    finally:
        out.unlink()


def _live_copy(path: Path, committed: set[tuple[str, str]], out: Path,
               left_out: list[int] | None = None) -> tuple[str, pa.Buffer] | None:
    """Stream the committed batches of a open segment into ``out`` (in batches of about
    SCRATCH_BATCH_BYTES); (format, mapped file) to scan: the scratch file, or the segment's
    Parquet copy if it was compacted since it was listed; None if nothing counts. ``left_out``
    gets the first seq of each part of a call not committed (see `cut_seq`)."""
    table = table_of(path)
    schema = LAKE_TABLES[table]
    rows = 0
    pending: list[pa.RecordBatch] = []
    size = 0
    try:
        # a compressed segment (a writer with `compression`) is copied compressed: its scratch
        # file takes about the segment's room, not what its batches take in memory. A segment
        # compacted and removed since it was listed is told by `batches` (LakeDamageError,
        # below), which then reads its Parquet copy
        try:
            packed = compressed(path)
        except FileNotFoundError:
            packed = False
        options = pa.ipc.IpcWriteOptions(compression="zstd") if packed else None
        with pa.ipc.new_file(out, schema, options=options) as w:
            for batch, meta in batches(path):
                call = (meta or {}).get(CALL_KEY)
                if call is not None and (table, call.decode()) not in committed:
                    if left_out is not None and batch.num_rows:
                        left_out.append(first_seq(batch))
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
        copy = newest_copy(path)
        if copy is not None:
            return _parquet(copy, table, out)
        raise
    if rows == 0:
        out.unlink()
        return None
    return "ipc", _taken(out)


def _parquet(path: Path, table: str, out: Path) -> tuple[str, pa.Buffer]:
    """A compacted file, mapped (its newest rewrite if a job replaced it since it was listed).
    One written before a derived column existed (`schemas.evolve`) is streamed row group by row
    group into the scratch file ``out`` with that column computed; other files are scanned as
    they are (a missing nullable column reads as null)."""
    buf = read_newest(path, mapped)
    parquet.verify(buf, path)       # before its footer is read; its pages are checked as decoded
    if not set(missing_columns(table, pq.read_schema(pa.BufferReader(buf)))) & DERIVED.keys():
        return "parquet", buf
    with pa.ipc.new_file(out, LAKE_TABLES[table]) as w:
        for batch in parquet.opened(buf).iter_batches():
            w.write_batch(upgrade_batch(table, batch))
    return "ipc", _taken(out)


_FORMATS = {"parquet": parquet.dataset_format(), "ipc": ds.IpcFileFormat()}


def _dataset(schema: pa.Schema, files: list[tuple[str, pa.Buffer]]) -> ds.Dataset:
    parts = []
    for kind, fmt in _FORMATS.items():
        frags = [fmt.make_fragment(buf) for k, buf in files if k == kind]
        if frags:
            parts.append(ds.FileSystemDataset(frags, schema, fmt))
    if not parts:
        return ds.dataset(schema.empty_table())
    return parts[0] if len(parts) == 1 else ds.dataset(parts)


def scan_lake(lake_dir: str | os.PathLike, scratch_root: str | os.PathLike | None = None
              ) -> LakeScan:
    """Every lake table as a lazily scanned dataset, all cut at one seq (see module doc)."""
    root = Path(lake_dir)
    if not root.is_dir():
        raise LakeError(f"no lake directory at {root}")
    lake_kill.arm_once()
    work = scratch.make(scratch_root)
    scan = LakeScan({})
    try:
        log = read_log(root)
        committed = committed_calls(root, log)
        gone = missing_segments(root, log)
        if gone:
            raise LakeDamageError(gone[0], 0, "the segment is missing (its writer logged it)")
        seqs: dict[str, np.ndarray] = {}
        pending: list[int] = []
        for table, schema in LAKE_TABLES.items():
            files = []
            for i, path in enumerate(current_files(root, table, log=log)):
                out = work / f"{table}-{i:06d}.arrow"
                if path.suffix == ".parquet":
                    files.append(_parquet(path, table, out))
                    continue
                scan.open_segments += 1
                got = _live_copy(path, committed, out, pending)
                if got is not None:
                    files.append(got)
            scan.parquet_files += sum(k == "parquet" for k, _ in files)
            data = _dataset(schema, files)
            seqs[table] = data.to_table(columns=["seq"]).column("seq").to_numpy()
            scan.tables[table] = data
        scan.cut = cut_seq(seqs, next(iter(LAKE_TABLES)), burnt_ranges(log), pending)
        if scan.cut is not None:
            for table, data in scan.tables.items():
                if len(seqs[table]) and seqs[table].max() > scan.cut:
                    scan.tables[table] = data.filter(ds.field("seq") <= scan.cut)
    except BaseException:
        scan.close()
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return scan


__all__ = ["LakeScan", "scan_lake", "cut_seq"]
