"""The lake writer under failure: a failed write is reported, hides nothing, and burns its seqs."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pyarrow as pa
import pytest

from pipeline import LakeError, ReplayBuffer
from pipeline.lake.writer import LakeWriter, read_table, segment_files
from tests.support.lake import ROOT, python_env, traj, write_script
from tests.support.syscall_trace import require_strace


def test_a_failed_lake_write_raises_lake_error_and_later_writes_stay_readable(tmp_path,
                                                                             monkeypatch):
    buf = ReplayBuffer.sync(lake=tmp_path / "lake")
    buf.register(partition="train", uids=["a", "b"], global_steps=1)
    buf.put([traj("a", 0)])

    def broken(self, items):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:     # the disk fills up for exactly one write
        m.setattr(LakeWriter, "_append", broken)
        with pytest.raises(LakeError, match="No space left"):
            buf.put([traj("b", 0)])
    assert buf.counts("train")["pending"] == 2
    assert buf.lookup("train", "b").keys == frozenset()          # nothing applied in memory
    buf.put([traj("b", 0)])                                     # the retry is accepted
    rows = read_table(tmp_path / "lake", "trajectories")
    assert rows["uid"].to_pylist() == ["a", "b"]
    seqs = rows["seq"].to_pylist()
    assert seqs[1] > seqs[0] + 1                                # the failed call's seq was burnt
    assert len(segment_files(tmp_path / "lake", "trajectories")) == 2   # a fresh file after it


def test_writers_in_turn_never_share_a_segment_file(tmp_path):
    from schemas import LAKE_TABLES
    t = pa.table({"partition": ["p"], "step": [1], "batch_id": [None], "name": ["m"], "value": [1.0],
                  "seq": [0], "ts": pa.array([0], pa.int64()).cast(pa.timestamp("us", tz="UTC"))},
                 schema=LAKE_TABLES["metrics"])
    for _ in range(2):
        writer = LakeWriter(tmp_path)
        writer.append("metrics", t)
        writer.close()
    assert len(segment_files(tmp_path, "metrics")) == 2


FSYNC_RUN = """
    import sys
    from pipeline import ReplayBuffer
    with ReplayBuffer.sync(lake=sys.argv[1], fsync=True) as buf:
        buf.register(partition="train", uids=["a"], global_steps=1)
"""


def test_fsync_makes_new_files_and_their_directories_durable(tmp_path):
    """Watched with strace: every new file is fsync'ed, and so is every directory a new name was
    added to, after the name was added (so a new segment cannot vanish on power loss)."""
    lake, trace = tmp_path / "new" / "lake", tmp_path / "trace.txt"
    script = write_script(tmp_path, "fsync_run.py", FSYNC_RUN)
    subprocess.run([require_strace(), "-f", "-e", "trace=openat,fsync", "-o", str(trace), sys.executable,
                    str(script), str(lake)], check=True, cwd=ROOT, env=python_env(), timeout=120)
    fds: dict[tuple[str, str], str] = {}
    created, synced = {}, {}
    for n, line in enumerate(trace.read_text().splitlines()):
        m = re.match(r'(\d+)\s+openat\(AT_FDCWD, "([^"]+)", ([A-Z_|]+).*\) = (\d+)$', line)
        if m:
            fds[m[1], m[4]] = m[2]
            if "O_CREAT" in m[3]:
                created.setdefault(m[2], n)
            continue
        m = re.match(r"(\d+)\s+fsync\((\d+)\)\s+= 0", line)
        if m and (m[1], m[2]) in fds:
            synced[fds[m[1], m[2]]] = n                # the last fsync of each path
    segment = next(p for p in created if p.endswith(".arrow") and "group_events" in p)
    window = os.path.dirname(segment)
    new_files = [p for p in created if p.endswith((".arrow", ".crc"))]
    assert len(new_files) == 4                        # one segment + the log, each with sums
    assert all(p in synced for p in new_files)
    for d in (window, os.path.dirname(window), str(lake / "group_events"), str(lake),
              str(lake.parent), str(tmp_path), str(lake / "_log")):
        assert d in synced, f"directory {d} was never fsync'ed"
    assert synced[window] > created[segment]          # after the name was added


def test_the_writer_refuses_a_partition_that_would_leave_the_lake(tmp_path):
    from schemas import LAKE_TABLES
    writer = LakeWriter(tmp_path / "lake")
    try:
        t = pa.table({"partition": ["x/../../../outside"], "step": [1], "batch_id": [None],
                      "name": ["m"], "value": [1.0], "seq": [0],
                      "ts": pa.array([0], pa.int64()).cast(pa.timestamp("us", tz="UTC"))},
                     schema=LAKE_TABLES["metrics"])
        with pytest.raises(LakeError, match="would leave the lake"):
            writer.append("metrics", t)
    finally:
        writer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lake"]


@pytest.mark.parametrize("spec", ["nothing", "trajectories.data_torn:0", ":3", "x:y"])
def test_a_malformed_kill_point_is_refused_when_the_lake_opens(tmp_path, monkeypatch, spec):
    from pipeline import ConfigError
    from pipeline.lake.kill import ENV
    monkeypatch.setenv(ENV, spec)
    with pytest.raises(ConfigError, match=ENV):
        LakeWriter(tmp_path / "lake")
