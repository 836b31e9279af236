"""Record the file-system system calls of a program with strace, decoded, in the order they ran.

Why strace and not a hook in Python: compaction and retention write Parquet through pyarrow's C++
writer, and the lake writer's bytes go out through `os.write`; only the system calls see every
byte that reaches the kernel, whoever wrote it. strace runs with ``-xx`` (every string, path or
data, printed as ``\\xNN`` escapes: a string can never hold a quote, a comma or a bracket that
would confuse the parser), ``-y`` (every descriptor printed with the path it is open on, and
``AT_FDCWD`` with the working directory) and a string limit far above any write of the workloads
(a write cut by the limit is refused, never half-read). Calls interrupted by another thread
(``<unfinished ...>`` and ``<... resumed>``) are joined again; a call counts where it returned.

``require_strace()`` names the fix when strace is missing: the suite depends on it, so it fails
rather than skips (`make venv` installs it with apt-get when run as root).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

MAX_BYTES = 1 << 24         # strace's string limit: any longer write would be printed cut short
TRACED = ("openat,open,creat,write,pwrite64,writev,pwritev,pwritev2,lseek,fsync,fdatasync,"
          "sync,syncfs,rename,renameat,renameat2,unlink,unlinkat,mkdir,mkdirat,rmdir,ftruncate,"
          "truncate,close,dup,dup2,dup3,fcntl,clone,clone3,fork,vfork,chdir,fchdir,link,linkat,"
          "symlink,symlinkat,fallocate,copy_file_range,sendfile,splice,mmap")

_LINE = re.compile(r"^(?:\[pid\s+(\d+)\]|(\d+))\s+(.*)$")     # "[pid N] ..." on a terminal
_CALL = re.compile(r"^(\w+)\((.*)$")
_RESUMED = re.compile(r"^<\.\.\. (\w+) resumed>(.*)$")
_END = re.compile(r"^(.*)\)\s+=\s+(.*)$")     # greedy: the last ") = " (strings are hex)
_FD = re.compile(r"^(-?\d+|AT_FDCWD)<((?:\\x[0-9a-f]{2})*)>$")
_STR = re.compile(r'"((?:\\x[0-9a-f]{2})*)"')


@dataclass(frozen=True)
class Fd:
    """A descriptor argument: its number (None for AT_FDCWD) and the path strace showed for it."""

    num: int | None
    path: str


@dataclass(frozen=True)
class Call:
    """One completed system call: ``args`` decoded (bytes for strings, Fd, int, or the raw text
    of flags and structures), ``ret`` its result (an Fd for a call that returns a descriptor)."""

    line: int
    tid: int
    name: str
    args: tuple
    ret: int | Fd


def require_strace() -> str:
    """strace's path; fails (never skips) naming how to install it."""
    path = shutil.which("strace")
    if path is None:
        pytest.fail("strace is needed to record the system calls of a workload: install it "
                    "(`apt-get install strace`; `make venv` does it when run as root)")
    return path


def record(argv: Sequence[str], trace: Path, *, cwd: Path, env: dict[str, str],
           timeout: float) -> list[Call]:
    """Run ``argv`` under strace (following every thread) and return its calls, decoded."""
    cmd = [require_strace(), "-f", "-qq", "-y", "-xx", "-s", str(MAX_BYTES), "-e", "abbrev=none",
           "-e", f"trace={TRACED}", "-o", str(trace), *argv]
    proc = subprocess.run(cmd, cwd=cwd, env=env, timeout=timeout, capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {proc.returncode} under strace:\n"
                             f"{proc.stderr[-4000:]}")
    return parse(trace.read_text())


def unhex(text: str) -> bytes:
    return bytes.fromhex(text.replace("\\x", ""))


def parse(text: str) -> list[Call]:
    """Every completed call of a strace log (failed ones included: ``ret`` < 0)."""
    out: list[Call] = []
    pending: dict[int, tuple[str, str]] = {}      # tid -> (name, text before the interruption)
    for n, line in enumerate(text.splitlines(), 1):
        m = _LINE.match(line)
        if m is None:
            raise ValueError(f"strace line {n} has no thread id: {line[:200]}")
        tid, rest = int(m[1] or m[2]), m[3]
        if rest.startswith(("+++", "---")):          # an exit or a signal
            continue
        if rest.endswith(" <unfinished ...>"):
            c = _CALL.match(rest)
            if c is None:
                raise ValueError(f"strace line {n}: unreadable call {rest[:200]}")
            pending[tid] = (c[1], c[2][: -len(" <unfinished ...>")])
            continue
        r = _RESUMED.match(rest)
        if r is not None:
            name, head = pending.pop(tid)
            if name != r[1]:
                raise ValueError(f"strace line {n}: {r[1]} resumed where {name} was cut")
            body = head + r[2]
        else:
            c = _CALL.match(rest)
            if c is None:
                raise ValueError(f"strace line {n}: unreadable call {rest[:200]}")
            name, body = c[1], c[2]
        end = _END.match(body)
        if end is None:
            raise ValueError(f"strace line {n}: no result in {rest[:200]}")
        args, ret = end[1], end[2]
        if ret.startswith("?"):                  # the process ended inside the call
            continue
        out.append(Call(n, tid, name, tuple(_arg(a) for a in _split(args)), _result(ret, n)))
    return out


def _result(text: str, n: int) -> int | Fd:
    head = text.split()[0] if text.split() else ""
    fd = _FD.match(head)
    if fd is not None:
        return Fd(int(fd[1]), os.fsdecode(unhex(fd[2])))
    try:
        return int(head, 0)
    except ValueError:
        raise ValueError(f"strace line {n}: unreadable result {text[:100]!r}") from None


def _split(args: str) -> list[str]:
    """The top-level arguments (structures and arrays stay whole)."""
    out, depth, start, quoted = [], 0, 0, False
    for i, ch in enumerate(args):
        if ch == '"':
            quoted = not quoted
        elif quoted:
            continue
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(args[start:i].strip())
            start = i + 1
    if args.strip():
        out.append(args[start:].strip())
    return out


def _arg(text: str) -> object:
    if text.startswith('"'):
        if not text.endswith('"'):
            raise ValueError(f"a string argument was cut short by strace's limit: {text[-40:]}")
        return unhex(text[1:-1])
    fd = _FD.match(text)
    if fd is not None:
        return Fd(None if fd[1] == "AT_FDCWD" else int(fd[1]), os.fsdecode(unhex(fd[2])))
    try:
        return int(text, 0)
    except ValueError:
        return text


def iovec_bytes(arg: str) -> bytes:
    """The bytes of a writev-style iovec array argument, in order."""
    if '"...' in arg:
        raise ValueError("an iovec was cut short by strace's limit")
    return b"".join(unhex(s) for s in _STR.findall(arg))
