"""Check a lake for damage, and salvage it: set aside what cannot be read, keep every write that can.

`check` reads every stream the way a restore does and lists what it finds: damage (refused by
readers), torn tails (ignored by readers; a crash's leftovers), logged segments that are gone,
segments whose Parquet copy is in place (a compaction's leftovers, not read: readers count the copy)
and Parquet files a newer rewrite replaces (a retention's leftovers, not read either).
`salvage` takes the writer lock, moves each damaged file (and its checksum file) whole into
`_quarantine/<when>/`, and writes back in its place a stream of every write that still verifies
against its own checksum record, with fresh checksums; a segment that is gone gets a `removed`
record in the log, so readers stop asking for it. Nothing is deleted: the quarantine keeps the
original bytes for whoever wants to look.
"""
from __future__ import annotations

import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.lake_files import (
    LOG_DIR,
    LOG_SCHEMA,
    QUARANTINE_DIR,
    SUM_SUFFIX,
    record_for,
    replace_durably,
    sum_path,
    table_of,
    unpack_records,
)
from pipeline.lake_names import generation_path, newest_copy, superseded
from pipeline.lake_read import LakeDamageError, missing_segments
from pipeline.lake_verify import verify
from schemas import LAKE_TABLES


@dataclass(frozen=True)
class Finding:
    """One thing `check` found: ``kind`` is damage | missing | torn | compacted (a segment
    whose Parquet copy is in place: a leftover, not read) | superseded (a Parquet file a newer
    rewrite replaces: a leftover, not read)."""

    kind: str
    path: Path
    offset: int
    problem: str


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    streams: int = 0
    acknowledged_bytes: int = 0
    kept_writes: int = 0            # salvage: writes written back
    lost_writes: int = 0            # salvage: acknowledged writes that did not verify
    quarantined: list[Path] = field(default_factory=list)

    @property
    def damaged(self) -> list[Finding]:
        return [f for f in self.findings if f.kind in ("damage", "missing")]


def _streams(root: Path) -> list[Path]:
    """Every stream of the lake, including those only their checksum file is left of."""
    out: set[Path] = set()
    for base in [*(root / t for t in LAKE_TABLES), root / LOG_DIR]:
        if base.exists():
            out.update(base.rglob("*.arrow"))
            out.update(p.with_name(p.name[: -len(SUM_SUFFIX)]) for p in base.rglob("*.arrow.crc"))
    return sorted(out)


def check(root: str | os.PathLike) -> Report:
    """Every damaged, missing or torn file of the lake (reads only; safe while a buffer writes)."""
    root = Path(root)
    report = Report()
    for path in _streams(root):
        if newest_copy(path) is not None:
            report.findings.append(_leftover(path))
            continue
        report.streams += 1
        try:
            v = verify(path)
        except LakeDamageError as exc:
            if newest_copy(path) is not None:    # compacted (and deleted) while we read it
                report.streams -= 1
                report.findings.append(_leftover(path))
                continue
            report.findings.append(Finding("damage", exc.path, exc.offset, exc.problem))
            continue
        report.acknowledged_bytes += v.size
        if v.torn:
            report.findings.append(Finding("torn", path, v.size,
                                           f"{v.torn} byte(s) of an unacknowledged write "
                                           "(ignored by readers)"))
    for table in LAKE_TABLES:
        files = sorted((root / table).rglob("*.parquet")) if (root / table).exists() else []
        old = set(superseded(files))
        for path in files:
            if path in old:
                report.findings.append(Finding("superseded", path, 0, SUPERSEDED))
                continue
            report.streams += 1
            try:
                _read_row_groups(path)
            except LakeDamageError as exc:
                report.findings.append(Finding("damage", exc.path, exc.offset, exc.problem))
    try:
        gone = missing_segments(root)
    except LakeDamageError:
        gone = []                       # a damaged log is already listed above
    for path in gone:
        report.findings.append(Finding("missing", path, 0, "logged by its writer, now gone"))
    return report


SUPERSEDED = ("a newer rewrite of it is in place (ignored by readers; the next `replaylake "
              "compact` or `retain` deletes it)")


def _leftover(path: Path) -> Finding:
    """A segment (or only its checksum file) whose Parquet copy is in place: a compaction
    renamed the copy into place and had not yet deleted the segment. Readers count the copy
    only, so it is neither read nor damage; the next `replaylake compact` deletes it."""
    return Finding("compacted", path, 0, "its Parquet copy is in place (ignored by readers; "
                                         "the next `replaylake compact` deletes it)")


def _read_row_groups(path: Path) -> None:
    """Decode a compacted file one row group at a time (memory: one row group, not the file);
    raises LakeDamageError if any part of it cannot be read."""
    try:
        f = pq.ParquetFile(path)
        for i in range(f.num_row_groups):
            f.read_row_group(i)
    except (pa.ArrowException, OSError) as exc:
        if not path.exists():
            return                      # gone while it was read (salvage, another job)
        raise LakeDamageError(path, 0, f"the Parquet file cannot be read ({exc})") from exc


def _schema_bytes(schema: pa.Schema) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema):
        pass
    return sink.getvalue().to_pybytes()[:-8]       # without the end-of-stream marker


def _good_writes(path: Path) -> tuple[list[tuple[int, bytes]], int]:
    """(offset, bytes) of every acknowledged write that verifies on its own, and how many did not."""
    try:
        records = unpack_records(sum_path(path).read_bytes())
        data = path.read_bytes()
    except FileNotFoundError:
        return [], 0
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
    return good, lost


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


def salvage(root: str | os.PathLike) -> Report:
    """Quarantine every damaged file and write back what verifies (takes the writer lock)."""
    from pipeline.lake import LakeWriter
    root = Path(root)
    report = check(root)
    damaged = sorted({f.path.with_name(f.path.name.removesuffix(SUM_SUFFIX))
                      for f in report.findings if f.kind == "damage"})
    gone = [f.path for f in report.findings if f.kind == "missing"]
    if not damaged and not gone:
        return report
    writer = LakeWriter(root)          # the lock: no buffer may write while files move
    try:
        qdir = root / QUARANTINE_DIR / f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
        for path in [p for p in damaged if p.suffix == ".parquet"]:
            damaged.remove(path)       # nothing in it can be verified apart: set aside whole
            dest = qdir / path.relative_to(root)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(path, dest)
            report.quarantined.append(dest)
            report.lost_writes += 1
            gone += [path, generation_path(path, -1)]   # and the segment it was compacted from
        for path in damaged:
            good, lost = _good_writes(path)
            stream, dropped = _rebuilt(path, good)
            report.kept_writes += len(good) - dropped
            report.lost_writes += lost + dropped
            for f in (path, sum_path(path)):
                if f.exists():
                    dest = qdir / f.relative_to(root)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.move(f, dest)
                    report.quarantined.append(dest)
            if len(good) > dropped:
                _write_stream(path, stream)
            elif path.parent.name != LOG_DIR:
                gone.append(path)      # nothing of it is left: readers must not ask for it
        if gone:
            writer.record_removed([str(p.relative_to(root)) for p in gone])
    finally:
        writer.close()
    return report


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


def describe(report: Report) -> list[str]:
    """Human-readable lines, one per finding."""
    return [f"{f.kind:>7}  {f.path} @ byte {f.offset}: {f.problem}" for f in report.findings]


__all__ = ["Finding", "Report", "check", "salvage", "describe"]
