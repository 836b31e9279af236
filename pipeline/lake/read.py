"""Reading the lake: every acknowledged write, verified; a torn tail ignored; any damage refused.

A stream's checksum file says which of its bytes were acknowledged (see `lake.files`). Reading a
stream verifies those bytes and parses them; bytes past the last checksum record are the torn tail
of a write that never returned (at most one write), and are ignored. Everything else is damage and
raises `LakeDamageError` naming the file and the byte offset: a checksum mismatch, a stream
shorter than its acknowledged length, a damaged checksum record, a stream without its checksum
file, more than one write past the last record, a segment its writer logged that is gone, a
segment whose writer's log is gone. `replaylake lake check` lists such damage; `salvage` moves it
aside and keeps every write that still verifies.

Safe while a writer appends: the checksum file is read first, and a writer writes a stream's
bytes before their record, so every recorded byte is there to read.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.errors import LakeDamageError
from pipeline.lake import parquet
from pipeline.lake.files import (
    CALL_KEY,
    COMMIT_SEP,
    LOG_DIR,
    LOG_SCHEMA,
    RECORD_SIZE,
    log_files,
    refused,
    segment_files,
    sum_path,
    table_of,
    writer_of,
)
from pipeline.lake.identity import require_format
from pipeline.lake.names import current, generation_path, newest_copy, read_newest, stem
from pipeline.lake.verify import batches
from schemas import LAKE_TABLES
from schemas.evolve import upgrade

# Parquet metadata of a compacted segment: the highest seq its source held, committed or not
HIGHEST_SEQ_KEY = b"replaylake.highest_seq"


def log_records(root: str | os.PathLike) -> pa.Table:
    """Every record of every writer's log, as they are (`read_log` also checks none is gone)."""
    parts = [b for p in log_files(root) for b, _ in batches(p)]
    return pa.Table.from_batches(parts, schema=LOG_SCHEMA)


def burnt_ranges(log: pa.Table) -> list[tuple[int, int]]:
    """The seq ranges the lake's writers and salvages logged as never to be written."""
    burnt = log.filter(pc.equal(log.column("kind"), "burnt"))
    return list(zip(burnt.column("first_seq").to_pylist(), burnt.column("last_seq").to_pylist()))


def read_log(root: str | os.PathLike) -> pa.Table:
    """Every record of every writer's log; a segment whose writer's log is gone is damage
    (see `unlogged_segments`), so no reader takes a missing log for calls never committed."""
    require_format(root)      # a newer layout's log would be misread
    log = log_records(root)
    gone = unlogged_segments(root, log)
    if gone:
        raise LakeDamageError(gone[0], 0, unlogged_message(writer_of(gone[0])))
    return log


def unlogged_message(writer: str | None) -> str:
    """What is wrong with a segment whose writer's log is gone, and what to do."""
    return (f"its writer's log ({LOG_DIR}/log-{writer}*.arrow) is missing, so that writer's "
            "multi-partition calls cannot be told from calls never committed, nor its missing "
            f"segments noticed; copy the lake's {LOG_DIR} directory back (copy and sync tools "
            "that skip names starting with `_` leave it out)")


def logged_writers(root: str | os.PathLike, log: pa.Table) -> set[str]:
    """The tags of the writers whose log is in the lake, or was set aside by a salvage (which
    records a `removed` record for a log it could keep nothing of)."""
    tags = {writer_of(p) for p in log_files(root)}
    kinds, paths = log.column("kind").to_pylist(), log.column("path").to_pylist()
    for k, p in zip(kinds, paths):
        if k == "removed" and p and Path(p).parent.name == LOG_DIR:
            tags.add(writer_of(Path(p)) or Path(p).name.removeprefix("log-"))
    tags.discard(None)
    return tags


def unlogged_segments(root: str | os.PathLike, log: pa.Table) -> list[Path]:
    """Live segments holding acknowledged writes whose writer has no log. A writer creates its
    log, and records a segment in it, before the segment's first write, so no crash leaves such
    a segment: its log was deleted (or not copied). The logs are listed again for a segment that
    looks unlogged, since a writer that started after the first listing has a log by now."""
    known = logged_writers(root, log) | {None}      # None: a name no writer gives a segment
    suspects = [p for t in LAKE_TABLES for p in segment_files(root, t)
                if p.suffix == ".arrow" and writer_of(p) not in known
                and _written(p) and newest_copy(p) is None]
    if suspects:
        known = logged_writers(root, log)
        suspects = [p for p in suspects if writer_of(p) not in known]
    return suspects


def _written(path: Path) -> bool:
    """Whether a stream holds an acknowledged write (or, without a checksum file, any byte)."""
    try:
        return sum_path(path).stat().st_size >= RECORD_SIZE
    except FileNotFoundError:
        return path.exists() and path.stat().st_size > 0


