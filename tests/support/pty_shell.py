"""The SQL shell on a real terminal (a pty), for the tests that type into it as a person would."""
from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.lake import ROOT

PROMPT = b"replaylake> "


def read_until(fd: int, marker: bytes, limit_s: float = 60) -> bytes:
    """What the terminal shows until ``marker`` (or ``limit_s`` seconds)."""
    got = b""
    end = time.monotonic() + limit_s
    while marker not in got and time.monotonic() < end:
        ready, _, _ = select.select([fd], [], [], 1)
        if ready:
            try:
                got += os.read(fd, 4096)
            except OSError:
                break
    return got


@contextmanager
def shell_on_a_terminal(lake: Path, history: Path) -> Iterator[Callable[[bytes, bytes], bytes]]:
    """`replaylake sql --lake LAKE` on a pty, its history in ``history``: yields
    ``type(line, until)``, which types a line and returns what the terminal shows until
    ``until``. The first prompt is awaited first; leaving the block types `.quit` and checks the
    shell ended with exit 0."""
    main, child = pty.openpty()
    env = {**os.environ, "REPLAYLAKE_SQL_HISTORY": str(history), "COLUMNS": "80"}
    proc = subprocess.Popen([sys.executable, "-m", "jobs.cli", "sql", "--lake", str(lake)],
                            stdin=child, stdout=child, stderr=child, cwd=ROOT, env=env)
    os.close(child)

    def type_line(line: bytes, until: bytes = PROMPT) -> bytes:
        os.write(main, line + b"\n")
        return read_until(main, until)

    try:
        assert PROMPT in read_until(main, PROMPT)
        yield type_line
        os.write(main, b".quit\n")
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(main)
