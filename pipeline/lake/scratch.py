"""Scratch directories of lake readers: named after their process, removed when it is gone.

Why: SQL over open segments copies each segment's committed rows into a scratch file
(`lake.scan`), which can add up to the size of the live lake. The scan maps each file and
unlinks it at once (the mapping stays readable, and the kernel frees the pages when the last
mapping goes), so a reader that has connected holds nothing on disk. But a reader stopped while it
connects (SIGTERM from `timeout` or systemd, SIGHUP from a closed terminal, SIGKILL) runs no
cleanup, and leaves the files it was writing. So each scan's directory is named
`replaylake-scan-<host>.<pid>.<start>-<random>`: the process that made it, with the time that
process started (a pid that is reused names another start). Every new scan first removes the
directories in its scratch root whose process is gone, if this user owns them and they were made
on this host.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path

PREFIX = "replaylake-scan-"
_NAME = re.compile(rf"^{PREFIX}(?P<host>[0-9a-f]{{8}})\.(?P<pid>\d+)\.(?P<start>\d+)-")


def _host() -> str:
    return hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]


def started(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot; 0 where that cannot be read), or
    None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():
            return None                     # Linux, and no such process
    except (OSError, ValueError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return 0


def sweep(root: Path) -> list[Path]:
    """Remove the scratch directories under ``root`` whose process is gone; the ones removed."""
    host, out = _host(), []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return out
    for entry in entries:
        m = _NAME.match(entry.name)
        if m is None or m.group("host") != host:
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or \
                    entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
        except OSError:
            continue
        if started(int(m.group("pid"))) != int(m.group("start")):
            shutil.rmtree(entry.path, ignore_errors=True)
            out.append(Path(entry.path))
    return out


def prefix(pid: int, start: int) -> str:
    """How the scratch directories of process ``pid``, started at ``start``, begin."""
    return f"{PREFIX}{_host()}.{pid}.{start}-"


def make(root: str | os.PathLike | None = None) -> Path:
    """A fresh scratch directory for this process under ``root`` (the system's temporary
    directory by default), after sweeping the ones dead readers left there."""
    base = Path(root) if root is not None else Path(tempfile.gettempdir())
    sweep(base)
    pid = os.getpid()
    return Path(tempfile.mkdtemp(prefix=prefix(pid, started(pid) or 0), dir=base))


__all__ = ["make", "sweep", "started", "prefix", "PREFIX"]
