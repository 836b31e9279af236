"""Lifecycle and sampling: whole groups, oldest dispatch first, a deterministic
tie-break, blocking with wake-up, timeouts that say why, release, and provenance columns."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pyarrow.compute as pc
import pytest

from pipeline import ReplayBuffer, SampleTimeout, UnknownGroupError
from pipeline.lake.writer import read_table
from tests.support.lake import ROOT, add_group, python_env, traj, write_script


def keys(batch) -> list[tuple[str, int, int]]:
    """(uid, session_id, index) of every row of a batch, in row order."""
    t = batch.table
    return list(zip(t["uid"].to_pylist(), t["session_id"].to_pylist(), t["index"].to_pylist()))


# --- order -------------------------------------------------------------------------------------

def test_oldest_dispatch_comes_first_across_finished_and_failure_groups(buf):
    add_group(buf, "new", 5, [1.0])
    add_group(buf, "old-failed", 2, [0.0], status="failure")
    add_group(buf, "mid", 3, [1.0, 0.0])
    add_group(buf, "old", 2, [1.0])
    batch = buf.sample(6, "train", 3)
    assert batch.uids == ["old-failed", "old", "mid"]
    assert batch.table["status"].to_pylist() == ["failure", "finished", "finished", "finished"]
    assert buf.sample(6, "train", 1).uids == ["new"]


def test_sync_preset_hands_out_failure_groups_even_without_trajectories(buf):
    add_group(buf, "empty-failure", 1, [], status="failure")
    add_group(buf, "ok", 1, [1.0])
    batch = buf.sample(2, "train", 2)
    assert batch.uids == ["empty-failure", "ok"]
    assert keys(batch) == [("ok", 0, 0)]


def test_equal_dispatch_steps_go_in_terminal_arrival_order(buf):
    buf.register(partition="train", uids=["c", "a", "b", "d"], global_steps=1)
    buf.put([traj(u, 0) for u in "abcd"])
    buf.update_status(partition="train", uids=["b"], status="failure")
    buf.update_status(partition="train", uids=["c", "a"], status="running")
    buf.update_status(partition="train", uids=["c", "a"], status="finished")
    buf.update_status(partition="train", uids=["d"], status="finished")
    # neither uid order (a b c d) nor registration order (c a b d): the order they turned terminal
    assert buf.sample(2, "train", 4).uids == ["b", "c", "a", "d"]


TIE_SCRIPT = """
    import json, random, sys
    from pipeline import ReplayBuffer

    buf = ReplayBuffer.sync(poll_interval=0.05)
    uids = [f"{w}-{i}" for i, w in enumerate(
        ["kiwi", "fig", "apple", "date", "plum", "lime", "pear", "yuzu"] * 5)]
    for gs in range(3):
        mine = [u for i, u in enumerate(uids) if i % 3 == gs]
        buf.register(partition="train", uids=mine, global_steps=gs)
        buf.put([{"partition": "train", "uid": u, "session_id": 0, "min_global_steps": 0,
                  "max_global_steps": 0, "reward": 1.0, "prompt_ids": [1],
                  "response_ids": [2]} for u in mine])
    order = list(uids)
    random.Random(7).shuffle(order)                 # the same permutation in every process
    for i in range(0, len(order), 4):               # several uids per status call, too
        buf.update_status(partition="train", uids=order[i:i + 4], status="finished")
    batches = [buf.sample(3, "train", 7).uids for _ in range(5)]
    print(json.dumps({"order": order, "uids": uids, "batches": batches}))
