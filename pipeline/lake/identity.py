"""What makes a directory a replaylake lake, checked once for every reader and for the writer.

Why: every reader treats a missing table as empty, so a path that is not a lake at all (the run
directory instead of its `lake/`, a typo that happens to exist) would read as a lake that holds
nothing: an audit passes, a check finds no damage, a query counts 0, for ever. So each command and
API entry that reads a lake first asks `require_lake`, which refuses such a path naming what it
looked for and the lake it may have meant; and a writer opening a directory asks `require_new_or_lake`,
so it never scatters its files among someone else's.

A directory is a lake when it holds one of the files the writer makes before anything else, or a
table directory. The writer takes its lock first (`_writer.lock`) and records its configuration
right after (`_config.json`), so a buffer that has written nothing yet has made a lake already;
each writer's log (`_log/`) comes with its first write; a table directory (`trajectories/`, ...)
holding `partition=<id>` directories is the data itself, which a lake copied without its
`_`-prefixed files (some sync tools skip them) still has. An empty directory is not a lake: no
buffer ever opened it.

A lake also says which layout it is written in: `_config.json`'s ``format`` (absent: 1). Format 2
(replaylake from 2026-12 on) may hold null rewards, and calls committed across several tables at
once (the writer of 2026-12-06 named them all in one commit record, which a replaylake that
reads format 1 only takes for a call never committed; later writers write one record per
table). `require_format` (asked by `require_lake`, `require_new_or_lake` and every read of the
lake's log, so by every reader) refuses a lake of a format newer than this replaylake reads
(`LAKE_FORMAT`), naming the version that wrote it, rather than misread it; a buffer that opens a
lake records the format it writes.
"""
from __future__ import annotations

import difflib
import json
import os
from pathlib import Path
from typing import Any

from pipeline.errors import LakeError
from pipeline.lake.files import LOCK_NAME, LOG_DIR
from schemas import LAKE_TABLES

CONFIG_NAME = "_config.json"          # pipeline.lake.config.FILE (that module imports the config)
MARKER_FILES = (CONFIG_NAME, LOCK_NAME)
MARKER_DIRS = (LOG_DIR,)
LAKE_FORMAT = 2                       # the newest layout this replaylake reads and writes
_SHOWN = 3                            # lakes suggested at most


def expected() -> str:
    """What a lake directory holds, in words (error messages name it)."""
    tables = ", ".join(f"{t}/" for t in LAKE_TABLES)
    return f"no {', '.join(MARKER_FILES)}, {LOG_DIR}/ or table directory ({tables})"


def is_lake(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a directory a lake writer made (see the module doc)."""
    root = Path(path)
    if not root.is_dir():
        return False
    if any((root / name).is_file() for name in MARKER_FILES):
        return True
    if any((root / name).is_dir() for name in MARKER_DIRS):
        return True
    return any(next((root / t).glob("partition=*"), None) is not None
               for t in LAKE_TABLES if (root / t).is_dir())


def _lakes_in(directory: Path) -> list[Path]:
    """The lakes directly under ``directory``, one named `lake` first."""
    try:
        children = sorted((p for p in directory.iterdir() if p.is_dir()),
                          key=lambda p: (p.name != "lake", p.name))
    except OSError:
        return []
    return [p for p in children if is_lake(p)][:_SHOWN]


def _suggestion(found: list[Path]) -> str:
    return f"; did you mean {' or '.join(map(str, found))}?" if found else ""


def _near(root: Path) -> list[Path]:
    """The lakes a user naming ``root`` may have meant: those inside it, else the one it is in
    (a table directory named instead of its lake)."""
    inside = _lakes_in(root)
    if inside:
        return inside
    return [root.parent] if root.parent != root and is_lake(root.parent) else []


def require_lake(path: str | os.PathLike) -> Path:
    """``path`` as a Path when it is a lake; else a `LakeError` saying what it is instead and
    which lake nearby was probably meant. Call it before reading anything of a lake."""
    root = Path(path)
    if not root.exists():
        near = [root.parent] if is_lake(root.parent) else [
            p for p in _lakes_in(root.parent)
            if difflib.get_close_matches(root.name, [p.name], n=1, cutoff=0.6)]
        raise LakeError(f"no lake at {root}: no such directory{_suggestion(near)}")
    if not root.is_dir():
        raise LakeError(f"{root} is a file, not a lake directory")
    if not is_lake(root):
        empty = not any(root.iterdir())
        what = "an empty directory" if empty else expected()
        raise LakeError(f"{root} is not a replaylake lake: {what}{_suggestion(_near(root))}")
    require_format(root)
    return root


def recorded_format(record: Any) -> int:
    """The lake format a parsed `_config.json` records (1 when it records none)."""
    fmt = record.get("format", 1) if isinstance(record, dict) else 1
    return fmt if isinstance(fmt, int) and not isinstance(fmt, bool) else 1


def require_format(root: str | os.PathLike) -> None:
    """Refuse a lake written in a newer format than `LAKE_FORMAT`. A `_config.json` that is
    missing or does not parse says nothing here (the commands that read the configuration refuse
    a malformed one themselves)."""
    try:
        record = json.loads((Path(root) / CONFIG_NAME).read_text())
    except (OSError, ValueError):
        return
    fmt = recorded_format(record)
    if fmt <= LAKE_FORMAT:
        return
    versions = record.get("versions") if isinstance(record, dict) else None
    last = versions[-1] if isinstance(versions, list) and versions else None
    by = last.get("replaylake") if isinstance(last, dict) else None
    raise LakeError(f"{root} is written in lake format {fmt}"
                    f"{f' (by replaylake {by})' if by else ''}, newer than this replaylake "
                    f"reads (format {LAKE_FORMAT} at most): read and write it with that "
                    "replaylake or a newer one (pip install -U replaylake); this one would "
                    "misread it")


def require_new_or_lake(path: str | os.PathLike) -> None:
    """Refuse to open a lake writer in a directory that holds files but is not a lake: the
    writer would put its lock, configuration and tables among them. A missing or empty directory
    becomes a new lake; a lake is reopened."""
    root = Path(path)
    if not root.is_dir() or not any(root.iterdir()):
        return
    if is_lake(root):
        require_format(root)
        return
    raise LakeError(f"{root} holds files but is not a replaylake lake ({expected()}); a new "
                    f"lake needs a new or empty directory, e.g. {root / 'lake'}"
                    f"{_suggestion(_near(root))}")


__all__ = ["is_lake", "require_lake", "require_new_or_lake", "expected", "recorded_format",
           "require_format",
           "LAKE_FORMAT", "MARKER_FILES", "MARKER_DIRS"]
