"""Compaction: rewrite every sealed IPC segment of the lake as one zstd Parquet file beside it.

Why: the open segments are Arrow IPC streams behind checksum files, written for a cheap durable
append; nothing but replaylake's own reader can honour their torn-tail and commit-record rules,
and a scan has to verify and parse every byte of a segment to read one column of it. A Parquet
file holds only rows that count, and any engine (DuckDB, polars, Spark) reads just the columns and
row groups a query asks for.

Which segments: only sealed ones, those no writer will ever append to again:

- a segment that ends with the Arrow end-of-stream marker (its writer closed it);
- any segment, when the lake lock names no live writer (the lock record is empty, or its process
  is gone on this host);
- while a writer holds the lake, any segment that process does not hold open (read from
  `/proc/<pid>/fd`: a writer never reopens a file, and a file it abandoned after an error is
  closed). Where the holder's open files cannot be read (another host, no permission), only
  segments with the end-of-stream marker are taken.

The list of segments is taken before the lock record is read, so a writer that starts in between
only ever writes files the list does not hold.

How one segment is replaced, so that no reader ever sees a half-written or doubly counted file:
its committed rows (a multi-partition call without a commit record is dropped, a torn tail
ignored, exactly as readers do) are written to a hidden temporary file, fsync'ed, renamed to
`<stem>.parquet`, the directory fsync'ed, and only then the segment and its checksum file are
deleted. A reader that lists the directory in between finds both and counts the Parquet file
only; one that listed the segment before it was deleted reads the Parquet file instead (see
`lake.read.current_files` and `read_segment`). The Parquet metadata keeps the highest seq the segment
held, uncommitted rows included, so a restart still numbers after every seq ever handed out.

Idempotent: a segment with its Parquet file already in place is only deleted (a run killed
between rename and delete), and so is a checksum file left without its segment (killed between
the two deletes), a hidden temporary file (killed before a rename) and a Parquet file a newer
generation replaces (a retention killed before it deleted the file it rewrote, see
`lake.names`); nothing else is rewritten.
Two compactions (or a compaction and a retention) at once are refused by `_compact.lock`, so a
temporary file found under that lock is always a dead run's. Each of these steps is a kill point
(`lake.kill`: `compact.tmp_partial`, `.tmp_written`, `.renamed`, `.segment_deleted`, `.deleted`),
which the crash tests use to prove a killed run loses, duplicates and changes nothing.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from pipeline.errors import LakeError
from pipeline.lake import kill as lake_kill
from pipeline.lake import parquet
from pipeline.lake.files import (
    CALL_KEY,
    LOCK_NAME,
    SUM_SUFFIX,
    fsync_dir,
    replace_durably,
    sum_path,
    table_of,
)
from pipeline.lake.identity import require_lake
from pipeline.lake.names import newest_copy, superseded
from pipeline.lake.read import (
    HIGHEST_SEQ_KEY,
    batches,
    committed_calls,
    compacted_path,
    segment_files,
    stream_max_seq,
)
from pipeline.lake.verify import verify
from schemas import LAKE_TABLES
from schemas.evolve import upgrade_batch

COMPACT_LOCK = "_compact.lock"
ROW_GROUP_BYTES = 16 << 20      # about 16 MiB of Arrow data per row group: a scan's memory unit


@dataclass
class CompactReport:
    """What one compaction did."""

    compacted: list[Path] = field(default_factory=list)   # the Parquet files written
    skipped_open: int = 0         # segments a live writer may still append to
    cleaned: int = 0              # leftovers of an interrupted run, deleted
    rows: int = 0
    bytes_in: int = 0             # Arrow bytes of the segments' batches read
    bytes_out: int = 0            # Parquet bytes written


def _holder(root: Path) -> dict | None:
    """The lake lock's holder record, None when nobody holds it."""
    try:
        raw = (root / LOCK_NAME).read_bytes()
    except FileNotFoundError:
        return None
    if not raw:
        return None
    try:
        return json.loads(raw.decode())
    except ValueError:
        return {}                 # a record being written: some writer holds the lake


def _open_files(pid: int) -> set[Path] | None:
    """The files process ``pid`` holds open; None when that cannot be read."""
    base = Path(f"/proc/{pid}/fd")
    try:
        out = set()
        for fd in base.iterdir():
            try:
                out.add(Path(os.readlink(fd)))
            except OSError:
                continue
        return out
    except OSError:
        return None


def _closed(path: Path) -> bool:
    """Its acknowledged bytes end with the end-of-stream marker (the writer finished it)."""
    return verify(path).closed


def sealed(root: str | os.PathLike, segments: list[Path]) -> tuple[list[Path], int]:
    """(the sealed ones among ``segments``, how many are not); see the module doc."""
    root = Path(root)
    holder = _holder(root)
    if holder is None:
        return list(segments), 0
    pid, host = holder.get("pid"), holder.get("host")
    if isinstance(pid, int) and host == socket.gethostname():
        if not Path(f"/proc/{pid}").exists():
            return list(segments), 0      # its holder died; the kernel dropped the lock
        held = _open_files(pid)
        if held is not None:
            out = [s for s in segments if s.resolve() not in held]
            return out, len(segments) - len(out)
    out = [s for s in segments if _closed(s)]
    return out, len(segments) - len(out)


