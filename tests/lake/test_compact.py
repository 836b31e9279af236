"""Compaction: sealed segments become Parquet with the same rows, a restart restores the same
batches from a compacted lake, a live writer's open segments are left alone, and compaction
while a writer appends loses and duplicates nothing."""
from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.compute as pc

from pipeline import ReplayBuffer
from pipeline.lake.compaction import compact
from pipeline.lake.damage import check
from pipeline.lake.writer import highest_seq, read_table, segment_files
from schemas import LAKE_TABLES
from tests.support.lake import ROOT, lake_history, python_env, write_script
from tests.support.sql_runs import Rollout, simulate_async


def files(lake: Path, suffix: str) -> list[Path]:
    return [p for t in LAKE_TABLES for p in segment_files(lake, t) if p.suffix == suffix]


def second_phase(lake: Path) -> list[tuple]:
    """Restart on the lake and run four more steps; what each sample handed out."""
    ro = Rollout(seed=7)
    ro.next_uid = 5000
    buf = ReplayBuffer.async_(lake=lake, max_off_policy_threshold=2,
                              filter_groups_metric="reward", refill_fn=ro.refill,
                              poll_interval=0.01)
    ro.buf = buf
    out = []
    with buf:
        out.append(("counts", sorted(buf.counts("train").items())))
        for g in range(9, 13):
            ro.step = g
            ro.dispatch(3)
            b = buf.sample(g, "train", 3, timeout=10)
            t = b.table.drop_columns(["ts"])
            out.append((b.batch_id, b.uids, t.to_pylist()))
            buf.release(b)
    return out


def test_compaction_keeps_every_row_and_a_restart_gives_the_same_batches(tmp_path):
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    simulate_async(plain, steps=8, surplus=1)
    shutil.copytree(plain, packed)
    before = lake_history(packed)
    top = highest_seq(packed)

    report = compact(packed)

    assert report.compacted and report.skipped_open == 0
    assert files(packed, ".arrow") == []
    assert len(files(packed, ".parquet")) == len(report.compacted)
    assert report.rows == sum(len(v) for v in before.values())
    assert lake_history(packed) == before
    assert highest_seq(packed) == top
    assert check(packed).damaged == []
    assert second_phase(packed) == second_phase(plain)
    assert lake_history(packed) == lake_history(plain)


def test_compacting_twice_rewrites_nothing(tmp_path):
    lake = tmp_path / "lake"
    simulate_async(lake, steps=4)
    first = compact(lake)
    written = {p: p.stat().st_mtime_ns for p in first.compacted}
    again = compact(lake)
    assert again.compacted == [] and again.cleaned == 0
    assert {p: p.stat().st_mtime_ns for p in written} == written


def test_a_run_killed_between_rename_and_delete_is_finished_by_the_next_run(tmp_path):
    lake = tmp_path / "lake"
    simulate_async(lake, steps=4)
    keep = tmp_path / "keep"
    shutil.copytree(lake, keep)
    before = lake_history(lake)
    compact(lake)
    # put the segments back beside their Parquet copies: what a kill after the rename leaves
    for p in files(keep, ".arrow"):
        rel = p.relative_to(keep)
        shutil.copy(p, lake / rel)
        shutil.copy(p.with_name(p.name + ".crc"), lake / rel.with_name(rel.name + ".crc"))
    assert lake_history(lake) == before            # both listed: the rows count once
    report = compact(lake)
    assert report.cleaned == len(files(keep, ".arrow")) and report.compacted == []
    assert files(lake, ".arrow") == [] and lake_history(lake) == before


HOLDER = """
    import sys, time
    from pipeline import ReplayBuffer

    lake = sys.argv[1]
    buf = ReplayBuffer.sync(lake=lake)
    buf.register(partition="train", uids=["live"], global_steps=100, n=1)
    print("ready", flush=True)
    time.sleep(600)
"""


