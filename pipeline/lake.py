"""The durable lake: append-only Arrow IPC stream segments per table, partition and step window.

Layout (hive style, readable by DuckDB/polars/pyarrow while the buffer writes)::

    <root>/<table>/partition=<id>/window=<w>/<table>-<first_seq>-<writer>.arrow   (live segments)
    <root>/<table>/partition=<id>/window=<w>/*.parquet                             (compacted)

Durability: every append is written and flushed to the operating system before the call that
made it returns, so an acknowledged write survives `kill -9` of the process. With ``fsync=True``
each append is also fsync'ed (survives power loss, at a cost the ingest benchmark reports).
A process that dies mid-write leaves a torn tail in its last segment; readers stop at the last
complete record batch. Each writer opens new segment files, so a torn file is never appended to.

Atomicity of one call: a call's rows of one partition are one record batch in one file, so they
land whole or not at all. A call spanning several partitions writes one batch per partition,
each tagged with the call's first seq in the batch's custom metadata, and then a commit record
in `<root>/_commits/`; readers skip tagged batches whose call has no commit record. So a crash
between two partitions' writes leaves nothing of the call, as if it had never been made.
"""
from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.errors import LakeError
from schemas import LAKE_TABLES

DEFAULT_WINDOW = 1000
_COMMIT_SCHEMA = pa.schema([pa.field("table", pa.string()), pa.field("first_seq", pa.int64()),
                            pa.field("parts", pa.int32())])
_MULTI = b"replaylake.multi_call"
_WINDOW_COLUMN = {
    "trajectories": "max_global_steps",
    "group_events": "global_steps",
    "decisions": "step",
    "metrics": "step",
}


def window_of(step: int, window: int = DEFAULT_WINDOW) -> int:
    """The step window a step falls in (negative steps never reach the lake)."""
    return max(int(step), 0) // window


class LakeWriter:
    """Appends conformed rows to the lake; thread-safe; one writer per process per lake."""

    def __init__(self, root: str | os.PathLike, *, fsync: bool = False,
                 window: int = DEFAULT_WINDOW):
        self.root = Path(root)
        self.fsync = fsync
        self.window = window
        self._tag = uuid.uuid4().hex[:8]
        self._files: dict[tuple[str, str, int], tuple[object, pa.ipc.RecordBatchStreamWriter]] = {}
        self._lock = threading.Lock()
        self._opened = 0
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LakeError(f"cannot create lake directory {self.root}: {exc}") from exc

    def append(self, table: str, rows: pa.Table) -> None:
        """Write ``rows`` (already of ``LAKE_TABLES[table]``'s schema) durably, then return."""
        if rows.num_rows == 0:
            return
        schema = LAKE_TABLES[table]
        if rows.schema != schema:
            rows = rows.cast(schema)
        with self._lock:
            try:
                self._append(table, rows)
            except (OSError, pa.ArrowException) as exc:
                # a half-written batch would hide every later one in its file: abandon the open
                # segments (later writes start new files) and say so
                self._abandon()
                raise LakeError(f"writing {rows.num_rows} row(s) to the lake table {table!r} under "
                                f"{self.root} failed ({exc}); nothing of this call was "
                                "acknowledged") from exc

    def _append(self, table: str, rows: pa.Table) -> None:
        parts = list(self._split(table, rows))
        first_seq = int(rows.column("seq")[0].as_py())
        meta = {_MULTI: str(first_seq).encode()} if len(parts) > 1 else None
        touched = []
        for (partition, win), part in parts:
            sink, writer = self._open(table, partition, win, int(part.column("seq")[0].as_py()))
            for batch in part.combine_chunks().to_batches(max_chunksize=part.num_rows or 1):
                writer.write_batch(batch, custom_metadata=meta)
            sink.flush()
            touched.append(sink)
        if self.fsync:
            for sink in touched:
                os.fsync(sink.fileno())
        if meta is not None:   # every part is durable: now the call counts
            self._commit(table, first_seq, len(parts))

    def _abandon(self) -> None:
        for sink, _ in self._files.values():
            try:
                sink.close()
            except OSError:
                pass
        self._files.clear()

    def _split(self, table: str, rows: pa.Table):
        """One (partition, window) part per partition; the window is that of its oldest row."""
        col = rows.column("partition")
        parts = pc.unique(col).to_pylist()
        for p in parts:
            part = rows if len(parts) == 1 else rows.filter(pc.equal(col, p))
            steps = part.column(_WINDOW_COLUMN[table])
            yield (p, window_of(pc.min(steps).as_py(), self.window)), part

    def _commit(self, table: str, first_seq: int, parts: int) -> None:
        key = ("_commits", "", 0)
        if key not in self._files:
            d = self.root / "_commits"
            d.mkdir(parents=True, exist_ok=True)
            self._opened += 1
            sink = open(d / f"commits-{self._tag}{self._opened:04d}.arrow", "wb")
            self._files[key] = (sink, pa.ipc.new_stream(sink, _COMMIT_SCHEMA))
        sink, writer = self._files[key]
        writer.write_table(pa.table({"table": [table], "first_seq": [first_seq], "parts": [parts]},
                                    schema=_COMMIT_SCHEMA))
        sink.flush()
        if self.fsync:
            os.fsync(sink.fileno())

    def _open(self, table: str, partition: str, win: int, first_seq: int):
        key = (table, partition, win)
        if key not in self._files:
            d = self.root / table / f"partition={partition}" / f"window={win:06d}"
            d.mkdir(parents=True, exist_ok=True)
            self._opened += 1
            path = d / f"{table}-{first_seq:012d}-{self._tag}{self._opened:04d}.arrow"
            sink = open(path, "wb")
            writer = pa.ipc.new_stream(sink, LAKE_TABLES[table])
            sink.flush()
            self._files[key] = (sink, writer)
        return self._files[key]

    def close(self) -> None:
        """Finish every open segment (writes the end-of-stream marker)."""
        with self._lock:
            for sink, writer in self._files.values():
                try:
                    writer.close()
                finally:
                    sink.close()
            self._files.clear()


