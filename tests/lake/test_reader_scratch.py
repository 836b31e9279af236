"""A reader of open segments leaves nothing in the temporary directory, however it is stopped.

SQL over open segments copies their committed rows into scratch files (`lake_scan`). A reader
stopped by SIGTERM (`timeout`, systemd, Kubernetes), SIGHUP (a closed terminal) or SIGKILL runs
no cleanup: once connected it must hold nothing on disk, and what it was writing when it was
stopped mid-connect must be removed by the next reader."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline import ReplayBuffer
from pipeline.analysis.views import connect
from pipeline.lake import kill as lake_kill
from pipeline.lake import scratch
from pipeline.lake.scan import scan_lake
from tests.support.lake import ROOT, add_group, python_env, write_script

SIGNALS = [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL]

# connects (again and again with "loop"), says so, runs a query a second later and waits; SIGHUP
# is reset to its default, as in a terminal's process (under `nohup`, or a CI runner that ignores
# it, the child would inherit the ignored disposition and outlive the signal)
READER = """
    import signal, sys, time
    from pipeline.analysis.views import connect

    signal.signal(signal.SIGHUP, signal.SIG_DFL)

    while True:
        con = connect(sys.argv[1])
        print("connected", flush=True)
        if sys.argv[2] != "loop":
            break
    time.sleep(1)
    print(con.sql("select count(*) from trajectories").fetchall()[0][0], flush=True)
    time.sleep(600)
"""


@pytest.fixture
def live_lake(tmp_path: Path) -> Path:
    """A lake whose rows are all in open segments (the writer closed it, nothing compacted)."""
    lake = tmp_path / "lake"
    with ReplayBuffer.sync(lake=lake) as buf:
        for i in range(40):
            add_group(buf, f"g{i}", rewards=[0.0, 1.0, 1.0])
    return lake


def reader(tmp_path: Path, lake: Path, mode: str, **env: str) -> subprocess.Popen:
    script = write_script(tmp_path, "reader.py", READER)
    return subprocess.Popen([sys.executable, str(script), str(lake), mode], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=python_env(TMPDIR=str(tmp_path / "tmp"), **env))


def left(tmp: Path) -> list[Path]:
    return sorted(tmp.rglob("*"))


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_reader_stopped_by_a_signal_after_connecting_leaves_no_scratch(tmp_path, live_lake,
                                                                         sig):
    (tmp_path / "tmp").mkdir()
    proc = reader(tmp_path, live_lake, "once")
    try:
        assert proc.stdout.readline() == "connected\n"
        assert left(tmp_path / "tmp") == []          # nothing on disk once connected ...
        assert proc.stdout.readline() == "120\n"     # ... and its queries still answer
        proc.send_signal(sig)
        assert proc.wait(60) == -sig
    finally:
        proc.kill()
    assert left(tmp_path / "tmp") == []


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_reader_stopped_by_a_signal_while_connecting_leaves_what_the_next_reader_sweeps(
        tmp_path, live_lake, sig):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = reader(tmp_path, live_lake, "loop")
    try:
        assert proc.stdout.readline() == "connected\n"    # connecting again and again now
        time.sleep(0.05)
        proc.send_signal(sig)
        assert proc.wait(60) == -sig
    finally:
        proc.kill()
    scan = scan_lake(live_lake, scratch_root=tmp)
    try:
        assert left(tmp) == []
        assert scan.tables["trajectories"].count_rows() == 120
    finally:
        scan.close()


def test_a_reader_killed_with_a_scratch_file_written_leaves_it_to_the_next_reader(
        tmp_path, live_lake):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = reader(tmp_path, live_lake, "once", **{lake_kill.ENV: "scan.scratch_written:2"})
    assert proc.wait(60) == -signal.SIGKILL
    [dead] = tmp.iterdir()
    assert f".{proc.pid}." in dead.name                               # named by its process
    assert len(list(dead.iterdir())) == 1                             # the one not yet mapped
    con = connect(live_lake)                                          # another TMPDIR: kept
    assert dead.exists()
    con.close()
    scan = scan_lake(live_lake, scratch_root=tmp)
    scan.close()
    assert left(tmp) == []


def test_the_sweep_keeps_the_scratch_of_live_readers_and_removes_a_reused_pids(tmp_path):
    mine = scratch.make(tmp_path)
    start = scratch.started(os.getpid())
    reused = tmp_path / f"{scratch.prefix(os.getpid(), start + 1)}x"    # same pid, other start
    reused.mkdir()
    (reused / "trajectories-000000.arrow").write_bytes(b"x" * 100)
    other = tmp_path / "replaylake-scan-abc"                  # not a scan directory we name
    other.mkdir()
    assert scratch.sweep(tmp_path) == [reused]
    assert mine.exists() and other.exists() and not reused.exists()
