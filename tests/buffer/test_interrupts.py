"""An interrupt (Ctrl-C) or a failing write at any point of any call leaves the buffer, in memory
and on disk, as if the call never happened or as if it completed, and the same process goes on:
retries, a reopen and the audits see every acknowledged row exactly once (jobs/dev/crash_interrupt.py
strikes at the crash matrix's write points; `replaylake dev soak` strikes at all of them)."""
from __future__ import annotations

import os
import signal
import threading

import pytest

from jobs.dev import crash_interrupt
from jobs.dev.crash_workload import reference
from pipeline import ReplayBuffer, interrupts
from pipeline.analysis.views import connect
from pipeline.errors import BufferFullError, ConfigError, InvariantError, LakeError
from pipeline.lake import kill as lake_kill
from pipeline.lake.damage import check
from pipeline.lake.writer import read_table
from sql.loader import run

CALLS = ("register", "update_status", "put", "sample", "release")
SYNC_POINTS = ("dir_synced", "data_synced", "sum_synced")


def traj(uid: str, s: int, reward: float = 1.0, part: str = "train", step: int = 0) -> dict:
    return {"partition": part, "uid": uid, "session_id": s, "min_global_steps": step,
            "max_global_steps": step, "reward": reward, "prompt_ids": [1, 2],
            "response_ids": list(range(5000))}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("strikes")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["async", "sync"])
def test_a_strike_at_each_write_point_leaves_every_call_whole_and_the_run_exact(workdir, kind):
    ref = reference(kind, workdir)
    todo = crash_interrupt.chosen(ref, every=16)
    assert {t.rsplit(":", 1)[0] for t, _ in todo} == set(ref.points)   # every point, both ways
    problems, struck = crash_interrupt.run_strikes(ref, todo, workdir / kind)
    assert problems == []
    calls = {k.split(":")[0] for k in struck}
    assert calls >= set(CALLS), calls          # every kind of call was struck and survived
    assert {k.split(": ")[1] for k in struck} == {"KeyboardInterrupt", "LakeError"}


@pytest.mark.slow
def test_a_strike_around_each_fsync_leaves_the_run_exact(workdir):
    ref = reference("async", workdir, fsync=True)
    todo = [(t, how) for t, how in crash_interrupt.chosen(ref, every=10_000)
            if t.rsplit(":", 1)[0].split(".", 1)[1] in SYNC_POINTS]
    assert len(todo) >= 20
    problems, _ = crash_interrupt.run_strikes(ref, todo, workdir / "fsync")
    assert problems == []


def test_ctrl_c_during_a_large_put_is_held_until_the_put_is_whole(lake, monkeypatch):
    """The notebook case: Ctrl-C while a put of large trajectories is being written (a real
    SIGINT, sent with the data in the file and its checksum record not yet). The put completes,
    then KeyboardInterrupt is raised; running the cell again is an identical retry, a no-op
    (nothing twice), the process goes on, and the lake opens with every row once."""
    monkeypatch.setenv(lake_kill.ENV, "trajectories.data_written:1")
    monkeypatch.setenv(lake_kill.HOW_ENV, "interrupt")
    buf = ReplayBuffer.sync(lake=lake, poll_interval=0.01)
    buf.register(partition="train", uids=["a", "b"], global_steps=0, n=2)
    with pytest.raises(KeyboardInterrupt):
        buf.put([traj("a", 0), traj("a", 1)])
    assert buf.lookup("train", "a").sessions == {0, 1}        # it completed
    retry = buf.put([traj("a", 0), traj("a", 1)])               # the retry: a no-op
    assert (retry, retry.already_stored) == (0, 2)
    buf.put([traj("b", 0, 0.0), traj("b", 1)])                  # the same process goes on
    buf.update_status(partition="train", uids=["a", "b"], status="finished")
    batch = buf.sample(1, "train", 2, timeout=5)
    keys = list(zip(batch.table["uid"].to_pylist(), batch.table["session_id"].to_pylist()))
    assert sorted(keys) == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    buf.close()
    assert not check(lake).damaged
    again = ReplayBuffer.sync(lake=lake)
    assert sorted(again.held_batches("train")[batch.batch_id]) == [
        ("a", 0, 0), ("a", 1, 0), ("b", 0, 0), ("b", 1, 0)]
    again.close()
    assert read_table(lake, "trajectories").num_rows == 4


