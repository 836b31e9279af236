"""One writer per lake: an exclusive `flock` on `<lake>/_writer.lock` and on the lake directory
itself, held while a writer is open (the directory's lock stands even if the file is deleted).

Two writers on one lake would hand out the same seq numbers and interleave their history, so the
second opener is refused, in another process or in the same one (each opener opens the file anew,
and `flock` locks of two open files conflict even within one process). The lock file holds a
record of the holder (pid, host, since when) so the refusal can name it.

The kernel drops the lock when its holder dies, however it dies, so a lock left by a killed
process is never in the way: the next opener takes it and reports the dead holder it replaced.
Readers (restore of a copy, analysis, audits, export) never take the lock. `flock` is advisory
and local: on a network file system it may not exclude a writer on another host.
"""
from __future__ import annotations

import fcntl
import io
import json
import logging
import os
import socket
import time
import weakref
from pathlib import Path

from pipeline.errors import LakeError
from pipeline.lake.files import LOCK_NAME
from pipeline.lake.identity import require_new_or_lake

log = logging.getLogger("replaylake")
_HELD: weakref.WeakSet[LakeLock] = weakref.WeakSet()


def _close_in_child() -> None:
    # a forked child shares the parent's open lock file; closing its copy keeps a long-lived child
    # from holding the lake after the parent has gone (the parent's copy still holds it)
    for lock in list(_HELD):
        lock._forget()


os.register_at_fork(after_in_child=_close_in_child)


def _describe(raw: bytes) -> str:
    try:
        rec = json.loads(raw.decode())
        return f"pid {rec['pid']} on {rec['host']} since {rec['since']}"
    except (ValueError, KeyError, TypeError):
        return "a writer whose holder record is not written yet"


def _refusal(root: Path, holder: str, path: Path) -> str:
    return (f"the lake {root} is already open for writing by {holder} (lock file {path}); one "
            "writer per lake: close that buffer first (readers need no lock)")


def _lock_dir(root: Path, path: Path) -> int | None:
    """Lock the lake directory itself, beside its lock file: a lock file deleted while its
    writer holds it (by hand, or a cleanup job) must not let a second writer in, and the
    directory cannot go while the lake is in it. Returns its descriptor (held with the lock),
    or None where the file system cannot lock a directory (NFS emulates `flock` with byte-range
    locks, which refuse a read-only descriptor): the lock file alone guards the lake there."""
    try:
        d = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        log.debug("lake %s: its directory cannot be opened to lock it (%s): the lock file "
                  "alone guards it", root, exc)
        return None
    try:
        fcntl.flock(d, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(d)
        try:
            holder = _describe(path.read_bytes())
        except FileNotFoundError:
            holder = "a writer whose lock file was deleted while it held the lake"
        except OSError:
            holder = "a writer whose holder record cannot be read"
        raise LakeError(_refusal(root, holder, path)) from None
    except OSError as exc:
        os.close(d)
        log.debug("lake %s: its directory cannot be locked (%s): the lock file alone guards it",
                  root, exc)
        return None
    return d


class LakeLock:
    """The writer lock of one lake; ``release()`` (or the holder's exit) gives it up."""

    def __init__(self, root: Path):
        require_new_or_lake(root)           # the lock is a writer's first file: never among others'
        self.path = root / LOCK_NAME
        self.previous: str | None = None    # the dead holder this lock was taken over from
        self._dir: int | None = _lock_dir(root, self.path)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            self._close_dir()
            raise LakeError(f"cannot open the lake lock {self.path}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(os.pread(fd, 4096, 0))
            os.close(fd)
            self._close_dir()
            raise LakeError(_refusal(root, holder, self.path)) from None
        except OSError as exc:
            os.close(fd)
            self._close_dir()
            raise LakeError(f"cannot lock the lake {root} ({self.path}): {exc}") from exc
        # a file object, so a lock whose owner is dropped without release() still closes
        self._file: io.FileIO | None = io.FileIO(fd, "r+")
        old = os.pread(fd, 4096, 0)
        if old:
            self.previous = _describe(old)
            log.warning("lake %s: took over the writer lock of %s, which is gone", root,
                        self.previous)
        rec = {"pid": os.getpid(), "host": socket.gethostname(),
               "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(rec).encode(), 0)
        _HELD.add(self)

    def _close_dir(self) -> None:
        d, self._dir = self._dir, None
        if d is not None:
            os.close(d)

    @property
    def held(self) -> bool:
        return self._file is not None

    def release(self) -> None:
        """Clear the holder record and unlock (idempotent)."""
        f, self._file = self._file, None
        if f is None:
            return
        _HELD.discard(self)
        try:
            os.ftruncate(f.fileno(), 0)
        finally:
            f.close()         # closing the last descriptor of the open file drops the flock
            self._close_dir()

    def _forget(self) -> None:
        f, self._file = self._file, None
        if f is not None:
            f.close()
        self._close_dir()