def segment_files(root: str | os.PathLike, table: str,
                  partitions: list[str] | None = None) -> list[Path]:
    """Every live (.arrow) and compacted (.parquet) file of a lake table, in a stable order."""
    base = Path(root) / table
    if not base.exists():
        return []
    dirs = [base / f"partition={p}" for p in partitions] if partitions is not None else \
        sorted(base.glob("partition=*"))
    files: list[Path] = []
    for d in dirs:
        files.extend(sorted(d.glob("window=*/*.arrow")))
        files.extend(sorted(d.glob("window=*/*.parquet")))
    return files


def committed_calls(root: str | os.PathLike) -> set[tuple[str, int]]:
    """(table, first seq) of every multi-partition call whose commit record is complete."""
    out: set[tuple[str, int]] = set()
    for path in sorted((Path(root) / "_commits").glob("*.arrow")):
        for batch, _ in _batches(path):
            out.update(zip(batch.column("table").to_pylist(), batch.column("first_seq").to_pylist()))
    return out


def _batches(path: Path):
    """(batch, custom metadata) of every complete record batch; a torn tail ends the stream."""
    try:
        with pa.OSFile(str(path), "rb") as f:
            reader = pa.ipc.open_stream(f)
            while True:
                try:
                    yield reader.read_next_batch_with_custom_metadata()
                except StopIteration:
                    return
                except (pa.ArrowInvalid, OSError):
                    return  # torn tail: the process died while writing this batch
    except (pa.ArrowInvalid, OSError):
        return  # died before the schema was complete: the file holds no rows


def read_segment(path: Path, committed: set[tuple[str, int]] | None = None) -> pa.Table:
    """Every complete record batch of one segment. A torn tail is ignored, and so are the parts of
    a multi-partition call without a commit record (``committed``; None reads the lake's own)."""
    if path.suffix == ".parquet":
        return pq.read_table(path)
    table = path.name.split("-")[0]
    if committed is None:
        committed = committed_calls(path.parents[3])
    keep = []
    for batch, meta in _batches(path):
        call = (meta or {}).get(_MULTI)
        if call is None or (table, int(call)) in committed:
            keep.append(batch)
    return pa.Table.from_batches(keep, schema=LAKE_TABLES[table])


def read_table(root: str | os.PathLike, table: str, partitions: list[str] | None = None,
               keep: Callable[[pa.Table], pa.Array] | None = None) -> pa.Table:
    """One lake table as a pyarrow Table sorted by ``seq`` (empty, with its schema, if absent).

    ``keep(segment) -> boolean mask`` filters each segment as it is read, so a large table never
    has to fit in memory whole before filtering."""
    schema = LAKE_TABLES[table]
    committed = committed_calls(root)
    parts = []
    for path in segment_files(root, table, partitions):
        t = read_segment(path, committed)
        if t.num_rows and keep is not None:
            t = t.filter(keep(t))
        if t.num_rows:
            parts.append(t.cast(schema) if t.schema != schema else t)
    if not parts:
        return schema.empty_table()
    out = pa.concat_tables(parts)
    return out.take(pc.sort_indices(out, [("seq", "ascending")]))