def committed_calls(root: str | os.PathLike, log: pa.Table | None = None) -> set[tuple[str, str]]:
    """(table, call name) of every call written in several parts (partitions, or tables)
    whose commit record is acknowledged: one record per table (a record of an earlier writer
    may name several, comma separated)."""
    log = read_log(root) if log is None else log
    c = log.filter(pc.equal(log.column("kind"), "commit"))
    return {(t, f"{w}:{a}:{b}") for ts, w, a, b in zip(*(c.column(k).to_pylist() for k in (
        "table", "writer", "first_seq", "last_seq"))) for t in ts.split(COMMIT_SEP)}


def missing_segments(root: str | os.PathLike, log: pa.Table | None = None) -> list[Path]:
    """Segments a writer logged that are gone without a `removed` record (salvage writes one)."""
    log = read_log(root) if log is None else log
    return [f for f in _logged(root, log) if not f.exists() and newest_copy(f) is None]


def compacted_path(path: Path) -> Path:
    """Where `replaylake compact` puts a segment's rows: same directory and stem, `.parquet`."""
    return generation_path(path, 0)


def current_files(root: str | os.PathLike, table: str, partitions: list[str] | None = None,
               log: pa.Table | None = None) -> list[Path]:
    """`segment_files` with only the newest file of each segment (`lake.names`): compaction
    renames the Parquet copy into place before it deletes the segment, and retention renames a
    rewrite into place before it deletes the file it rewrote, so a reader listing the directory
    in between sees both, and must count the rows once.

    With the writers' ``log``, a logged segment of which the listing holds no file is looked up
    by name: a directory too large for one read is listed in several, each of which sees it at
    another moment, so a listing taken while a job renamed one file of a segment in and deleted
    another can hold neither (seen on ext4 with a few thousand entries)."""
    files = segment_files(root, table, partitions)
    if log is not None:
        listed = {(f.parent, stem(f)) for f in files}
        for f in _logged(root, log, table, partitions):
            if (f.parent, stem(f)) not in listed:
                found = f if f.exists() else newest_copy(f)
                files += [found] if found is not None else []
        files.sort(key=lambda f: (str(f.parents[1]), f.suffix == ".parquet", str(f)))
    return current(files)


def _logged(root: str | os.PathLike, log: pa.Table, table: str | None = None,
            partitions: list[str] | None = None) -> list[Path]:
    """The segments (of ``table``, in ``partitions``) writers logged and no salvage removed."""
    kinds, paths = log.column("kind").to_pylist(), log.column("path").to_pylist()
    removed = {p for k, p in zip(kinds, paths) if k == "removed"}
    out = [Path(root) / p for k, p in zip(kinds, paths) if k == "segment" and p not in removed]
    return [f for f in out if (table is None or table_of(f) == table) and (
        partitions is None or f.parents[1].name.removeprefix("partition=") in partitions)]


def read_parquet(path: Path) -> pa.Table:
    """A compacted segment (its newest rewrite, if a job replaced it since it was listed); a
    file Parquet cannot read is damage like any other."""
    return read_newest(path, _read_parquet)


# a compacted file that decodes to more than this is read in record batches of about a quarter
# of it (16 MB): `pq.read_table` decodes every column chunk whole, and a file of a real run's
# payload (about 110 MB of Arrow) took about 540 MB of memory while it was read, 300 MB this way
_WHOLE_BYTES = 64 * 2**20

_WIDTH = {"BOOLEAN": 1, "INT32": 4, "FLOAT": 4, "INT64": 8, "DOUBLE": 8, "INT96": 12}


def _decoded_bytes(meta: pq.FileMetaData) -> int:
    """About the Arrow bytes a Parquet file decodes to: each column chunk's values at their
    width (its encoded size understates a run of zeros or a column of few distinct values), or
    its uncompressed size where larger (strings)."""
    total = 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for j in range(group.num_columns):
            col = group.column(j)
            total += max(col.total_uncompressed_size,
                         col.num_values * _WIDTH.get(col.physical_type, 0))
    return total


