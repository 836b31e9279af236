"""One writer per lake: a second buffer on an open lake is refused, naming the holder; readers are
not; the lock goes with `close()` and with the holder's death, however it dies."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from pipeline import LakeError, ReplayBuffer
from pipeline.lake.files import LOCK_NAME
from pipeline.lake.writer import read_table
from tests.support.lake import ROOT, add_group, python_env, write_script

HOLDER = """
    import os, signal, sys, time
    from pipeline import ReplayBuffer

    buf = ReplayBuffer.sync(lake=sys.argv[1])
    buf.register(partition="train", uids=["held"], global_steps=1)
    print(os.getpid(), flush=True)
    if sys.argv[2] == "die":
        os.kill(os.getpid(), signal.SIGKILL)       # no close: the lock file keeps its record
    time.sleep(600)
"""


def test_a_second_buffer_in_the_same_process_is_refused_naming_the_holder(lake):
    with ReplayBuffer.sync(lake=lake) as buf:
        add_group(buf, "a", 1, [0.0, 1.0])
        with pytest.raises(LakeError) as err:
            ReplayBuffer.async_(lake=lake)
        message = str(err.value)
        assert f"pid {os.getpid()} on {socket.gethostname()} since " in message
        assert str(lake) in message
        assert buf.put  # the first buffer is untouched and keeps writing
        add_group(buf, "b", 1, [0.0, 1.0])
    assert sorted(read_table(lake, "group_events")["uid"].unique().to_pylist()) == ["a", "b"]


def test_a_deleted_lock_file_lets_no_second_writer_in(lake):
    """The lake directory is locked with its lock file: deleting `_writer.lock` under an open
    buffer (by hand, a cleanup job) does not let a second buffer open the lake."""
    with ReplayBuffer.sync(lake=lake) as buf:
        add_group(buf, "a", 1, [0.0, 1.0])
        (lake / LOCK_NAME).unlink()
        with pytest.raises(LakeError, match="already open for writing by a writer whose lock "
                                            "file was deleted while it held the lake"):
            ReplayBuffer.sync(lake=lake)
        add_group(buf, "b", 1, [0.0, 1.0])          # the first buffer keeps writing
    with ReplayBuffer.sync(lake=lake) as again:     # and once it closed, the next one opens
        assert again.counts("train")["finished"] == 2


def test_closing_the_buffer_lets_the_next_one_open(lake):
    first = ReplayBuffer.sync(lake=lake)
    add_group(first, "a", 1, [0.0, 1.0])
    first.close()
    assert (lake / LOCK_NAME).read_bytes() == b""        # the holder record goes with the lock
    with ReplayBuffer.sync(lake=lake) as second:
        assert second.counts("train")["finished"] == 1
        add_group(second, "b", 1, [0.0, 1.0])


def test_a_buffer_in_another_process_is_refused_and_readers_are_not(tmp_path):
    lake = tmp_path / "lake"
    script = write_script(tmp_path, "holder.py", HOLDER)
    proc = subprocess.Popen([sys.executable, str(script), str(lake), "hold"], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True, env=python_env())
    try:
        pid = int(proc.stdout.readline())
        with pytest.raises(LakeError, match=f"open for writing by pid {pid} on "):
            ReplayBuffer.sync(lake=lake)
        # readers take no lock: the lake reads while it is held, and the lock is still held
        assert read_table(lake, "group_events")["uid"].to_pylist() == ["held"]
        assert read_table(lake, "trajectories").num_rows == 0
        with pytest.raises(LakeError, match=f"pid {pid} "):
            ReplayBuffer.sync(lake=lake)
    finally:
        proc.kill()
        proc.wait(10)
    with ReplayBuffer.sync(lake=lake) as buf:          # the holder is gone: the lake is free
        assert buf.counts("train")["pending"] == 1


def test_a_lock_left_by_a_killed_process_is_taken_over(tmp_path, caplog):
    lake = tmp_path / "lake"
    script = write_script(tmp_path, "holder.py", HOLDER)
    proc = subprocess.run([sys.executable, str(script), str(lake), "die"], cwd=ROOT,
                          capture_output=True, text=True, env=python_env(), timeout=60)
    assert proc.returncode == -signal.SIGKILL
    dead = int(proc.stdout)
    assert f'"pid": {dead}' in (lake / LOCK_NAME).read_text()   # a stale record is left behind
    with caplog.at_level("WARNING", logger="replaylake"):
        with ReplayBuffer.sync(lake=lake) as buf:
            assert buf.lake.lock.previous.startswith(f"pid {dead} on ")
            assert buf.counts("train")["pending"] == 1
            add_group(buf, "next", 1, [0.0, 1.0])
    assert f"took over the writer lock of pid {dead}" in caplog.text


def test_a_write_after_close_is_refused(lake):
    buf = ReplayBuffer.sync(lake=lake)
    buf.close()
    with pytest.raises(LakeError, match="closed"):
        buf.register(partition="train", uids=["late"], global_steps=1)


def test_a_forked_child_does_not_keep_the_lake_after_its_parent_closes(lake):
    buf = ReplayBuffer.sync(lake=lake)
    r, w = os.pipe()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:                                       # the child outlives the parent's buffer
        os.write(ready_w, b"r")                        # (fork's child handlers have run by now)
        os.read(r, 1)
        os._exit(0)
    os.close(r)
    try:
        assert os.read(ready_r, 1) == b"r"
        buf.close()
        with ReplayBuffer.sync(lake=lake) as again:    # the child's copy does not hold the lock
            assert again.counts("train")["pending"] == 0
    finally:
        os.write(w, b"x")
        os.close(w)
        os.waitpid(pid, 0)


def test_a_file_system_that_cannot_lock_a_directory_still_opens_with_the_lock_file(
        lake, monkeypatch):
    """NFS emulates `flock` with byte-range locks, which refuse a read-only descriptor (a
    directory's): the lake then opens guarded by its lock file alone, which still refuses a
    second writer."""
    import errno
    import fcntl
    import stat

    real = fcntl.flock

    def nfs_like(fd, op):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EBADF, "Bad file descriptor")
        return real(fd, op)

    monkeypatch.setattr(fcntl, "flock", nfs_like)
    with ReplayBuffer.sync(lake=lake) as buf:
        add_group(buf, "a", 1, [0.0, 1.0])
        with pytest.raises(LakeError, match="already open for writing by pid"):
            ReplayBuffer.sync(lake=lake)
    with ReplayBuffer.sync(lake=lake) as again:
        assert again.counts("train")["finished"] == 1
