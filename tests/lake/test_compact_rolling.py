"""A running buffer rolls its segments, so compaction turns most of a long run's data into
Parquet while the buffer is still writing; nothing is lost or duplicated on the way, and the
queries asked meanwhile only ever see a growing, duplicate-free prefix of the run."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from pipeline import ReplayBuffer
from pipeline.analysis.views import connect
from pipeline.lake.compaction import compact
from pipeline.lake.damage import check
from pipeline.lake.writer import ROLL_BYTES, ROLL_SECONDS, read_segment, segment_files
from schemas import LAKE_TABLES
from tests.support.lake import ROOT, lake_history, python_env, traj, write_script

# One buffer session that never closes until told to: a long run. Segments roll at 16 KiB.
WRITER = """
    import sys
    from pipeline import ReplayBuffer

    lake, rounds = sys.argv[1], int(sys.argv[2])
    buf = ReplayBuffer.sync(lake=lake)
    buf.lake.roll_bytes = 16 << 10
    for r in range(rounds):
        for i in range(10):
            uid = f"r{r}g{i}"
            buf.register(partition="train", uids=[uid], global_steps=r, n=2)
            buf.update_status(partition="train", uids=[uid], status="running")
            buf.put([{"partition": "train", "uid": uid, "session_id": s,
                      "min_global_steps": r, "max_global_steps": r, "reward": float(s),
                      "prompt_ids": [r, i], "response_ids": list(range(300 + s + i))}
                     for s in range(2)])
            buf.update_status(partition="train", uids=[uid], status="finished")
        buf.release(buf.sample(r + 1, "train", 4, timeout=5))
    print("appended", flush=True)
    sys.stdin.readline()              # still open: the test compacts now
    buf.close()
"""

QUERIES = [
    "select count(*), count(distinct seq) from trajectories",
    "select uid, session_id, reward, len(response_ids) from trajectories order by seq",
    "select kind, count(*) from decisions group by kind order by kind",
    "select uid, fate from groups order by uid",
]


def answers(lake: Path) -> list[list[tuple]]:
    con = connect(lake)
    try:
        return [con.sql(q).fetchall() for q in QUERIES]
    finally:
        con.close()


def rows_in(lake: Path, suffix: str) -> int:
    return sum(read_segment(p).num_rows if suffix == ".arrow" else pq.read_metadata(p).num_rows
               for t in LAKE_TABLES for p in segment_files(lake, t) if p.suffix == suffix)


def run_writer(script: Path, lake: Path, rounds: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(script), str(lake), str(rounds)], cwd=ROOT,
                            env=python_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> None:
    proc.stdin.write("close\n")
    proc.stdin.flush()
    proc.wait(60)
    assert proc.returncode == 0, proc.stderr.read()


def test_a_writer_rolls_segments_so_most_of_a_running_buffers_data_is_compacted(tmp_path):
    script = write_script(tmp_path, "writer.py", WRITER)
    reference, lake = tmp_path / "reference", tmp_path / "lake"
    ref = run_writer(script, reference, 12)
    assert ref.stdout.readline().strip() == "appended"
    finish(ref)
    expected = lake_history(reference)

    proc = run_writer(script, lake, 12)
    seen, compacted = 0, 0
    try:
        while proc.poll() is None and not (lake / "_writer.lock").exists():   # a lake now
            pass
        # compact over and over while the buffer appends; query between the runs
        import selectors
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        while not sel.select(timeout=0):
            assert proc.poll() is None, proc.stderr.read()
            compacted += len(compact(lake).compacted)
            count, distinct = answers(lake)[0][0]
            assert count == distinct               # no trajectory counted twice
            assert count >= seen                   # and none lost since the last look
            seen = count
        assert proc.stdout.readline().strip() == "appended"
        # the buffer is still open: everything it rolled is sealed and compacted now
        compacted += len(compact(lake).compacted)
        live, packed = rows_in(lake, ".arrow"), rows_in(lake, ".parquet")
        assert packed > 4 * live, (packed, live)   # most of the run is Parquet
        assert answers(lake) == answers(reference)
        assert lake_history(lake) == expected
    finally:
        if proc.poll() is None:
            finish(proc)
    compacted += len(compact(lake).compacted)
    assert compacted > 10
    assert rows_in(lake, ".arrow") == 0
    assert lake_history(lake) == expected
    assert answers(lake) == answers(reference)
    assert check(lake).damaged == []


def test_segments_roll_by_size_and_by_age_and_a_restart_reads_every_row_once(lake):
    with ReplayBuffer.sync(lake=lake) as buf:
        assert (buf.lake.roll_bytes, buf.lake.roll_seconds) == (ROLL_BYTES, ROLL_SECONDS)
        buf.lake.roll_bytes = 1 << 40
        buf.lake.roll_seconds = 0.0          # every segment is finished after each call
        buf.register(partition="train", uids=["a", "b"], global_steps=0, n=1)
        buf.register(partition="val", uids=["c"], global_steps=0, n=1)
        buf.lake.roll_seconds = 3600.0
        buf.lake.roll_bytes = 1              # now by size: the same, after each call
        buf.update_status(partition="train", uids=["a"], status="running")
        buf.put([traj("a", 0)])
        buf.update_status(partition="train", uids=["a"], status="finished")
    events = [p for p in segment_files(lake, "group_events") if "partition=train" in str(p)]
    assert len(events) == 3                  # register, running, finished: one segment each
    assert len(segment_files(lake, "trajectories")) == 1
    with ReplayBuffer.sync(lake=lake) as again:
        assert again.counts("train")["finished"] == 1
        assert again.counts("train")["pending"] == 1
        assert again.counts("val")["pending"] == 1
    assert check(lake).damaged == []