def test_a_live_writers_open_segments_are_left_alone_and_a_dead_ones_are_taken(tmp_path):
    lake = tmp_path / "lake"
    with ReplayBuffer.sync(lake=lake) as buf:
        buf.register(partition="train", uids=["a", "b"], global_steps=0, n=1)
    old = files(lake, ".arrow")
    script = write_script(tmp_path, "holder.py", HOLDER)
    proc = subprocess.Popen([sys.executable, str(script), str(lake)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, env=python_env())
    try:
        assert proc.stdout.readline().strip() == "ready"
        live = set(files(lake, ".arrow")) - set(old)
        assert live                            # its group_events segment (and its log)
        report = compact(lake)
        assert report.skipped_open == len(live)
        assert set(files(lake, ".arrow")) == live
        assert {p.with_suffix(".arrow") for p in report.compacted} == set(old)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    # its holder is dead (the lock record is left behind): nothing can append any more
    report = compact(lake)
    assert {p.with_suffix(".arrow") for p in report.compacted} == live
    assert "live" in read_table(lake, "group_events")["uid"].to_pylist()


WRITER = """
    import sys
    from pipeline import ReplayBuffer

    lake, rounds = sys.argv[1], int(sys.argv[2])
    for r in range(rounds):
        with ReplayBuffer.sync(lake=lake) as buf:
            for i in range(15):
                uid = f"r{r}g{i}"
                buf.register(partition="train", uids=[uid], global_steps=r, n=2)
                buf.update_status(partition="train", uids=[uid], status="running")
                buf.put([{"partition": "train", "uid": uid, "session_id": s,
                          "min_global_steps": r, "max_global_steps": r, "reward": float(s),
                          "prompt_ids": [r, i], "response_ids": list(range(s + i + 1))}
                         for s in range(2)])
                buf.update_status(partition="train", uids=[uid], status="finished")
            b = buf.sample(r + 1, "train", 5, timeout=5)
            buf.release(b)
    print("done", flush=True)
"""


def test_compaction_while_a_writer_appends_loses_and_duplicates_nothing(tmp_path):
    script = write_script(tmp_path, "writer.py", WRITER)
    reference, lake = tmp_path / "reference", tmp_path / "lake"
    done = subprocess.run([sys.executable, str(script), str(reference), "8"], cwd=ROOT,
                          env=python_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    proc = subprocess.Popen([sys.executable, str(script), str(lake), "8"], cwd=ROOT,
                            env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    compacted, seen = 0, 0
    while proc.poll() is None:
        if not (lake / "_writer.lock").exists():      # a lake once its writer made its lock
            continue
        compacted += len(compact(lake).compacted)
        t = read_table(lake, "trajectories")
        seq = t.column("seq")
        assert pc.count_distinct(seq).as_py() == t.num_rows     # nothing counted twice
        assert t.num_rows >= seen                               # nothing lost on the way
        seen = t.num_rows
    assert proc.returncode == 0, proc.stderr.read()
    compacted += len(compact(lake).compacted)
    assert compacted > 0
    assert files(lake, ".arrow") == []
    assert lake_history(lake) == lake_history(reference)


def _resumed_across_tables(lake):
    """A lake whose last call is a `resume` over two partitions: one call across two tables."""
    from tests.support.lake import traj
    with ReplayBuffer.sync(lake=lake) as buf:
        for p in ("a", "b"):
            buf.register(partition=p, uids=["g"], global_steps=1, n=2)
            buf.update_status(partition=p, uids=["g"], status="running")
        buf.put([traj("g", s, partition=p) for p in ("a", "b") for s in range(2)])
        buf.resume(4)
    return lake


def test_a_call_written_across_tables_survives_compaction_whole(tmp_path):
    """`resume` over two partitions is one call across two tables (committed by one record per
    table, written as one); compaction keeps its rows in both tables, and a restart on the
    compacted lake sees the resume as it was."""
    lake = _resumed_across_tables(tmp_path / "lake")
    before = lake_history(lake)
    report = compact(lake)
    assert report.rows == sum(len(v) for v in before.values()) and files(lake, ".arrow") == []
    assert lake_history(lake) == before
    ev = read_table(lake, "group_events")
    assert ev.filter(pc.equal(ev["event"], "reissued"))["partition"].to_pylist() == ["a", "b"]
    with ReplayBuffer.sync(lake=lake) as buf:
        assert [(buf.lookup(p, "g").sessions, buf.lookup(p, "g").global_steps)
                for p in ("a", "b")] == [({0, 1}, 4), ({0, 1}, 4)]


def test_a_call_across_tables_is_committed_by_one_record_per_table_written_as_one(tmp_path):
    """Each table the call wrote has its own commit record, so a reader that matches a
    record's table to the table it reads (every replaylake reader, older ones included) sees the
    call; the records are one write of the log (one record batch, one checksum record). A record
    naming several tables, comma separated, as the writer of 2026-12-06 wrote it, still commits
    the call in each."""
    import pyarrow as pa

    from pipeline.lake.files import LOG_SCHEMA, log_files
    from pipeline.lake.read import committed_calls, read_log
    from pipeline.lake.verify import batches
    lake = _resumed_across_tables(tmp_path / "lake")
    log = read_log(lake)
    commits = log.filter(pc.equal(log["kind"], "commit"))
    resume = commits.filter(pc.greater(pc.utf8_length(commits["table"]), 0)).to_pylist()[-2:]
    assert sorted(r["table"] for r in resume) == ["group_events", "trajectories"]
    assert len({(r["writer"], r["first_seq"], r["last_seq"]) for r in resume}) == 1
    (log_file,) = log_files(lake)
    written = [b.num_rows for b, _ in batches(log_file)]
    assert written[-1] == 2                    # both records: the log's last write
    calls = {(r["table"], f"{r['writer']}:{r['first_seq']}:{r['last_seq']}")
             for r in commits.to_pylist()}
    assert committed_calls(lake) == calls      # what a reader without the comma rule sees too
    call = next(c for t, c in calls if t == "trajectories" and c.endswith(
        f":{resume[0]['last_seq']}"))
    writer, first, last = call.split(":")
    joined = pa.table({**{f.name: pa.nulls(1, f.type) for f in LOG_SCHEMA},
                       "kind": ["commit"], "table": ["group_events,trajectories"],
                       "writer": [writer], "first_seq": [int(first)], "last_seq": [int(last)]},
                      schema=LOG_SCHEMA)
    assert committed_calls(lake, joined) == {("group_events", call), ("trajectories", call)}