def _write_parquet(path: Path, committed: set[tuple[str, str]]) -> tuple[Path, int, int]:
    """Write the segment's committed rows to its Parquet file; (that file, rows, bytes read)."""
    table = table_of(path)
    schema = LAKE_TABLES[table]
    target = compacted_path(path)
    tmp = _tmp_of(path)
    meta = {HIGHEST_SEQ_KEY: str(stream_max_seq(path)).encode()}
    rows, size = 0, 0
    pending: list[pa.RecordBatch] = []
    with parquet.writer(tmp, schema.with_metadata({**(schema.metadata or {}), **meta})) as writer:
        def flush() -> None:
            if pending:
                writer.write_table(pa.Table.from_batches(pending, schema=schema),
                                   row_group_size=1 << 40)
                pending.clear()
                lake_kill.hit("compact.tmp_partial")

        held = 0          # Arrow bytes waiting in ``pending`` (summed as they come: linear)
        for batch, bmeta in batches(path):
            nbytes = batch.get_total_buffer_size()
            size += nbytes
            call = (bmeta or {}).get(CALL_KEY)
            if call is not None and (table, call.decode()) not in committed:
                continue
            if batch.schema != schema:
                batch = upgrade_batch(table, batch)
            pending.append(batch)
            rows += batch.num_rows
            held += nbytes
            if held >= ROW_GROUP_BYTES:
                flush()
                held = 0
        flush()
    replace_durably(tmp, target, synced="compact.tmp_written", replaced="compact.renamed")
    return target, rows, size


def _tmp_of(path: Path) -> Path:
    """The hidden temporary file a segment's Parquet copy is written to before its rename."""
    target = compacted_path(path)
    return target.with_name(f".{target.name}.tmp")


def _delete_segment(path: Path) -> None:
    for point, f in (("compact.segment_deleted", path), ("compact.deleted", sum_path(path))):
        try:
            f.unlink()
        except FileNotFoundError:
            pass
        lake_kill.hit(point)
    fsync_dir(path.parent)


def _leftovers(root: Path, segments: list[Path]) -> tuple[list[Path], list[Path]]:
    """What a killed compaction or retention left: (segments, or checksum files alone, whose
    Parquet copy is in place; hidden temporary files, and Parquet files a newer generation
    replaces). Only called under the job lock."""
    done = [p for p in segments if newest_copy(p) is not None]
    tmp: list[Path] = []
    for table in LAKE_TABLES:
        base = root / table
        if not base.exists():
            continue
        for crc in base.glob("partition=*/window=*/*.arrow.crc"):
            seg = crc.with_name(crc.name.removesuffix(SUM_SUFFIX))
            if not seg.exists() and newest_copy(seg) is not None:
                done.append(seg)
        tmp.extend(base.glob("partition=*/window=*/.*.parquet.tmp"))
        tmp.extend(superseded([p for p in segment_files(root, table) if p.suffix == ".parquet"]))
    return done, tmp


class _CompactLock:
    """One compaction per lake at a time (an flock on `_compact.lock`; dropped if it dies)."""

    def __init__(self, root: Path):
        self.fd = os.open(root / COMPACT_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            raise LakeError(f"another compaction or retention job is running on the lake {root} "
                            f"({root / COMPACT_LOCK}); wait for it to finish") from None

    def __enter__(self) -> _CompactLock:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def job_lock(root: str | os.PathLike) -> _CompactLock:
    """The lock `compact` and `retain` share: they rewrite the same files."""
    return _CompactLock(require_lake(root))


def compact(root: str | os.PathLike,
            progress: Callable[[int, int], None] | None = None) -> CompactReport:
    """Compact every sealed segment of the lake (see the module doc); ``progress(done, total)``
    is called after each segment. Safe while a buffer writes; idempotent."""
    root = Path(root)
    report = CompactReport()
    with job_lock(root):
        segments = [p for t in LAKE_TABLES for p in segment_files(root, t) if p.suffix == ".arrow"]
        lake_kill.arm_once()
        leftovers, tmp = _leftovers(root, segments)
        for p in leftovers:
            _delete_segment(p)
        for p in tmp:
            p.unlink(missing_ok=True)
        report.cleaned = len(leftovers) + len(tmp)
        todo, report.skipped_open = sealed(root, [p for p in segments if p not in leftovers])
        committed = committed_calls(root)    # after the list: every commit of a sealed segment
        for i, path in enumerate(todo):
            try:
                target, rows, size = _write_parquet(path, committed)
            except BaseException:
                _tmp_of(path).unlink(missing_ok=True)    # damage found on the way, say
                raise
            report.bytes_in += size
            _delete_segment(path)
            report.compacted.append(target)
            report.rows += rows
            report.bytes_out += target.stat().st_size
            if progress is not None:
                progress(i + 1, len(todo))
    return report


__all__ = ["CompactReport", "compact", "sealed", "job_lock", "COMPACT_LOCK", "ROW_GROUP_BYTES"]