def test_a_failed_write_is_cut_back_so_the_retry_lands_once_and_the_lake_opens(lake,
                                                                              monkeypatch):
    """An exception after the write and its checksum record are in the file (an fsync that
    fails) is taken back: the lake holds nothing of the call and memory agrees."""
    buf = ReplayBuffer.sync(lake=lake)
    buf.register(partition="train", uids=["a"], global_steps=0, n=1)
    monkeypatch.setenv(lake_kill.ENV, "trajectories.sum_written:1")
    monkeypatch.setenv(lake_kill.HOW_ENV, "raise")
    lake_kill.arm()
    with pytest.raises(LakeError, match="nothing of this call was written"):
        buf.put([traj("a", 0)])
    assert buf.lookup("train", "a").sessions == frozenset()
    assert read_table(lake, "trajectories").num_rows == 0       # cut back, not merely ignored
    buf.put([traj("a", 0)])
    buf.close()
    assert not check(lake).damaged
    assert read_table(lake, "trajectories")["uid"].to_pylist() == ["a"]


def test_a_write_that_cannot_be_taken_back_stops_the_writer_until_the_lake_is_reopened(
        lake, monkeypatch):
    buf = ReplayBuffer.sync(lake=lake)
    buf.register(partition="train", uids=["a"], global_steps=0, n=1)
    real = os.ftruncate

    def refuse(fd: int, size: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setenv(lake_kill.ENV, "trajectories.sum_written:1")
    monkeypatch.setenv(lake_kill.HOW_ENV, "raise")
    lake_kill.arm()
    monkeypatch.setattr(os, "ftruncate", refuse)
    with pytest.raises(LakeError, match="could not be taken back"):
        buf.put([traj("a", 0)])
    monkeypatch.setattr(os, "ftruncate", real)
    with pytest.raises(LakeError, match="open the lake again"):   # no write is accepted now
        buf.register(partition="train", uids=["b"], global_steps=0, n=1)
    buf.close()
    again = ReplayBuffer.sync(lake=lake)            # what is on disk, exactly once
    assert again.lookup("train", "a").sessions == {0}
    assert again.lookup("train", "b") is None
    again.close()


def test_a_state_whose_memory_failed_to_follow_the_lake_refuses_further_changes(lake):
    buf = ReplayBuffer.sync(lake=lake)
    buf._state.add_listener(lambda *a: None)

    def broken_apply(table, rows, effects=None):
        raise MemoryError("out of memory")

    buf._state.apply = broken_apply
    with pytest.raises(InvariantError, match="open the lake again"):
        buf.register(partition="train", uids=["a"], global_steps=0, n=1)
    with pytest.raises(InvariantError, match="no longer matches"):
        buf.register(partition="train", uids=["b"], global_steps=0, n=1)
    buf.close()
    again = ReplayBuffer.sync(lake=lake)
    assert again.lookup("train", "a") is not None      # acknowledged on disk: restored
    again.close()


def test_a_sample_interrupted_after_choosing_its_batch_hands_the_same_batch_to_the_retry(
        lake, monkeypatch):
    buf = ReplayBuffer.sync(lake=lake, poll_interval=0.01)
    buf.register(partition="train", uids=["a", "b"], global_steps=0, n=2)
    buf.put([traj("a", 0, 0.0), traj("a", 1), traj("b", 0, 0.0), traj("b", 1)])
    buf.update_status(partition="train", uids=["a", "b"], status="finished")
    monkeypatch.setenv(lake_kill.ENV, "decisions.sum_written:1")     # the selection's write
    monkeypatch.setenv(lake_kill.HOW_ENV, "interrupt")
    lake_kill.arm()
    with pytest.raises(KeyboardInterrupt):
        buf.sample(1, "train", 1, timeout=5)
    first = buf.sample(1, "train", 1, timeout=5)          # the cell run again
    assert first.uids == ["a"] and list(buf.held_batches("train")) == [first.batch_id]
    assert first.metrics                                  # written once, handed out with it
    names = read_table(lake, "metrics")["name"].to_pylist()
    assert len(names) == len(set(names))
    second = buf.sample(1, "train", 1, timeout=5)
    assert second.uids == ["b"]                           # the next call moves on
    buf.close()
    dec = read_table(lake, "decisions")
    assert [(r["uid"], r["batch_id"]) for r in dec.to_pylist() if r["kind"] == "select"] == [
        ("a", first.batch_id), ("b", second.batch_id)]    # each group selected once
    again = ReplayBuffer.sync(lake=lake)
    assert sorted(again.held_batches("train")) == [first.batch_id, second.batch_id]
    again.close()


def test_a_refill_fn_that_raises_is_logged_as_failed_and_its_evictions_reach_the_next_batch(
        lake):
    calls = []

    def refill(k: int) -> None:
        calls.append(k)
        if len(calls) == 1:
            raise ConnectionError("rollout side unreachable")
        uids = [f"r{len(calls)}x{i}" for i in range(k)]
        buf.register(partition="train", uids=uids, global_steps=1, n=2)
        buf.put([t for u in uids for t in (traj(u, 0, 0.0), traj(u, 1))])
        buf.update_status(partition="train", uids=uids, status="finished")

    buf = ReplayBuffer.async_(lake=lake, filter_groups_metric="reward", refill_fn=refill,
                              poll_interval=0.01)
    buf.register(partition="train", uids=["flat", "good"], global_steps=1, n=2)
    buf.put([traj("flat", 0), traj("flat", 1), traj("good", 0, 0.0), traj("good", 1)])
    buf.update_status(partition="train", uids=["flat", "good"], status="finished")
    with pytest.raises(ConnectionError):
        buf.sample(1, "train", 2, timeout=5)
    batch = buf.sample(1, "train", 2, timeout=5)         # asks again, then samples
    assert calls == [1, 1]
    assert batch.metrics["training/filter_groups/evicted_samples"] == 1   # not lost
    buf.close()
    dec = read_table(lake, "decisions").to_pylist()
    refills = [(r["kind"], r["count"], r["replaces"], r["reason"]) for r in dec
               if r["kind"].startswith("refill")]
    assert refills == [("refill", 1, ["flat"], "replace_evicted"),
                       ("refill_failed", 1, ["flat"], "ConnectionError"),
                       ("refill", 1, ["flat"], "replace_evicted")]
    con = connect(lake)
    polls = run(con, "decision_log").to_pylist()
    assert sum(r["refilled"] for r in polls) == 1 and sum(r["refill_failed"] for r in polls) == 1
    stages = run(con, "lineage", uid="flat").column("stage").to_pylist()
    assert stages.count("replaced") == 1                 # replaced once, not twice


def test_held_defers_a_signal_to_the_end_of_the_block_and_then_raises_it():
    seen = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts.held():
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):                        # the handler ran meanwhile, held
                pass
            seen.append("block finished")
    assert seen == ["block finished"]


