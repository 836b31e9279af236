"""Which file holds a segment's rows: the open segment, its Parquet copy, or a newer rewrite.

A segment's rows live in one of a chain of files, all in the segment's directory and named after
its stem ``S`` (`<table>-<first_seq>-<writer>`):

- ``S.arrow``: the open segment (generation -1), with its checksum file;
- ``S.parquet``: the copy `replaylake compact` writes (generation 0);
- ``S.r1.parquet``, ``S.r2.parquet``, ...: the rewrites `replaylake retain` makes of it, each
  from the one before (generations 1, 2, ...).

Why new names and not a rewrite in place: a reader plans over the files it listed and reads them
later (a DuckDB connection reads them at every query). A file replaced under the same name hands
that reader bytes that do not match what it planned over (`Couldn't deserialize thrift`); a new
name leaves the old file whole until it is removed. Every job writes the next generation
completely, renames it into place, and only then removes the one before. So at every instant the
newest generation on disk holds every row of the segment exactly once, and that is the only one
readers count (`current`); one that vanished between a listing and its read is replaced by the
newest one (`newest_copy`). Older generations still on disk are the leftovers of a killed job,
which the next compaction or retention removes.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

ARROW, PARQUET = ".arrow", ".parquet"
_PARQUET_NAME = re.compile(r"^(?P<stem>.+?)(?:\.r(?P<gen>[1-9][0-9]*))?\.parquet$")

T = TypeVar("T")


def stem(path: Path) -> str:
    """The segment a file belongs to (its name without generation and suffix)."""
    if path.name.endswith(ARROW):
        return path.name[: -len(ARROW)]
    m = _PARQUET_NAME.match(path.name)
    return m.group("stem") if m else path.name


def generation(path: Path) -> int:
    """-1 for a open segment, 0 for its compacted copy, k for its k-th rewrite."""
    if path.name.endswith(ARROW):
        return -1
    m = _PARQUET_NAME.match(path.name)
    return int(m.group("gen") or 0) if m else -1


def generation_path(path: Path, gen: int) -> Path:
    """The file of ``path``'s segment at generation ``gen``."""
    s = stem(path)
    name = f"{s}{ARROW}" if gen < 0 else f"{s}{PARQUET}" if gen == 0 else f"{s}.r{gen}{PARQUET}"
    return path.with_name(name)


def next_generation(path: Path) -> Path:
    """Where a rewrite of ``path`` goes: the generation after it."""
    return generation_path(path, generation(path) + 1)


def current(files: list[Path]) -> list[Path]:
    """``files`` without those a newer generation of their segment among them replaces (the
    order kept): the files whose rows count."""
    newest: dict[tuple[Path, str], int] = {}
    for f in files:
        key = (f.parent, stem(f))
        newest[key] = max(newest.get(key, -2), generation(f))
    return [f for f in files if generation(f) == newest[(f.parent, stem(f))]]


def superseded(files: list[Path]) -> list[Path]:
    """The files of ``files`` a newer generation among them replaces (a killed job's leftovers)."""
    keep = set(current(files))
    return [f for f in files if f not in keep]


# How often a segment's directory is listed again when its file is gone and the listing holds no
# copy of it: a directory too large for one read is listed in several, each seeing it at another
# moment, so a listing taken while a job renamed a newer file in and deleted the one before can
# hold neither (seen on ext4 with a few thousand entries). Another listing sees the newer one.
LISTINGS = 10


def newest_copy(path: Path) -> Path | None:
    """The newest Parquet file of ``path``'s segment on disk now; None when there is none."""
    s = stem(path)
    for _ in range(LISTINGS):
        try:
            found = [generation(f) for f in path.parent.glob(f"{s}*{PARQUET}") if stem(f) == s]
        except OSError:
            return None
        if found:
            gen = max(found)
            while generation_path(path, gen + 1).exists():   # renamed in since the listing
                gen += 1
            return generation_path(path, gen)
        if path.exists():
            return None
    return None


def read_newest(path: Path, read: Callable[[Path], T]) -> T:
    """``read(path)``; if ``path`` is gone since it was listed (a job replaced it by a newer
    generation, which it renames into place before removing the old one), ``read`` that."""
    while True:
        try:
            return read(path)
        except FileNotFoundError:
            newer = newest_copy(path)
            if newer is None or generation(newer) <= generation(path):
                raise
            path = newer


__all__ = ["stem", "generation", "generation_path", "next_generation", "current", "superseded",
           "newest_copy", "read_newest", "ARROW", "PARQUET", "LISTINGS"]
