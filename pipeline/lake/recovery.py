"""Salvage a damaged lake: set aside what cannot be read, keep every write that can.

`salvage` needs the lake closed: it takes the writer lock before it looks at anything, so it is
refused (naming the holder) while a buffer has the lake open, damaged or not. Then it moves each
damaged file (and its checksum file) whole into `_quarantine/<when>/` and writes back in its
place a stream of every write that still verifies against its own checksum record, with fresh
checksums. Nothing is deleted: the quarantine keeps the original bytes for whoever wants to look.

Everything it takes away is named in its log (`removed` records), so readers stop asking for it
and know what was lost: a segment that is gone, the quarantined original of a rewritten file, a
writer's log that is gone (that writer's multi-partition calls then read as never committed), and
the rows of groups whose registration is gone (listed in `orphans.json` in the quarantine). A
restore then skips those rows with a warning, and the audits list what is missing.
"""
from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.lake.damage import Report, check
from pipeline.lake.files import (
    CALL_KEY,
    LOG_DIR,
    LOG_SCHEMA,
    QUARANTINE_DIR,
    SUM_SUFFIX,
    fsync_dir,
    mkdir_durably,
    record_for,
    replace_durably,
    sum_path,
    table_of,
    unpack_records,
    writer_of,
)
from pipeline.lake.frames import RECORD_BATCH, frames
from pipeline.lake.names import generation_path
from pipeline.lake.orphans import find_orphans, orphan_damage, salvaged_partitions, summary
from pipeline.lake.read import batches, log_records
from schemas import LAKE_TABLES


def salvage(root: str | os.PathLike) -> Report:
    """Quarantine every damaged file and write back what verifies (see the module doc)."""
    from pipeline.lake.writer import LakeWriter
    root = Path(root)
    # the lock first: no buffer may write while files move; fsync, so that what salvage records
    # (and the moves below) survive a power loss right after it
    writer = LakeWriter(root, fsync=True)
    try:
        report = check(root)
        if not report.damaged:
            return report
        qdir = root / QUARANTINE_DIR / f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
        removed = _set_aside(root, report, qdir)
        removed += _forget_logs(report)
        if removed:
            writer.record_removed(removed)
        orphans = _set_aside_orphans(root, report, qdir)
        if orphans:
            writer.record_removed(orphans)
        _record_gaps(root, writer)
    finally:
        writer.close()
    return report


def _record_gaps(root: Path, writer: Any) -> None:
    """Log every seq no row of the salvaged lake holds (the lost writes', a torn call's) as
    burnt: salvage holds the lake, so no such gap is a write in flight, and readers must not cut
    the acknowledged history after it (see `lake.scan.cut_seq`)."""
    from pipeline.lake.read import burnt_ranges, highest_seq, read_log, read_table
    seqs = np.unique(np.concatenate([read_table(root, t, columns=["seq"]).column("seq").to_numpy()
                                     for t in LAKE_TABLES]))
    top = highest_seq(root)
    known = burnt_ranges(read_log(root))
    edges = np.concatenate([[-1], seqs, [max(top, int(seqs.max(initial=-1))) + 1]])
    for a, b in zip(edges[:-1].tolist(), edges[1:].tolist()):
        if b - a > 1 and not any(x <= a + 1 and b - 1 <= y for x, y in known):
            writer.record_burnt(a + 1, b - 1)


def _set_aside(root: Path, report: Report, qdir: Path) -> list[str]:
    """Quarantine damaged files, rewrite what verifies; the paths to record as removed."""
    damaged = sorted({f.path.with_name(f.path.name.removesuffix(SUM_SUFFIX))
                      for f in report.findings if f.kind == "damage"})
    gone = [f.path for f in report.findings if f.kind == "missing"]
    moved: list[Path] = []
    for path in [p for p in damaged if p.suffix == ".parquet"]:
        damaged.remove(path)           # nothing in it can be verified apart: set aside whole
        moved += _quarantine(root, [path], qdir, report)
        report.lost_writes += 1
        gone += [path, generation_path(path, -1)]    # and the segment it was compacted from
    for path in damaged:
        good, lost = _good_writes(path)
        stream, dropped = _rebuilt(path, good)
        report.kept_writes += len(good) - dropped
        report.lost_writes += lost + dropped
        moved += _quarantine(root, [path, sum_path(path)], qdir, report)
        if len(good) > dropped:
            _write_stream(path, stream)
        else:
            gone.append(path)          # nothing of it is left: readers must not ask for it
    return [str(p.relative_to(root)) for p in [*gone, *moved]]


def _quarantine(root: Path, files: list[Path], qdir: Path, report: Report) -> list[Path]:
    """Move ``files`` (those that exist) into the quarantine; where each went."""
    out = []
    for f in files:
        if f.exists():
            dest = qdir / f.relative_to(root)
            mkdir_durably(dest.parent)
            shutil.move(f, dest)
            fsync_dir(dest.parent)     # the move is durable in both directories
            fsync_dir(f.parent)
            report.quarantined.append(dest)
            if f.suffix != SUM_SUFFIX:
                out.append(dest)
    return out