"""


def test_ties_resolve_identically_in_processes_with_different_hash_seeds(tmp_path):
    script = write_script(tmp_path, "ties.py", TIE_SCRIPT)
    procs = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT,
                              env=python_env(PYTHONHASHSEED=seed))
             for seed in ("0", "1", "4242")]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        outs.append(json.loads(out))
    assert outs[0] == outs[1] == outs[2]
    order, uids = outs[0]["order"], outs[0]["uids"]
    gs = {u: i % 3 for i, u in enumerate(uids)}
    expected = sorted(order, key=lambda u: (gs[u], order.index(u)))
    assert [u for b in outs[0]["batches"] for u in b] == expected[:35]


# --- whole groups, once ------------------------------------------------------------------------

def test_a_batch_holds_every_trajectory_of_its_groups_and_nothing_else(buf):
    buf.register(partition="train", uids=["a", "b", "c"], global_steps=0)
    buf.put([traj("a", 0), traj("b", 0), traj("a", 1)])
    buf.put([traj("a", 1, index=1), traj("c", 0, index=0), traj("b", 1, index=0)])
    buf.update_status(partition="train", uids=["a", "b", "c"], status="finished")
    batch = buf.sample(1, "train", 2)
    assert batch.uids == ["a", "b"]
    assert keys(batch) == [("a", 0, 0), ("b", 0, 0), ("a", 1, 0), ("a", 1, 1), ("b", 1, 0)]
    seq = batch.table["seq"].to_pylist()
    assert seq == sorted(seq)                       # rows in arrival order
    assert keys(buf.sample(1, "train", 1)) == [("c", 0, 0)]


def test_a_group_is_never_handed_out_twice(buf):
    for i in range(5):
        add_group(buf, f"g{i}", i % 2, [1.0])
    seen = buf.sample(3, "train", 2).uids + buf.sample(3, "train", 2).uids
    seen += buf.sample(3, "train", 1).uids
    assert sorted(seen) == [f"g{i}" for i in range(5)]
    with pytest.raises(SampleTimeout):
        buf.sample(3, "train", 1, timeout=0.05)
    assert buf.counts("train")["sampled"] == 5


def test_a_sampled_group_accepts_no_late_trajectory(buf):
    add_group(buf, "a", 1, [1.0])
    buf.sample(2, "train", 1)
    with pytest.raises(UnknownGroupError):
        buf.put([traj("a", 1)])


def test_partitions_are_sampled_independently(buf):
    add_group(buf, "t", 0, [1.0])
    add_group(buf, "v", 0, [1.0], partition="val")
    assert buf.sample(1, "val", 1).uids == ["v"]
    assert buf.get_sampleable_count(1, "val") == 0
    assert buf.sample(1, "train", 1).uids == ["t"]


def test_sampleable_count_and_wait_consume_nothing(buf):
    add_group(buf, "a", 0, [1.0])
    add_group(buf, "b", 1, [1.0])
    assert buf.get_sampleable_count(2, "train") == 2
    uids, _ = buf.wait_for_sampleable(2, "train", 2, timeout=1.0)
    assert uids == ["a", "b"]
    assert buf.sample(2, "train", 2).uids == ["a", "b"]


# --- blocking ----------------------------------------------------------------------------------

class Consumer(threading.Thread):
    """Calls ``buf.sample(...)`` in a thread; records the batch (or error) and when it returned."""

    def __init__(self, buf: ReplayBuffer, *args, **kw):
        super().__init__(daemon=True)
        self.buf, self.args, self.kw = buf, args, kw
        self.batch = self.error = self.returned_at = None
        self.start()

    def run(self) -> None:
        try:
            self.batch = self.buf.sample(*self.args, **self.kw)
        except Exception as exc:  # noqa: BLE001 - inspected by the test
            self.error = exc
        self.returned_at = time.monotonic()


def in_thread(fn) -> None:
    """Run ``fn`` in a producer thread of its own and wait for it."""
    t = threading.Thread(target=fn)
    t.start()
    t.join()


def test_blocking_sample_wakes_up_when_a_producer_thread_finishes_a_group(lake):
    with ReplayBuffer.sync(lake=lake, poll_interval=30.0) as buf:
        add_group(buf, "a", 1, [1.0], status="running")
        buf.register(partition="train", uids=["b"], global_steps=1)
        consumer = Consumer(buf, 2, "train", 1)
        time.sleep(0.3)
        assert consumer.is_alive()                  # nothing sampleable: it waits
        in_thread(lambda: buf.put([traj("b", 0)]))
        time.sleep(0.3)
        assert consumer.is_alive()                  # woken, but a trajectory is not a group
        finished_at = time.monotonic()
        in_thread(lambda: buf.update_status(partition="train", uids=["a"], status="finished"))
        consumer.join(10)
        assert not consumer.is_alive() and consumer.error is None
        # poll_interval is 30 s: returning this fast means the producer's notify woke it
        assert consumer.returned_at - finished_at < 5
        assert consumer.batch.uids == ["a"]


def test_many_producer_threads_and_one_consumer_see_every_group_exactly_once(buf):
    def produce(t: int) -> None:
        for i in range(6):
            add_group(buf, f"t{t}-{i}", 0, [float(i), 1.0])

    producers = [threading.Thread(target=produce, args=(t,)) for t in range(4)]
    for p in producers:
        p.start()
    got = []
    for _ in range(8):
        batch = buf.sample(1, "train", 3, timeout=20)
        assert len(batch) == 6                      # 3 whole groups of 2 trajectories
        got += batch.uids
    for p in producers:
        p.join()
    assert sorted(got) == sorted(f"t{t}-{i}" for t in range(4) for i in range(6))


def test_timeout_error_carries_the_counts_per_status(buf):
    add_group(buf, "s", 0, [1.0])
    buf.sample(1, "train", 1)
    add_group(buf, "p", 1, [], status="pending")
    add_group(buf, "r", 1, [1.0], status="running")
    add_group(buf, "f", 1, [1.0])
    add_group(buf, "x", 1, [], status="failure")
    start = time.monotonic()
    with pytest.raises(SampleTimeout) as info:
        buf.sample(2, "train", 3, timeout=0.2)
    assert 0.2 <= time.monotonic() - start < 5
    counts = {"pending": 1, "running": 1, "finished": 1, "failure": 1, "sampled": 1}
    assert info.value.counts == counts
    assert isinstance(info.value, TimeoutError)
    assert "'pending': 1" in str(info.value) and "batch_size=3" in str(info.value)
    assert buf.counts("train") == counts            # a timed-out call consumed nothing


@pytest.mark.parametrize("size", [0, -1])
def test_batch_size_below_one_is_an_error(buf, size):
    add_group(buf, "a", 0, [1.0])
    with pytest.raises(ValueError, match="batch_size"):
        buf.sample(1, "train", size)
    assert buf.get_sampleable_count(1, "train") == 1


# --- release -----------------------------------------------------------------------------------

def test_release_frees_the_batch_from_memory_but_the_lake_keeps_it(buf):
    add_group(buf, "a", 1, [1.0, 0.0])
    add_group(buf, "b", 1, [1.0])
    add_group(buf, "c", 2, [1.0])
    batch = buf.sample(2, "train", 2)
    assert buf.counts("train") == {"pending": 0, "running": 0, "finished": 1, "failure": 0,
                                   "sampled": 2}
    buf.release(batch)
    assert buf.counts("train") == {"pending": 0, "running": 0, "finished": 1, "failure": 0,
                                   "sampled": 0}
    lake_rows = read_table(buf.lake_dir, "trajectories")
    assert sorted(lake_rows["uid"].to_pylist()) == ["a", "a", "b", "c"]
    decisions = read_table(buf.lake_dir, "decisions")
    released = decisions.filter(pc.equal(decisions["kind"], "release"))
    assert sorted(released["uid"].to_pylist()) == ["a", "b"]
    assert set(released["batch_id"].to_pylist()) == {batch.batch_id}
    with pytest.raises(UnknownGroupError):          # released groups stay closed
        buf.put([traj("a", 5)])


def test_release_by_batch_id_works_too(buf):
    add_group(buf, "a", 1, [1.0])
    batch = buf.sample(1, "train", 1)
    buf.release(batch.batch_id)
    assert buf.counts("train")["sampled"] == 0


def test_releasing_an_unknown_or_already_released_batch_raises(buf):
    add_group(buf, "a", 1, [1.0])
    batch = buf.sample(1, "train", 1)
    with pytest.raises(KeyError, match="batch 99"):
        buf.release(99)
    buf.release(batch)
    with pytest.raises(KeyError):
        buf.release(batch)


# --- provenance --------------------------------------------------------------------------------

def test_provenance_columns_for_a_literal_batch(buf):
    buf.register(partition="train", uids=["g"], global_steps=5)
    buf.put([traj("g", 0, min_gs=2, max_gs=4, response=[1, 2, 3]), traj("g", 1, min_gs=4, max_gs=4)])
    buf.update_status(partition="train", uids=["g"], status="finished")
    add_group(buf, "h", 6, [0.0], status="failure", min_gs=5, max_gs=5)
    batch = buf.sample(6, "train", 2)
    prov = batch.table.select(["uid", "batch_id", "step", "global_steps", "status", "span",
                               "staleness", "staleness_worst", "group_span", "times_sampled"])
    assert prov.to_pylist() == [
        {"uid": "g", "batch_id": 0, "step": 6, "global_steps": 5, "status": "finished", "span": 3,
         "staleness": 1, "staleness_worst": 3, "group_span": 2, "times_sampled": 1},
        {"uid": "g", "batch_id": 0, "step": 6, "global_steps": 5, "status": "finished", "span": 1,
         "staleness": 1, "staleness_worst": 1, "group_span": 2, "times_sampled": 1},
        {"uid": "h", "batch_id": 0, "step": 6, "global_steps": 6, "status": "failure", "span": 1,
         "staleness": 0, "staleness_worst": 0, "group_span": 1, "times_sampled": 1},
    ]
    assert (batch.batch_id, batch.step, batch.partition) == (0, 6, "train")
    m = batch.metrics
    assert m["training/off_policy/trajectory_spans/mean"] == pytest.approx(5 / 3)
    assert (m["training/off_policy/trajectory_staleness/max"],
            m["training/off_policy/trajectory_staleness/min"]) == (1, 0)
    assert m["training/off_policy/trajectory_staleness_worst/max"] == 3
    add_group(buf, "k", 6, [1.0])
    assert buf.sample(7, "train", 1).batch_id == 1


def test_prepare_computes_new_groups_aggregates_ahead_and_the_poll_decides_the_same():
    def run(prepare: bool):
        b = ReplayBuffer.async_(max_off_policy_threshold=2, filter_groups_metric="reward",
                                refill_fn=lambda n: n)
        add_group(b, "flat", 3, [1.0, 1.0])
        add_group(b, "stale", 1, [0.0, 1.0])
        add_group(b, "ok", 3, [0.0, 2.0])
        add_group(b, "failed", 3, [], status="failure")
        part = b._state.find("train")
        if prepare:
            assert len(part.candidates.unaggregated) == 4
            b.prepare("train")
            b.prepare("unknown")                       # a partition never seen: nothing to do
            assert not part.candidates.unaggregated and len(part.candidates.alive) == 4
        batch = b.sample(3, "train", 1)
        return batch.uids, batch.metrics, b.counts("train")
    assert run(prepare=True) == run(prepare=False)
    assert run(True)[0] == ["ok"]