def test_ctrl_c_still_stops_a_sample_that_waits_at_once(buf):
    buf.register(partition="train", uids=["a"], global_steps=0, n=2)     # never finishes
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    import time
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        buf.sample(1, "train", 1, timeout=30)
    assert time.monotonic() - t0 < 10                    # not held until the timeout
    buf.register(partition="train", uids=["b"], global_steps=0, n=2)     # and it goes on


def test_release_refuses_what_is_not_a_batch_by_name(buf):
    with pytest.raises(ConfigError, match="not a batch; pass the Batch"):
        buf.release("batch-0")
    with pytest.raises(ConfigError, match="not a batch"):
        buf.release(0.0)
    with pytest.raises(ConfigError, match="not a batch"):
        buf.release(True)


def test_a_put_larger_than_the_whole_budget_is_refused_at_once_not_after_its_timeout(lake):
    import time
    buf = ReplayBuffer.sync(lake=lake, max_live_bytes=30_000)
    buf.register(partition="train", uids=["a", "b"], global_steps=0, n=8)
    buf.put([traj("a", 0)])
    t0 = time.monotonic()
    with pytest.raises(BufferFullError, match="larger than the whole max_live_bytes"):
        buf.put([traj("b", s) for s in range(8)], timeout=30)
    assert time.monotonic() - t0 < 10
    buf.close()