def _forget_logs(report: Report) -> list[str]:
    """For each writer whose log is gone: a `removed` record of its log, so readers read its
    multi-partition calls as never committed; those batches are counted as lost."""
    segments: dict[str, list[Path]] = {}
    for f in report.findings:
        if f.kind == "unlogged":
            segments.setdefault(writer_of(f.path), []).append(f.path)
    for paths in segments.values():
        report.lost_writes += sum(CALL_KEY in (meta or {}) for p in paths for _, meta in batches(p))
    return [f"{LOG_DIR}/log-{w}" for w in sorted(segments)]


def _set_aside_orphans(root: Path, report: Report, qdir: Path) -> list[str]:
    """List the rows of groups whose registration is gone (in partitions no salvage has set
    group events aside in yet) in the quarantine's `orphans.json` of their partition; the paths
    to record as removed."""
    found = find_orphans(root)
    out = []
    for exc in orphan_damage(root, summary(found), salvaged_partitions(log_records(root))):
        part = exc.path.name.removeprefix("partition=")
        rows = {n: t.filter(pc.equal(t.column("partition"), part)).select(
            ["uid", "seq"]).to_pylist() for n, t in found.items()}
        listing = qdir / "group_events" / exc.path.name / "orphans.json"
        listing.parent.mkdir(parents=True, exist_ok=True)
        listing.write_text(json.dumps({"partition": part, "rows": rows}, indent=1))
        report.set_aside_rows += sum(len(r) for r in rows.values())
        report.quarantined.append(listing)
        out.append(str(listing.relative_to(root)))
    return out


def _schema_bytes(schema: pa.Schema) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema):
        pass
    return sink.getvalue().to_pybytes()[:-8]       # without the end-of-stream marker


def _good_writes(path: Path) -> tuple[list[tuple[int, bytes]], int]:
    """(offset, bytes) of every acknowledged write that verifies on its own, and how many were
    lost: writes that did not verify, and the record batches past the last record that no
    crash can leave (records lost: a torn tail is at most one write, and is not counted)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:           # only its checksum file: each record was one write
        try:
            return [], len(unpack_records(sum_path(path).read_bytes()))
        except FileNotFoundError:
            return [], 0
    try:
        records = unpack_records(sum_path(path).read_bytes())
    except FileNotFoundError:           # no write of it can be verified: every one is lost
        return [], _record_batches(path, 0)
    good, lost, start = [], 0, 0
    for rec in records:
        if rec is None:                 # its end is unknown, so the next write's start is too
            lost, start = lost + 1, -1
            continue
        end = rec.end
        if 0 <= start < end <= len(data) and rec.matches(data[start:end]):
            good.append((start, data[start:end]))
        else:
            lost += 1
        start = end
    return good, lost + _unrecorded_batches(path, start)


def _unrecorded_batches(path: Path, start: int) -> int:
    """The record batches in the bytes past the last record, when they are more than one write."""
    if start < 0:
        return 0
    with open(path, "rb") as f:
        found = frames(f.fileno(), start, os.fstat(f.fileno()).st_size)
    return found.kinds.count(RECORD_BATCH) if found.writes() > 1 else 0


def _record_batches(path: Path, start: int) -> int:
    """The whole record batches in the bytes of ``path`` from ``start``."""
    with open(path, "rb") as f:
        return frames(f.fileno(), start, os.fstat(f.fileno()).st_size).kinds.count(RECORD_BATCH)


def _rebuilt(path: Path, good: list[tuple[int, bytes]]) -> tuple[list[bytes], int]:
    """The verified writes as a stream of their own, and how many were dropped. A stream's first
    write carries its schema; if that write was lost a fresh schema message leads. A write that
    verifies but does not parse (never seen; a bug) is dropped too."""
    schema = LOG_SCHEMA if path.parent.name == LOG_DIR else LAKE_TABLES[table_of(path)]
    head = _schema_bytes(schema)
    out: list[bytes] = [] if good and good[0][0] == 0 else [head]
    dropped = 0
    for start, w in good:
        try:
            pa.ipc.open_stream(pa.py_buffer(w if start == 0 else head + w)).read_all()
        except pa.ArrowInvalid:
            dropped += 1
            continue
        out.append(w)
    return out, dropped


def _write_stream(path: Path, writes: list[bytes]) -> None:
    """A new stream and checksum file holding exactly ``writes``, made durable."""
    sums, end = [], 0
    for w in writes:
        end += len(w)
        sums.append(record_for(end, w))
    for target, data in ((sum_path(path), b"".join(sums)), (path, b"".join(writes))):
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_bytes(data)
        replace_durably(tmp, target)


__all__ = ["salvage"]
