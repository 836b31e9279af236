"""Real refusals by the operating system, for commands run as child processes: no mock anywhere.

- ``bound_by_permissions()``: the child obeys file mode bits. The tests may run as root, and
  root reads a mode-000 file (CAP_DAC_OVERRIDE); dropping that capability and
  CAP_DAC_READ_SEARCH from the child's bounding set before it runs Python makes the kernel check
  the mode bits for it as for anyone (EACCES), while it stays uid 0 and can still run the venv's
  interpreter. A non-root run needs nothing dropped.
- ``file_size_limit(n)``: the child's writes past ``n`` bytes of any file fail with EFBIG, the
  same refusal a full disk gives (ENOSPC) at the same point of a write.
- ``replaylake(*args, preexec=...)``: `python -m jobs.cli ...` in such a child.
"""
from __future__ import annotations

import ctypes
import os
import resource
import subprocess
import sys
from collections.abc import Callable

from tests.support.lake import ROOT, python_env

_PR_CAPBSET_DROP = 24
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 1, 2


def bound_by_permissions() -> Callable[[], None]:
    """A ``preexec_fn`` after which the child process is refused what mode bits forbid."""
    def drop() -> None:
        if os.geteuid() != 0:
            return
        libc = ctypes.CDLL(None, use_errno=True)
        for cap in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
            if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")
    return drop


def file_size_limit(limit: int) -> Callable[[], None]:
    """A ``preexec_fn`` after which no file of the child can grow past ``limit`` bytes."""
    def limit_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return limit_files


def replaylake(*args: str, preexec: Callable[[], None] | None = None,
               timeout: float = 180) -> subprocess.CompletedProcess:
    """`replaylake ARGS` in a child process (optionally restricted by ``preexec``)."""
    return subprocess.run([sys.executable, "-m", "jobs.cli", *args], cwd=ROOT, env=python_env(),
                          capture_output=True, text=True, timeout=timeout, preexec_fn=preexec)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The single `error:` line a user's mistake prints (exit 2, no traceback); fails otherwise."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]
