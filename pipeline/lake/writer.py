"""The durable lake: append-only Arrow IPC stream segments per table, partition and step window.

Layout (hive style, readable by DuckDB/polars/pyarrow while the buffer writes)::

    <root>/<table>/partition=<id>/window=<w>/<table>-<first_seq>-<writer>.arrow   (open segments)
    <root>/<table>/partition=<id>/window=<w>/<table>-<first_seq>-<writer>.arrow.crc (checksums)
    <root>/<table>/partition=<id>/window=<w>/*.parquet                             (compacted)
    <root>/_log/log-<writer>.arrow (+ .crc)       each writer's segments and multi-partition commits
    <root>/_writer.lock                           the one-writer-per-lake lock and its holder

Durability: every append goes straight to the operating system (no user-space buffer) and its
checksum record after it, before the call that made it returns, so an acknowledged write survives
`kill -9` of the process. With ``fsync=True`` each write and each checksum record is fsync'ed in
that order, and so are new files' directories (a new segment's name survives power loss too).
A process that dies mid-write leaves a torn tail past the last checksum record; readers ignore it.
Any other damage is refused (see `lake.read`). Each writer opens new files, so a torn file is
never appended to.

Rolling: a segment is finished (end-of-stream marker written, files closed) once it holds
``roll_bytes`` (64 MiB by default) or has been open ``roll_seconds`` (10 minutes), checked after
each call; the next rows for its table, partition and window go to a new segment. A finished
segment is sealed, so `replaylake compact` turns a running buffer's older data into Parquet
without waiting for the buffer to close. Both limits are attributes of the writer (`buf.lake`).

Compression: ``compression`` (an attribute of the writer too; None by default) set to "zstd" or
"lz4" compresses the buffers of the record batches written from then on, as Arrow's IPC writer
option does; every reader decompresses them. For a lake whose payload compresses to nothing (a
what-if replay's stand-in zeros); a run's token ids are better left to compaction's Parquet. A
record batch under 32 kB is written as it is (Arrow compresses each message on its own, so a
stream may mix both): compressing one costs about 0.3 ms however small it is, which was a sixth
of a 300-step replay's time, spent on decisions and events.

Atomicity of one call: a call's rows of one partition are one record batch in one file. A call
spanning several partitions, or several tables (`append_many`: `resume` writes its events and the
rows it keeps together; a selection writes its metric rows with it), writes one batch per table
and partition, each tagged with the call's name (writer + seq range), then its commit records in
the writer's log: one per table it wrote, all in one record batch, so they are one write (a crash
keeps all of them or none). Readers skip tagged batches without their commit record, so a call
torn between files reads as never made, and a later call (even one reusing its seqs) can never
commit its orphans. One record per table is what every replaylake reader already reads; the
previous version of this writer joined a call's tables in one record (comma separated), which
readers still split.
"""
from __future__ import annotations

import os
import threading
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from pipeline import interrupts
from pipeline.errors import LakeError
from pipeline.lake import kill as lake_kill
from pipeline.lake.files import (
    CALL_KEY,
    DEFAULT_WINDOW,
    LOG_DIR,
    LOG_SCHEMA,
    WINDOW_COLUMN,
    call_key,
    fsync_dir,
    segment_files,
    window_of,
)
from pipeline.lake.lock import LakeLock
from pipeline.lake.read import committed_calls, highest_seq, read_segment, read_table
from pipeline.lake.stream import Stream, UndoError
from schemas import LAKE_TABLES

__all__ = ["LakeWriter", "read_table", "read_segment", "segment_files", "committed_calls",
           "window_of", "highest_seq", "DEFAULT_WINDOW", "ROLL_BYTES", "ROLL_SECONDS"]

ROLL_BYTES = 64 << 20        # a segment is finished once it holds this many bytes ...
ROLL_SECONDS = 600.0         # ... or has been open this long (a 15-minute compaction finds it)


_FEW_ROWS = 32     # up to this many rows, Python finds a call's partitions faster than Arrow


def _lowest(steps: pa.ChunkedArray) -> int:
    """The lowest step of a part (numpy when the column allows it without a copy)."""
    if steps.null_count == 0 and steps.num_chunks == 1:
        return int(steps.chunk(0).to_numpy().min())
    return pc.min(steps).as_py()


def _rows_of(items: list[tuple[str, pa.Table]]) -> str:
    """"12 row(s) to the lake table 'decisions'" (or tables 'a', 'b'), for an error."""
    tables = list(dict.fromkeys(t for t, _ in items))
    return (f"{sum(r.num_rows for _, r in items)} row(s) to the lake "
            f"table{'s' if len(tables) > 1 else ''} {', '.join(map(repr, tables))}")


