"""Check a lake for damage: every file the way a restore reads it, and what the files mean together.

`check` reads every stream the way a restore does and lists what it finds: damage (refused by
readers), torn tails (ignored by readers; a crash's leftovers), logged segments that are gone,
segments whose writer's log is gone (`unlogged`), rows of groups whose registration is gone
(`orphans`), segments whose Parquet copy is in place (a compaction's leftovers, not read: readers
count the copy) and Parquet files a newer rewrite replaces (a retention's leftovers, not read
either). `pipeline.lake.recovery` sets the damage aside.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from pipeline.lake import parquet
from pipeline.lake.files import LOG_DIR, SUM_SUFFIX, refused, writer_of
from pipeline.lake.names import newest_copy, superseded
from pipeline.lake.orphans import find_orphans, orphan_damage, salvaged_partitions, summary
from pipeline.lake.read import (
    LakeDamageError,
    log_records,
    missing_segments,
    unlogged_message,
    unlogged_segments,
)
from pipeline.lake.verify import verify
from schemas import LAKE_TABLES

DAMAGE_KINDS = ("damage", "missing", "unlogged", "orphans")


@dataclass(frozen=True)
class Finding:
    """One thing `check` found: ``kind`` is damage | missing | unlogged | orphans (all refused
    by readers) | torn | compacted (a segment whose Parquet copy is in place: a leftover, not
    read) | superseded (a Parquet file a newer rewrite replaces: a leftover, not read)."""

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
    set_aside_rows: int = 0         # salvage: rows of groups whose registration is gone
    quarantined: list[Path] = field(default_factory=list)

    @property
    def damaged(self) -> list[Finding]:
        return [f for f in self.findings if f.kind in DAMAGE_KINDS]


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
        log = log_records(root)
    except LakeDamageError:
        return report                   # a damaged log is already listed above
    for path in missing_segments(root, log):
        report.findings.append(Finding("missing", path, 0, "logged by its writer, now gone"))
    for path in unlogged_segments(root, log):
        report.findings.append(Finding("unlogged", path, 0, unlogged_message(writer_of(path))))
    if not report.damaged:              # what the rows mean together: only over readable files
        tolerated = salvaged_partitions(log)
        for exc in orphan_damage(root, summary(find_orphans(root)), tolerated):
            report.findings.append(Finding("orphans", exc.path, exc.offset, exc.problem))
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
        f = parquet.open_file(path)
        for i in range(f.num_row_groups):
            f.read_row_group(i)
    except (pa.ArrowException, OSError) as exc:
        if not path.exists():
            return                      # gone while it was read (salvage, another job)
        if refused(exc):
            raise                       # unreadable to this user: not damage
        raise LakeDamageError(path, 0, f"the Parquet file cannot be read ({exc})") from exc


def describe(report: Report) -> list[str]:
    """Human-readable lines, one per finding."""
    return [f"{f.kind:>8}  {f.path} @ byte {f.offset}: {f.problem}" for f in report.findings]


__all__ = ["Finding", "Report", "check", "describe", "DAMAGE_KINDS"]