def test_ctrl_c_in_the_main_thread_never_leaves_the_lock_held_for_other_threads(tmp_path):
    """Ctrl-C lands in the main thread at random points of its calls while another thread uses
    the buffer: after each interrupt the main thread holds no lock, so the other thread keeps
    going (a lock taken in Python code before the call's body could be left held: the main
    thread, re-entrant, went on, while every other thread waited on it for good)."""
    from tests.support.lake import run_python, write_script
    script = write_script(tmp_path, "pester.py", """
        import os, random, signal, threading, time
        from pipeline import ReplayBuffer

        armed = []

        def interrupt(signum, frame):      # Ctrl-C, landing only inside the buffer's calls
            if armed and frame is not None and frame.f_code.co_filename != __file__:
                raise KeyboardInterrupt

        signal.signal(signal.SIGINT, interrupt)
        buf = ReplayBuffer.async_(max_off_policy_threshold=None, poll_interval=0.01)
        buf.register(partition="train", uids=["g"], global_steps=1, n=1)
        calm, stop, calls = threading.Event(), threading.Event(), [0]

        def other():
            while not stop.is_set():
                buf.counts("train"); buf.get_sampleable_count(1, "train"); calls[0] += 1

        def pester():
            while not calm.is_set():
                time.sleep(random.uniform(0.0002, 0.002)); os.kill(os.getpid(), signal.SIGINT)

        threading.Thread(target=other, daemon=True).start()
        threading.Thread(target=pester, daemon=True).start()
        hit, leaked, end = 0, 0, time.monotonic() + 3
        armed.append(True)
        while time.monotonic() < end:
            try:
                buf.counts("train"); buf.lookup("train", "g")
            except KeyboardInterrupt:
                hit += 1
                leaked += buf._state.locked()._is_owned()
        armed.clear()
        calm.set()
        time.sleep(0.05)
        before = calls[0]
        time.sleep(0.3)
        moving = calls[0] > before        # the other thread still gets the lock
        stop.set()
        print(hit, leaked, moving)
    """)
    hit, leaked, moving = run_python(script, timeout=60).stdout.split()
    assert int(hit) > 100                 # the interrupts did land inside calls
    assert leaked == "0" and moving == "True"


def _strike(monkeypatch, target: str) -> None:
    """A disk that fails at ``target`` (an OSError raised there, after a torn half write)."""
    monkeypatch.setenv(lake_kill.ENV, target)
    monkeypatch.setenv(lake_kill.HOW_ENV, "raise")
    lake_kill.arm()


def _landing_refill(bufs: list, asked: list):
    """A refill_fn whose prompts land at once, finished with a reward spread (``bufs[0]`` is
    the buffer; ``asked`` gets each ask's count)."""
    def refill(k: int) -> None:
        asked.append(k)
        uids, buf = [f"r{len(asked)}x{i}" for i in range(k)], bufs[0]
        buf.register(partition="train", uids=uids, global_steps=1, n=2)
        buf.put([t for u in uids for t in (traj(u, 0, 0.0), traj(u, 1))])
        buf.update_status(partition="train", uids=uids, status="finished")
    return refill


def _refills(lake) -> list[tuple]:
    return [(r["kind"], r["count"], r["replaces"]) for r in read_table(lake, "decisions").to_pylist()
            if r["kind"].startswith("refill")]


def test_a_poll_whose_eviction_and_refill_write_fails_writes_neither_and_the_retry_does_both(
        lake, monkeypatch):
    """A poll's evictions and the refill they earn are one write: when it fails, neither is in
    memory or the lake, and the retry evicts, refills and reports each group once."""
    asked, bufs = [], []
    buf = ReplayBuffer.async_(lake=lake, filter_groups_metric="reward",
                              refill_fn=_landing_refill(bufs, asked), poll_interval=0.01)
    bufs.append(buf)
    buf.register(partition="train", uids=["flat", "good"], global_steps=1, n=2)
    buf.put([traj("flat", 0), traj("flat", 1), traj("good", 0, 0.0), traj("good", 1)])
    buf.update_status(partition="train", uids=["flat", "good"], status="finished")
    _strike(monkeypatch, "decisions.data_written:1")     # the poll's evict + refill write
    with pytest.raises(LakeError, match="nothing of this call was written"):
        buf.sample(1, "train", 2, timeout=5)
    assert read_table(lake, "decisions").num_rows == 0 and asked == []
    assert buf.counts("train")["finished"] == 2          # flat is still there: nothing applied
    batch = buf.sample(1, "train", 2, timeout=5)
    assert asked == [1] and sorted(batch.uids) == ["good", "r1x0"]
    assert batch.metrics["training/filter_groups/evicted_samples"] == 1   # counted once
    buf.close()
    dec = read_table(lake, "decisions").to_pylist()
    assert [(r["kind"], r["uid"]) for r in dec if r["kind"] == "evict"] == [("evict", "flat")]
    assert _refills(lake) == [("refill", 1, ["flat"])]


