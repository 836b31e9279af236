"""Crash safety: a writer process killed with SIGKILL loses no acknowledged write, a
torn tail is ignored, a restarted buffer gives the same batches as one that never crashed, and
`reissue` hands in-flight groups back for re-dispatch."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from pipeline import ConfigError, IngestError, ReplayBuffer
from pipeline.lake.files import log_files
from pipeline.lake.writer import highest_seq, read_table, segment_files
from schemas import LAKE_TABLES
from tests.support.lake import ROOT, add_group, lake_history, python_env, traj, write_script
from tests.support.lake_damage import tear_all, tear_last_write

WRITER = """
    import os, signal, sys
    from pipeline import ReplayBuffer

    lake, groups, tail = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "tail"
    buf = ReplayBuffer.sync(lake=lake)
    calls = 0

    def ack(what):
        global calls
        print(f"ack {calls} {what}", flush=True)   # printed only once the call has returned
        calls += 1

    def rows(uid, i):
        return [{"partition": "train", "uid": uid, "session_id": s, "min_global_steps": i // 10,
                 "max_global_steps": i // 10, "reward": float(s), "prompt_ids": list(range(64)),
                 "response_ids": list(range(i % 7, i % 7 + 256))} for s in range(2)]

    i = 0
    while groups == 0 or i < groups:                # groups == 0: until killed
        uid = f"g{i:05d}"
        buf.register(partition="train", uids=[uid], global_steps=i // 10 + 1, n=2)
        ack(f"register {uid}")
        buf.put(rows(uid, i))
        ack(f"put {uid}")
        buf.update_status(partition="train", uids=[uid], status="running")
        ack(f"running {uid}")
        buf.update_status(partition="train", uids=[uid], status="finished")
        ack(f"finished {uid}")
        i += 1
    if tail:                                        # one more group, left in flight
        buf.register(partition="train", uids=["tail"], global_steps=0, n=2)
        ack("register tail")
        buf.put(rows("tail", 0))
        ack("put tail")
    os.kill(os.getpid(), signal.SIGKILL)            # die like a crash: no close, no end marker
"""


def tail_rows() -> list[dict]:
    """The rows WRITER puts for its `tail` group."""
    return [traj("tail", s, reward=float(s), prompt=range(64), response=range(256))
            for s in range(2)]


def acked(lines: list[str]) -> dict[str, list[str]]:
    """uids per acknowledged call kind, from the writer's `ack <n> <kind> <uid>` lines."""
    out: dict[str, list[str]] = {}
    for n, line in enumerate(lines):
        word, number, kind, uid = line.split()
        assert (word, int(number)) == ("ack", n)
        out.setdefault(kind, []).append(uid)
    return out


def test_sigkill_mid_ingest_keeps_every_acknowledged_write(tmp_path):
    script, lake = write_script(tmp_path, "writer.py", WRITER), tmp_path / "lake"
    proc = subprocess.Popen([sys.executable, str(script), str(lake), "0", "-"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=python_env())
    lines = []
    for line in proc.stdout:                        # let it ingest for a while ...
        lines.append(line.strip())
        if len(lines) == 60:
            break
    proc.kill()                                     # ... then SIGKILL it mid-loop
    lines += proc.stdout.read().splitlines()        # acks it printed before dying count too
    proc.wait(10)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()
    ack = acked(lines)
    assert len(ack["register"]) >= 15

    with ReplayBuffer.sync(lake=lake) as buf:
        counts = buf.counts("train")
        assert sum(counts.values()) >= len(ack["register"])
        stored = Counter(read_table(lake, "trajectories")["uid"].to_pylist())
        assert all(stored[uid] == 2 for uid in ack["put"])
        assert counts["finished"] >= len(ack["finished"])
        batch = buf.sample(1000, "train", counts["finished"])
        in_batch = Counter(batch.table["uid"].to_pylist())
        assert all(in_batch[uid] == 2 for uid in ack["finished"])
        open_groups = [u for u in ack["put"] if u not in set(ack["finished"])]
        for uid in open_groups:                     # restored as in flight, trajectories known
            with pytest.raises(IngestError, match="already in the buffer"):
                buf.put([traj(uid, 0)])
        add_group(buf, "after", 1, [1.0])           # the restarted buffer keeps writing
    with ReplayBuffer.sync(lake=lake) as buf:
        assert buf.sample(1000, "train", 1).uids == ["after"]


@pytest.mark.parametrize("cut", [1, 8, 1000])
def test_a_torn_tail_is_ignored_and_only_the_torn_batch_is_lost(tmp_path, cut):
    script, lake = write_script(tmp_path, "writer.py", WRITER), tmp_path / "lake"
    proc = subprocess.run([sys.executable, str(script), str(lake), "3", "tail"], cwd=ROOT,
                          capture_output=True, text=True, env=python_env(), timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert acked(proc.stdout.splitlines())["put"] == ["g00000", "g00001", "g00002", "tail"]
    [segment] = segment_files(lake, "trajectories")
    assert read_table(lake, "trajectories").num_rows == 8
    tear_last_write(segment, cut)                           # the last put, torn mid-write

    survivors = read_table(lake, "trajectories")["uid"].to_pylist()
    assert sorted(Counter(survivors).items()) == [("g00000", 2), ("g00001", 2), ("g00002", 2)]
    with ReplayBuffer.sync(lake=lake) as buf:
        assert buf.counts("train") == {"pending": 1, "running": 0, "finished": 3, "failure": 0,
                                       "sampled": 0}
        assert buf.put(tail_rows()) == 2            # the torn batch is gone: send it again
        batch = buf.sample(5, "train", 3)
        assert batch.uids == ["g00000", "g00001", "g00002"] and len(batch) == 6


def test_a_segment_torn_inside_its_header_holds_no_rows(tmp_path):
    script, lake = write_script(tmp_path, "writer.py", WRITER), tmp_path / "lake"
    subprocess.run([sys.executable, str(script), str(lake), "2", "-"], cwd=ROOT,
                   capture_output=True, env=python_env(), timeout=60)
    [segment] = segment_files(lake, "trajectories")
    tear_all(segment, 10)
    assert read_table(lake, "trajectories").num_rows == 0
    with ReplayBuffer.sync(lake=lake) as buf:       # groups without rows: empty failures
        assert buf.counts("train")["finished"] == 2
        assert buf.get_sampleable_count(5, "train") == 2


SCENARIO = """
    import json, sys, time
    from pipeline import ReplayBuffer

    lake, mode = sys.argv[1], sys.argv[2]           # full | crash | resume
    buf = ReplayBuffer.sync(lake=lake, poll_interval=0.05)

    def rows(uid, sessions, gs):
        return [{"partition": "train", "uid": uid, "session_id": s,
                 "min_global_steps": max(gs - 1, 0), "max_global_steps": gs,
                 "reward": gs / 10 + s, "prompt_ids": [1, 2, s], "response_ids": [3, 4, 5][: s + 1]}
                for s in sessions]

    def group(uid, gs, status="finished", sessions=(0, 1)):
        buf.register(partition="train", uids=[uid], global_steps=gs, n=2)
        if sessions:
            buf.put(rows(uid, sessions, gs))
        if status != "pending":
            buf.update_status(partition="train", uids=[uid], status="running")
        if status in ("finished", "failure"):
            buf.update_status(partition="train", uids=[uid], status=status)

    def show(batch):
        t = batch.table
        print(json.dumps({"batch": batch.batch_id, "step": batch.step, "uids": batch.uids,
                          "rows": list(zip(t["uid"].to_pylist(), t["session_id"].to_pylist())),
                          "seq": t["seq"].to_pylist()}), flush=True)

    if mode != "resume":
        for i in (3, 0, 4, 1, 5, 2):                # ties in global_steps; finish order != uid order
            group(f"a{i}", i % 2)
        group("f0", 0, "failure", sessions=(0,))
        b = buf.sample(1, "train", 3)
        show(b)
        buf.release(b)
        show(buf.sample(1, "train", 2))             # held, unreleased, across the crash
        for i in range(4):
            group(f"b{i}", 1 + i % 2)
        group("b4", 2, "running", sessions=(0,))    # in flight, one session in
        group("b5", 2, "pending", sessions=())
        print("phase1 done", flush=True)
        if mode == "crash":
            time.sleep(600)                         # the test SIGKILLs us here

    buf.release(1)
    buf.put(rows("b4", (1,), 2))
    buf.update_status(partition="train", uids=["b4"], status="finished")
    buf.put(rows("b5", (0, 1), 2))
    buf.update_status(partition="train", uids=["b5"], status="running")
    buf.update_status(partition="train", uids=["b5"], status="finished")
    for step, size in ((2, 3), (3, 3), (4, 2)):
        b = buf.sample(step, "train", size, timeout=5)
        show(b)
        buf.release(b)
    print("done", flush=True)
"""


def test_a_restart_after_sigkill_gives_the_same_batches_as_no_crash(tmp_path):
    script = write_script(tmp_path, "scenario.py", SCENARIO)
    full = subprocess.run([sys.executable, str(script), str(tmp_path / "a"), "full"], cwd=ROOT,
                          capture_output=True, text=True, env=python_env(), timeout=60)
    assert full.returncode == 0, full.stderr
    expected = full.stdout.splitlines()

    lake = tmp_path / "b"
    proc = subprocess.Popen([sys.executable, str(script), str(lake), "crash"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=python_env(PYTHONHASHSEED="99"))
    before = []
    for line in proc.stdout:
        before.append(line.strip())
        if before[-1] == "phase1 done":
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert proc.returncode == -signal.SIGKILL
    after = subprocess.run([sys.executable, str(script), str(lake), "resume"], cwd=ROOT,
                           capture_output=True, text=True, env=python_env(), timeout=60)
    assert after.returncode == 0, after.stderr

    assert before + after.stdout.splitlines() == expected
    batches = [json.loads(x) for x in expected if x.startswith("{")]
    assert [b["uids"] for b in batches] == [
        ["a0", "a4", "a2"], ["f0", "a3"], ["a1", "a5", "b0"], ["b2", "b1", "b3"], ["b4", "b5"]]
    assert lake_history(lake) == lake_history(tmp_path / "a")   # same rows, same seq numbers


def test_sequence_numbers_stay_unique_across_a_restart_after_a_sample(lake):
    with ReplayBuffer.sync(lake=lake) as buf:
        add_group(buf, "a", 1, [1.0])
        buf.sample(1, "train", 1)                   # the last rows written: select + metrics
    with ReplayBuffer.sync(lake=lake) as buf:
        add_group(buf, "b", 1, [1.0])
    seqs = [s for name in LAKE_TABLES for s in read_table(lake, name)["seq"].to_pylist()]
    assert len(seqs) == len(set(seqs))


INFLIGHT = """
    import os, signal, sys
    from pipeline import ReplayBuffer

    buf = ReplayBuffer.sync(lake=sys.argv[1])

    def put(uid, sessions, reward):
        buf.put([{"partition": "train", "uid": uid, "session_id": s, "min_global_steps": 1,
                  "max_global_steps": 1, "reward": reward, "prompt_ids": [1],
                  "response_ids": [2]} for s in sessions])

    buf.register(partition="train", uids=["done", "run", "pend", "half"], global_steps=2, n=2)
    put("done", (0, 1), 1.0)
    put("run", (0,), 0.25)
    put("half", (0, 1), 0.5)
    buf.update_status(partition="train", uids=["done", "run", "half"], status="running")
    buf.update_status(partition="train", uids=["done"], status="finished")
    print("ready", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)            # the rollout workers die with us
"""


def test_reissue_after_a_restart_hands_in_flight_groups_back_as_pending(tmp_path):
    script, lake = write_script(tmp_path, "inflight.py", INFLIGHT), tmp_path / "lake"
    proc = subprocess.run([sys.executable, str(script), str(lake)], cwd=ROOT,
                          capture_output=True, text=True, env=python_env(), timeout=60)
    assert proc.stdout.strip() == "ready" and proc.returncode == -signal.SIGKILL, proc.stderr

    with ReplayBuffer.sync(lake=lake) as buf:
        assert buf.counts("train") == {"pending": 1, "running": 2, "finished": 1, "failure": 0,
                                       "sampled": 0}
        with pytest.raises(IngestError, match="already in the buffer"):
            buf.put([traj("run", 0, min_gs=1, max_gs=1)])
        with pytest.raises(ConfigError):
            buf.reissue(-1)
        assert buf.reissue(7) == {"train": ["half", "pend", "run"]}
        assert buf.counts("train") == {"pending": 3, "running": 0, "finished": 1, "failure": 0,
                                       "sampled": 0}
        events = read_table(lake, "group_events")
        reissued = events.filter(pc.equal(events["event"], "reissued"))
        assert reissued.select(["uid", "global_steps"]).to_pylist() == [
            {"uid": u, "global_steps": 7} for u in ("half", "pend", "run")]
        # partial trajectories are dropped: the same session keys can be sent again
        buf.put([traj("run", s, min_gs=6, max_gs=6, reward=0.75) for s in (0, 1)])
        buf.update_status(partition="train", uids=["run"], status="finished")

    with ReplayBuffer.sync(lake=lake) as buf:      # the re-issue itself survives a restart
        assert buf.counts("train") == {"pending": 2, "running": 0, "finished": 2, "failure": 0,
                                       "sampled": 0}
        batch = buf.sample(8, "train", 2)
        assert batch.uids == ["done", "run"]
        run = batch.table.filter(pc.equal(batch.table["uid"], "run"))
        assert run.select(["session_id", "reward", "global_steps", "group_span"]).to_pylist() == [
            {"session_id": s, "reward": 0.75, "global_steps": 7, "group_span": 2} for s in (0, 1)]
        assert buf.reissue(9) == {"train": ["half", "pend"]}
        buf.put([traj("half", s, min_gs=8, max_gs=8) for s in (0, 1)])
        assert buf.reissue(9, partition_id="val") == {}


SPLIT_CALL = """
    import os, signal, sys
    from pipeline import ReplayBuffer

    buf = ReplayBuffer.sync(lake=sys.argv[1])
    buf.register(partition="train", uids=["t"], global_steps=1)
    buf.register(partition="val", uids=["v"], global_steps=1)
    buf.put([{"partition": p, "uid": u, "session_id": 0, "min_global_steps": 0,
              "max_global_steps": 0, "reward": 1.0, "prompt_ids": [1], "response_ids": [2]}
             for p, u in (("train", "t"), ("val", "v"))])   # one call, two segment files
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_committed_call_over_two_partitions_is_restored_whole(tmp_path):
    script, lake = write_script(tmp_path, "split.py", SPLIT_CALL), tmp_path / "lake"
    subprocess.run([sys.executable, str(script), str(lake)], cwd=ROOT, capture_output=True,
                   env=python_env(), timeout=60)
    with ReplayBuffer.sync(lake=lake):
        assert sorted(read_table(lake, "trajectories")["uid"].to_pylist()) == ["t", "v"]


def test_a_call_torn_between_two_segment_files_is_restored_all_or_nothing(tmp_path):
    script, lake = write_script(tmp_path, "split.py", SPLIT_CALL), tmp_path / "lake"
    subprocess.run([sys.executable, str(script), str(lake)], cwd=ROOT, capture_output=True,
                   env=python_env(), timeout=60)
    [val_segment] = segment_files(lake, "trajectories", ["val"])
    # killed while writing `val`: that part is torn, and the commit record written after every
    # part was never written either
    tear_last_write(val_segment, 8)
    [log] = log_files(lake)
    tear_last_write(log, 8)
    with ReplayBuffer.sync(lake=lake) as buf:
        assert read_table(lake, "trajectories").num_rows == 0   # nothing of the torn call
        buf.put([traj("t", 0), traj("v", 0, partition="val")])  # the producer's retry


def _torn_split_call(tmp_path: Path) -> Path:
    """SPLIT_CALL killed as its put's `val` part was being written: that part is torn and the
    commit record written after every part never was; the `train` part is whole, uncommitted."""
    script, lake = write_script(tmp_path, "split.py", SPLIT_CALL), tmp_path / "lake"
    subprocess.run([sys.executable, str(script), str(lake)], cwd=ROOT, capture_output=True,
                   env=python_env(), timeout=60)
    [val_segment] = segment_files(lake, "trajectories", ["val"])
    tear_last_write(val_segment)
    [log] = log_files(lake)
    tear_last_write(log)
    return lake


def test_a_retried_torn_call_puts_each_trajectory_into_a_batch_once(tmp_path):
    lake = _torn_split_call(tmp_path)
    with ReplayBuffer.sync(lake=lake) as buf:               # restart; the producer retries
        buf.put([traj("t", 0, reward=7.0), traj("v", 0, partition="val", reward=7.0)])
    with ReplayBuffer.sync(lake=lake) as buf:               # restart again; finish t
        buf.update_status(partition="train", uids=["t"], status="running")
        buf.update_status(partition="train", uids=["t"], status="finished")
        batch = buf.sample(1, "train", 1)
        assert batch.table.select(["uid", "session_id", "reward"]).to_pylist() == [
            {"uid": "t", "session_id": 0, "reward": 7.0}]


def test_the_seqs_of_a_torn_call_are_never_handed_out_again(tmp_path):
    lake = _torn_split_call(tmp_path)
    [train_segment] = segment_files(lake, "trajectories", ["train"])
    orphan = pa.ipc.open_stream(train_segment.read_bytes()).read_all()["seq"].to_pylist()
    assert orphan and highest_seq(lake) == max(orphan)      # on disk, invisible
    assert read_table(lake, "trajectories").num_rows == 0
    with ReplayBuffer.sync(lake=lake) as buf:
        buf.put([traj("t", 0, reward=7.0), traj("v", 0, partition="val", reward=7.0)])
    seqs = [s for name in LAKE_TABLES for s in read_table(lake, name)["seq"].to_pylist()]
    assert min(read_table(lake, "trajectories")["seq"].to_pylist()) > max(orphan)
    assert len(seqs) == len(set(seqs))
