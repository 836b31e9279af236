"""Deterministic kill points in the lake writer, for crash testing: die exactly where a crash could.

Set ``REPLAYLAKE_KILL_AT=<point>:<occurrence>`` (for example ``trajectories.data_torn:3``) before a
lake is opened, and the process SIGKILLs itself the ``occurrence``-th time (1-based) its lake writer
reaches ``point``: no cleanup runs, exactly as if the machine had killed it there. Points named
``*_torn`` first write half of the bytes that write would have written, leaving a torn tail.

Points (``<t>`` is a lake table, or ``log`` for a writer's log):

- ``<t>.mkdir``        a new partition/window directory was created, the segment not yet
- ``<t>.create``       the segment and its checksum file exist, empty, not yet logged
- ``<t>.dir_synced``   (fsync=True) their directory entries are durable
- ``<t>.data_torn``    half of a write to the stream is in the file
- ``<t>.data_written`` the write is in the file (the OS has it), its checksum record not yet
- ``<t>.data_synced``  (fsync=True) ... and is on disk
- ``<t>.sum_torn``     half of the checksum record is in the checksum file
- ``<t>.sum_written``  the checksum record is written: the write counts
- ``<t>.sum_synced``   (fsync=True) ... and is on disk
- ``<t>.acked``        the whole append (every partition, the commit record) is done

Jobs that rewrite the lake have points too: ``compact.tmp_partial`` (a row group of the temporary
Parquet file written, the file unfinished), ``compact.tmp_written`` (the temporary file complete
and fsync'ed, not renamed), ``compact.renamed`` (the Parquet copy in place, its segment not yet
deleted), ``compact.segment_deleted`` (the segment deleted, its checksum file not yet),
``compact.deleted`` (both deleted); ``retain.tmp_written`` (a rewrite complete and fsync'ed,
not renamed), ``retain.renamed`` (the rewrite in place under its new name, the file it rewrote
not yet deleted), ``retain.deleted`` (that file deleted). A reader has one:
``scan.scratch_written`` (a scratch copy of a open segment written, not yet mapped and unlinked).
A job or a reader arms on its first run in a process (`arm_once`), unless a lake writer armed
first.

``REPLAYLAKE_KILL_HOW`` says what happens at the armed point: ``kill`` (the default: SIGKILL, as
above), ``interrupt`` (the process sends itself SIGINT and carries on, so Python raises
KeyboardInterrupt at its next chance: Ctrl-C landing exactly there; ``*_torn`` points then write
nothing) or ``raise`` (an ``OSError`` is raised right there, after the half write of a ``*_torn``
point: a disk that fails at that step). The interrupt tests use the last two.

``trace()`` lists the points reached so far (with ``REPLAYLAKE_KILL_AT=trace``), which is how a
test learns every point of a workload before killing it at each one. Unset, a point costs one
comparison.
"""
from __future__ import annotations

import errno
import os
import signal

from pipeline.errors import ConfigError

ENV = "REPLAYLAKE_KILL_AT"
HOW_ENV = "REPLAYLAKE_KILL_HOW"
HOWS = ("kill", "interrupt", "raise")

_target: tuple[str, int] | None = None
_tracing = False
_armed = False
_how = "kill"
_counts: dict[str, int] = {}
_trace: list[str] = []


def arm() -> None:
    """Read ``REPLAYLAKE_KILL_AT`` afresh (a lake writer calls this when it opens)."""
    global _target, _tracing, _armed, _how
    _armed = True
    spec = os.environ.get(ENV, "")
    _how = os.environ.get(HOW_ENV, "") or "kill"
    if _how not in HOWS:
        raise ConfigError(f"{HOW_ENV}={_how!r}: expected one of {', '.join(HOWS)}")
    _counts.clear()
    _trace.clear()
    _target, _tracing = None, spec == "trace"
    if spec and not _tracing:
        point, _, occurrence = spec.rpartition(":")
        if not point or not occurrence.isdigit() or int(occurrence) < 1:
            raise ConfigError(f"{ENV}={spec!r}: expected <point>:<occurrence>, occurrence >= 1")
        _target = (point, int(occurrence))


def arm_once() -> None:
    """Arm unless this process armed already (a job's points count on from a writer's)."""
    if not _armed:
        arm()


def trace() -> list[str]:
    """Every point reached since the writer opened (only while tracing)."""
    return list(_trace)


def _due(point: str) -> bool:
    if _tracing:
        _trace.append(point)
        return False
    if _target is None or _target[0] != point:
        return False
    _counts[point] = _counts.get(point, 0) + 1
    return _counts[point] == _target[1]


def _strike(point: str) -> None:
    if _how == "raise":
        raise OSError(errno.EIO, f"injected failure at kill point {point}")
    os.kill(os.getpid(), signal.SIGINT if _how == "interrupt" else signal.SIGKILL)


def hit(point: str) -> None:
    """Die here if this is the armed point and occurrence (or interrupt / raise, see above)."""
    if (_tracing or _target is not None) and _due(point):
        _strike(point)


def torn(point: str, fd: int, data: bytes) -> None:
    """Die here, after writing the first half of ``data`` to ``fd``, if this point is armed."""
    if (_tracing or _target is not None) and _due(point):
        if _how != "interrupt":
            os.write(fd, data[: max(len(data) // 2, 1)])
        _strike(point)
