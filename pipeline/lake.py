"""The durable lake: append-only Arrow IPC stream segments per table, partition and step window.

Layout (hive style, readable by DuckDB/polars/pyarrow while the buffer writes)::

    <root>/<table>/partition=<id>/window=<w>/<table>-<first_seq>-<writer>.arrow   (live segments)
    <root>/<table>/partition=<id>/window=<w>/*.parquet                             (compacted)

Durability: every append is written and flushed to the operating system before the call that
made it returns, so an acknowledged write survives `kill -9` of the process. With ``fsync=True``
each append is also fsync'ed (survives power loss, at a cost the ingest benchmark reports).
A process that dies mid-write leaves a torn tail in its last segment; readers stop at the last
complete record batch. Each writer opens new segment files, so a torn file is never appended to.
"""
from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.errors import LakeError
from schemas import LAKE_TABLES

DEFAULT_WINDOW = 1000
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
        self.bytes_written = 0
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
            touched = []
            for (partition, win), part in self._split(table, rows):
                sink, writer = self._open(table, partition, win, int(part.column("seq")[0].as_py()))
                writer.write_table(part)
                sink.flush()
                touched.append(sink)
            if self.fsync:
                for sink in touched:
                    os.fsync(sink.fileno())
            self.bytes_written += rows.nbytes

    def _split(self, table: str, rows: pa.Table):
        parts = pc.unique(rows.column("partition")).to_pylist()
        steps = rows.column(_WINDOW_COLUMN[table])
        wins = pc.divide(pc.max_element_wise(steps, 0), self.window)
        lo, hi = pc.min(wins).as_py(), pc.max(wins).as_py()
        if len(parts) == 1 and lo == hi:
            yield (parts[0], lo), rows
            return
        for p in parts:
            for w in range(lo, hi + 1):
                mask = pc.and_(pc.equal(rows.column("partition"), p), pc.equal(wins, w))
                part = rows.filter(mask)
                if part.num_rows:
                    yield (p, w), part

    def _open(self, table: str, partition: str, win: int, first_seq: int):
        key = (table, partition, win)
        if key not in self._files:
            d = self.root / table / f"partition={partition}" / f"window={win:06d}"
            d.mkdir(parents=True, exist_ok=True)
            path = d / f"{table}-{first_seq:012d}-{self._tag}.arrow"
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


def read_segment(path: Path) -> pa.Table:
    """Every complete record batch of one segment; a torn tail (crash mid-write) is ignored."""
    schema = LAKE_TABLES[path.name.split("-")[0]] if path.suffix == ".arrow" else None
    if path.suffix == ".parquet":
        return pq.read_table(path)
    batches = []
    try:
        with pa.OSFile(str(path), "rb") as f:
            reader = pa.ipc.open_stream(f)
            while True:
                try:
                    batches.append(reader.read_next_batch())
                except StopIteration:
                    break
                except (pa.ArrowInvalid, OSError):
                    break  # torn tail: the process died while writing this batch
    except (pa.ArrowInvalid, OSError):
        pass  # died before the schema was complete: the file holds no rows
    return pa.Table.from_batches(batches, schema=schema)


def read_table(root: str | os.PathLike, table: str,
               partitions: list[str] | None = None) -> pa.Table:
    """One lake table as a pyarrow Table sorted by ``seq`` (empty, with its schema, if absent)."""
    schema = LAKE_TABLES[table]
    parts = [read_segment(p) for p in segment_files(root, table, partitions)]
    parts = [t.cast(schema) if t.schema != schema else t for t in parts if t.num_rows]
    if not parts:
        return schema.empty_table()
    out = pa.concat_tables(parts)
    return out.take(pc.sort_indices(out, [("seq", "ascending")]))
