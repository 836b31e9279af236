"""The programs the power-loss tests record under strace: ``python -m tests.support.power_loss_runs``.

- ``ingest LAKE OUT FSYNC``: the crash matrix's async workload (`jobs.dev.crash_workload`: ingest
  across two partitions, status changes, samples that evict and refill, releases, a batch held
  across steps). After each acknowledged call it writes a marker naming the call (see
  `disk_calls.ACK`) and records what a restart must reproduce from then on: the highest seq
  visible and the buffer's live state. OUT gets those records (a pickle) at the end.
- ``compact LAKE`` and ``retain LAKE OLDER_THAN``: the jobs, then one marker when they return.

A call's name is that of the outermost buffer method running (a refill inside `sample` is part
of the sample).
"""
from __future__ import annotations

import functools
import os
import pickle
import sys
from pathlib import Path
from typing import Any

from tests.support.disk_calls import ACK, MARKER_FILE

SEED = 0
KIND = "async"
CALLS = ("register", "update_status", "put", "sample", "release")


class _Marker:
    def __init__(self) -> None:
        self.fd = os.open(MARKER_FILE, os.O_WRONLY | os.O_CLOEXEC)
        self.depth = 0
        self.last = ""

    def ack(self, name: str) -> None:
        os.write(self.fd, ACK + name.encode() + b"\n")

    def wrap(self, cls: type) -> None:
        """Remember the outermost of ``CALLS`` that ran on ``cls`` (see the module doc)."""
        for name in CALLS:
            method = getattr(cls, name)

            @functools.wraps(method)
            def outer(buf: Any, *a: Any, _name: str = name, _m: Any = method, **kw: Any) -> Any:
                self.depth += 1
                try:
                    return _m(buf, *a, **kw)
                finally:
                    self.depth -= 1
                    if self.depth == 0:
                        self.last = _name

            setattr(cls, name, outer)


def ingest(lake: Path, out: Path, fsync: bool) -> None:
    from jobs.dev.crash_workload import history, state, workload
    from pipeline import ReplayBuffer
    marker = _Marker()
    marker.wrap(ReplayBuffer)
    rec: dict[str, list] = {"names": [], "acked": [-1], "states": [{}]}

    def mark(buf: Any) -> None:
        marker.ack(marker.last)
        rec["names"].append(marker.last)
        rec["acked"].append(max((s for s, _, _ in history(lake)), default=-1))
        rec["states"].append(state(buf))

    workload(KIND, lake, fsync, SEED, mark)
    out.write_bytes(pickle.dumps(rec))


def main(argv: list[str]) -> None:
    job, lake = argv[0], Path(argv[1])
    if job == "ingest":
        ingest(lake, Path(argv[2]), argv[3] == "1")
        return
    marker = _Marker()
    if job == "compact":
        from pipeline.lake.compaction import compact
        compact(lake)
    elif job == "retain":
        from pipeline.lake.retention import retain
        retain(lake, int(argv[2]))
    else:
        raise SystemExit(f"unknown job {job!r}")
    marker.ack(job)


if __name__ == "__main__":
    main(sys.argv[1:])