class LakeWriter:
    """Appends conformed rows to the lake; thread-safe; holds the lake's one-writer lock."""

    def __init__(self, root: str | os.PathLike, *, fsync: bool = False,
                 window: int = DEFAULT_WINDOW, roll_bytes: int = ROLL_BYTES,
                 roll_seconds: float = ROLL_SECONDS):
        self.root = Path(root)
        self.fsync = fsync
        self.window = window
        self.roll_bytes = roll_bytes
        self.compression: str | None = None      # see the module doc
        self.roll_seconds = roll_seconds
        self.tag = uuid.uuid4().hex[:12]
        self._streams: dict[tuple[str, str, int], Stream] = {}
        self._lock = threading.Lock()
        self._opened = 0
        self._broken: str | None = None     # set when a failed write could not be taken back
        self._marks: dict[int, tuple[Stream, tuple[int, int, bool]]] | None = None
        lake_kill.arm()
        new_dirs = [p for p in (self.root, *self.root.parents) if not p.exists()]
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            if fsync:
                for p in new_dirs:
                    fsync_dir(p.parent)
        except OSError as exc:
            raise LakeError(f"cannot create lake directory {self.root}: {exc}") from exc
        self._root_real = self.root.resolve()
        self.lock = LakeLock(self.root)

    def append(self, table: str, rows: pa.Table) -> None:
        """Write ``rows`` (already of ``LAKE_TABLES[table]``'s schema) durably, then return."""
        self.append_many([(table, rows)])

    def append_many(self, items: list[tuple[str, pa.Table]]) -> None:
        """Write the rows of one call that spans several tables (each already of its table's
        schema, seqs ascending across ``items``) durably and as one: a crash or a failed write
        keeps all of them or none (see the module doc), then return."""
        items = [(t, r if r.schema == LAKE_TABLES[t] else r.cast(LAKE_TABLES[t]))
                 for t, r in items if r.num_rows]
        if not items:
            return
        with self._lock, interrupts.held():
            if self._broken is not None:
                raise LakeError(self._broken)
            if not self.lock.held:
                raise LakeError(f"the lake writer of {self.root} is closed")
            self._marks = marks = {}
            try:
                self._append(items)
            except BaseException as exc:
                self._marks = None
                what = _rows_of(items)
                self._take_back(marks, exc, f"writing {what} under {self.root}")
                if isinstance(exc, (OSError, pa.ArrowException)):
                    raise LakeError(f"writing {what} under {self.root} failed ({exc}); nothing "
                                    "of this call was written") from exc
                raise
            self._marks = None
            for table in dict.fromkeys(t for t, _ in items):
                lake_kill.hit(table + ".acked")
            self._roll()

    def _take_back(self, marks: dict[int, tuple[Stream, tuple[int, int, bool]]],
                   exc: BaseException, what: str) -> None:
        """Undo every write of a failed call (each stream cut back to where the call found it:
        not even a multi-partition call's uncommitted parts stay behind), then abandon the open
        streams (later writes start new files). A cut that fails leaves the lake holding what
        memory was never told: the writer then refuses every later write, and reopening the lake
        restores exactly what is on disk."""
        try:
            for stream, mark in marks.values():
                stream.undo(mark, exc)
        except UndoError as undo:
            self._broken = (f"{what} failed ({exc!r}) and the partial write could not be taken "
                            f"back ({undo}); the lake may hold rows this buffer does not know: "
                            "close the buffer and open the lake again (a restart restores "
                            "exactly what is on disk)")
            self._abandon()
            raise LakeError(self._broken) from exc
        self._abandon()

    def _roll(self) -> None:
        """Finish every table segment that is full or old (see the module doc). The call that
        ran before is acknowledged already; a segment whose finish fails is only closed (its
        marker a torn tail at worst), and later rows go to a new segment either way."""
        now = time.monotonic()
        for key in [k for k in self._streams if k[0] != LOG_DIR]:
            stream = self._streams[key]
            if stream.size >= self.roll_bytes or now - stream.opened_at >= self.roll_seconds:
                del self._streams[key]
                try:
                    stream.finish()
                except Exception:       # the marker is taken back (or a torn tail at worst)
                    stream.abandon()

    def _append(self, items: list[tuple[str, pa.Table]]) -> None:
        """Write every part (and the commit record of a call with several); `_mark` notes each
        stream's position before this call first writes to it."""
        parts = [(table, key, part) for table, rows in items
                 for key, part in self._split(table, rows)]
        meta = None
        if len(parts) > 1:     # the call key marks the parts of one call (single part: no need)
            first = min(pc.min(r.column("seq")).as_py() for _, r in items)
            last = max(pc.max(r.column("seq")).as_py() for _, r in items)
            meta = {CALL_KEY: call_key(self.tag, first, last).encode()}
        for table, (partition, win), part in parts:
            stream = self._stream(table, partition, win, int(part.column("seq")[0].as_py()))
            self._mark(stream)
            stream.append(part.combine_chunks().to_batches(max_chunksize=part.num_rows)[0], meta)
        if meta is not None:   # every part is written: now the call counts, in every table
            self._log(*({"kind": "commit", "table": t, "writer": self.tag, "first_seq": first,
                         "last_seq": last, "parts": len(parts)}
                        for t in dict.fromkeys(t for t, _, _ in parts)))

    def record_removed(self, paths: list[str]) -> None:
        """Log that these segments (paths relative to the root) were taken away on purpose
        (salvage, or a job that rewrites segments), so readers stop asking for them."""
        with self._lock, interrupts.held():
            self._marks = None
            for p in paths:
                self._log({"kind": "removed", "path": p})

    def record_burnt(self, first: int, last: int) -> None:
        """Log that no row will ever have a seq in ``first..last`` (a failed or torn write's, a
        salvage's lost writes): readers then know the gap is for good, not a write in flight."""
        if last < first:
            return
        with self._lock, interrupts.held():
            self._log({"kind": "burnt", "first_seq": int(first), "last_seq": int(last)})

    def _split(self, table: str, rows: pa.Table):
        """One (partition, window) part per partition; the window is that of its oldest row.
        A small call's partitions are found in Python and its lowest step with numpy: a compute
        kernel's dispatch costs more than a 16-row put's whole scan in Python."""
        col = rows.column("partition")
        parts = (list(dict.fromkeys(col.to_pylist())) if rows.num_rows <= _FEW_ROWS
                 else pc.unique(col).to_pylist())
        for p in parts:
            part = rows if len(parts) == 1 else rows.filter(pc.equal(col, p))
            yield (p, window_of(_lowest(part.column(WINDOW_COLUMN[table])), self.window)), part

    def _log(self, *records: dict) -> None:
        """Append ``records`` to the writer's log as one record batch: one write."""
        key = (LOG_DIR, "", 0)
        if key not in self._streams:
            self._opened += 1
            self._streams[key] = self._create(self.root / LOG_DIR,
                                              f"log-{self.tag}{self._opened:04d}.arrow",
                                              LOG_SCHEMA, "log")
        row = {f.name: [r.get(f.name) for r in records] for f in LOG_SCHEMA}
        self._mark(self._streams[key])
        self._streams[key].append(pa.record_batch(row, schema=LOG_SCHEMA), None)

    def _create(self, d: Path, name: str, schema: pa.Schema, point: str) -> Stream:
        """A new stream in ``d``; with fsync, its name (and any new directory) made durable."""
        new_dirs = [p for p in (d, *d.parents) if not p.exists()]
        d.mkdir(parents=True, exist_ok=True)
        if new_dirs:
            lake_kill.hit(point + ".mkdir")
        stream = Stream(d / name, schema, point, self.fsync, self.compression)
        lake_kill.hit(point + ".create")
        if self.fsync:
            for p in [d, *(q.parent for q in new_dirs)]:
                fsync_dir(p)
            lake_kill.hit(point + ".dir_synced")
        return stream

    def _stream(self, table: str, partition: str, win: int, first_seq: int) -> Stream:
        key = (table, partition, win)
        if key not in self._streams:
            d = self.root / table / f"partition={partition}" / f"window={win:06d}"
            if not d.resolve().is_relative_to(self._root_real):
                raise LakeError(f"partition id {partition!r} would leave the lake {self.root}")
            self._opened += 1
            name = f"{table}-{first_seq:012d}-{self.tag}{self._opened:04d}.arrow"
            stream = self._create(d, name, LAKE_TABLES[table], table)
            self._streams[key] = stream
            self._log({"kind": "segment", "table": table,
                       "path": str(stream.path.relative_to(self.root))})
        return self._streams[key]

    def _mark(self, stream: Stream) -> None:
        """Note where ``stream`` stood before the running call first wrote to it."""
        if self._marks is not None and id(stream) not in self._marks:
            self._marks[id(stream)] = (stream, stream.mark())

    def _abandon(self) -> None:
        for stream in self._streams.values():
            stream.abandon()
        self._streams.clear()

    def close(self) -> None:
        """Finish every open stream (end-of-stream marker) and give up the lake's lock."""
        with self._lock, interrupts.held():
            try:
                for key in sorted(self._streams, key=lambda k: k[0] == LOG_DIR):
                    self._streams[key].finish()
            except (OSError, pa.ArrowException) as exc:
                raise LakeError(f"closing the lake {self.root} failed ({exc}); every "
                                "acknowledged write was already durable") from exc
            finally:
                self._abandon()
                self.lock.release()