def _read_parquet(path: Path) -> pa.Table:
    try:
        with parquet.open_file(path) as f:
            meta = f.metadata
            size = _decoded_bytes(meta)
            if size <= _WHOLE_BYTES:
                return f.read()
            rows = max(1, meta.num_rows * _WHOLE_BYTES // (4 * size))
            return pa.Table.from_batches(list(f.iter_batches(batch_size=rows)),
                                         schema=f.schema_arrow)
    except (pa.ArrowException, OSError) as exc:
        if refused(exc):
            raise
        if not path.exists():
            raise FileNotFoundError(f"{path} is gone") from exc
        raise LakeDamageError(path, 0, f"the Parquet file cannot be read ({exc})") from exc


def read_segment(path: Path, committed: set[tuple[str, str]] | None = None,
                 pending: list[int] | None = None) -> pa.Table:
    """Every acknowledged record batch of one segment, without the parts of a multi-partition
    call that has no commit record (``committed``; None reads the lake's own). ``pending`` gets
    the first seq of each part left out (see `scan.cut_seq`)."""
    if path.suffix == ".parquet":
        return read_parquet(path)
    table = table_of(path)
    if committed is None:
        committed = committed_calls(path.parents[3])
    keep = []
    try:
        for batch, meta in batches(path):
            call = (meta or {}).get(CALL_KEY)
            if call is None or (table, call.decode()) in committed:
                keep.append(batch)
            elif pending is not None and batch.num_rows:
                pending.append(first_seq(batch))
    except LakeDamageError:
        copy = newest_copy(path)            # compacted (and deleted) since it was listed
        if copy is not None:
            return read_parquet(copy)
        raise
    if keep and keep[0].schema != LAKE_TABLES[table]:    # written before a column was added
        return upgrade(table, pa.Table.from_batches(keep))
    return pa.Table.from_batches(keep, schema=LAKE_TABLES[table])


def first_seq(batch: pa.RecordBatch) -> int:
    """The first seq of a written batch (a call's part: its rows' seqs ascend)."""
    return batch.column("seq")[0].as_py()


def read_table(root: str | os.PathLike, table: str, partitions: list[str] | None = None,
               keep: Callable[[pa.Table], pa.Array] | None = None,
               columns: list[str] | None = None, pending: list[int] | None = None
               ) -> pa.Table:
    """One lake table as a pyarrow Table sorted by ``seq`` (empty, with its schema, if absent).

    ``keep(segment) -> boolean mask`` filters each segment as it is read, so a large table never
    has to fit in memory whole before filtering; ``columns`` (which must hold ``seq``) keeps only
    those of each segment, so a reader of a few small columns never copies the token payload.
    ``pending`` gets the first seq of each part of a call not committed when the log was read
    (a call in flight, or one a crash left: see `scan.cut_seq`). Raises LakeDamageError on
    damage."""
    schema = LAKE_TABLES[table]
    log = read_log(root)
    committed = committed_calls(root, log)
    gone = [p for p in missing_segments(root, log) if table_of(p) == table and
            (partitions is None or p.parents[1].name.removeprefix("partition=") in partitions)]
    if gone:
        raise LakeDamageError(gone[0], 0, "the segment is missing (its writer logged it)")
    parts = []
    for path in current_files(root, table, partitions, log):
        t = read_segment(path, committed, pending)
        if t.num_rows and keep is not None:
            t = t.filter(keep(t))
        if t.num_rows:
            t = upgrade(table, t) if t.schema != schema else t
            parts.append(t if columns is None else t.select(columns))
    if not parts:
        empty = schema.empty_table()
        return empty if columns is None else empty.select(columns)
    out = pa.concat_tables(parts)
    return out.take(pc.sort_indices(out, [("seq", "ascending")]))


def stream_max_seq(path: Path) -> int:
    """The highest seq of any complete batch in the file, acknowledged or not, damage ignored."""
    best = -1
    try:
        with pa.memory_map(str(path)) as src:
            reader = pa.ipc.open_stream(src)
            i = reader.schema.get_field_index("seq")
            while True:
                try:
                    batch = reader.read_next_batch()
                except (StopIteration, pa.ArrowInvalid, OSError):
                    break
                if batch.num_rows:
                    best = max(best, int(np.max(batch.column(i).to_numpy(zero_copy_only=False))))
    except (pa.ArrowInvalid, OSError):
        pass
    return best


def highest_seq(root: str | os.PathLike) -> int:
    """The highest `seq` of any complete record batch in any segment of any table, committed or
    not (-1 for an empty lake): a restart must number after it, so no seq of a torn call is
    ever handed out again."""
    log = read_log(root)
    return max((_file_max_seq(p) for t in LAKE_TABLES for p in current_files(root, t, log=log)),
               default=-1)


def _file_max_seq(path: Path) -> int:
    """The highest seq a segment held, read from whichever of its files is there (a job may
    replace the one listed before it is read)."""
    if path.suffix == ".parquet":
        return read_newest(path, _parquet_max_seq)
    best = stream_max_seq(path)
    if path.exists():
        return best
    copy = newest_copy(path)            # compacted since it was listed
    return best if copy is None else max(best, _file_max_seq(copy))


def _parquet_max_seq(path: Path) -> int:
    meta = pq.read_metadata(path)
    kept = (meta.metadata or {}).get(HIGHEST_SEQ_KEY)
    best = -1 if kept is None else int(kept)   # the segment it replaced, torn rows and all
    ranges = seq_ranges(meta)
    if ranges is None:
        seqs = pq.read_table(path, columns=["seq"]).column(0)
        return max(best, int(pc.max(seqs).as_py() or -1))
    return max([best, *(hi for _, hi in ranges)])


def seq_ranges(meta: pq.FileMetaData) -> list[tuple[int, int]] | None:
    """Each row group's (min, max) ``seq`` from a Parquet file's statistics; None when the file
    has no ``seq`` column or a row group has no statistics for it. The column is found by its
    leaf path: list, map and struct columns before it make more leaf columns than fields."""
    leaves = [meta.schema.column(j).path for j in range(meta.num_columns)]
    if "seq" not in leaves:
        return None
    col = leaves.index("seq")
    out = []
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(col).statistics
        if stats is None or not stats.has_min_max:
            return None
        out.append((int(stats.min), int(stats.max)))
    return out