def test_dapo_credit_of_an_earlier_poll_stays_owed_when_a_later_polls_write_fails(
        lake, monkeypatch):
    """Sync DAPO: poll 0 evicts z (credit 2) with no free slot, so its credit waits; poll 1
    evicts p1 and would dispatch one prompt of z's credit, in the write that fails. z's eviction
    is written and no poll finds it again: the prompt it earned stays owed, and the next call
    asks for it with the ones it earns itself."""
    asked, bufs = [], []
    buf = ReplayBuffer.sync(lake=lake, filter_groups_metric="reward",
                            refill_fn=_landing_refill(bufs, asked), train_batch_size=2,
                            gen_batch_size=1, poll_interval=0.01)
    bufs.append(buf)
    buf.register(partition="train", uids=["z", "p1", "p2"], global_steps=1, n=2)
    buf.put([traj("z", 0), traj("z", 1)])
    buf.update_status(partition="train", uids=["z"], status="finished")
    buf.update_status(partition="train", uids=["p1", "p2"], status="running")
    _strike(monkeypatch, "decisions.data_written:2")     # poll 1's evict + refill write

    def land_p1() -> None:                 # once poll 0 evicted z: p1 lands, all-correct
        while buf.lookup("train", "z") is not None and buf.counts("train").get("finished"):
            threading.Event().wait(0.005)
        buf.put([traj("p1", 0), traj("p1", 1)])
        buf.update_status(partition="train", uids=["p1"], status="finished")

    lander = threading.Thread(target=land_p1)
    lander.start()
    with pytest.raises(LakeError, match="nothing of this call was written"):
        buf.sample(1, "train", 2, timeout=10)
    lander.join()
    assert asked == []
    assert [r["uid"] for r in read_table(lake, "decisions").to_pylist()] == ["z"]   # poll 0's
    buf.put([traj("p2", 0, 0.0), traj("p2", 1)])
    buf.update_status(partition="train", uids=["p2"], status="finished")
    batch = buf.sample(1, "train", 2, timeout=10)
    # the new call evicts p1 again (credit 2, two free slots): 2 prompts, plus the 1 owed for z
    assert _refills(lake) == [("refill", 3, ["z", "p1"])] and asked == [3]
    assert len(batch.uids) == 2
    buf.close()


def test_a_selection_whose_write_fails_discards_nothing_and_the_retry_counts_the_surplus_once(
        lake, monkeypatch):
    """Sync DAPO: the surplus discarded, the selection and the batch's metric rows are one
    write. Failing in its metric rows' part, none of it is in memory or the lake; the retry
    discards c, selects a and b and reports the discard once."""
    buf = ReplayBuffer.sync(lake=lake, filter_groups_metric="reward", refill_fn=lambda n: None,
                            train_batch_size=2, gen_batch_size=3, poll_interval=0.01)
    buf.register(partition="train", uids=["a", "b", "c"], global_steps=1, n=2)
    buf.put([traj(u, s, float(s)) for u in ("a", "b", "c") for s in (0, 1)])
    buf.update_status(partition="train", uids=["a", "b", "c"], status="finished")
    _strike(monkeypatch, "metrics.data_written:1")       # the selection's write, its last part
    with pytest.raises(LakeError, match="nothing of this call was written"):
        buf.sample(1, "train", 2, timeout=5)
    assert read_table(lake, "decisions").num_rows == read_table(lake, "metrics").num_rows == 0
    assert buf.counts("train")["finished"] == 3 and buf.held_batches("train") == {}
    batch = buf.sample(1, "train", 2, timeout=5)
    assert batch.uids == ["a", "b"]
    assert batch.metrics["training/filter_groups/discarded_surplus_samples"] == 1
    buf.close()
    dec = read_table(lake, "decisions").to_pylist()
    assert [(r["kind"], r["uid"]) for r in dec] == [("discard", "c"), ("select", "a"),
                                                    ("select", "b")]
    assert len({r["seq"] for r in dec} | set(read_table(lake, "metrics")["seq"].to_pylist())) \
        == len(dec) + len(batch.metrics)
