"""What a partition owes refill_fn lives in the decision rows: a restart owes what the buffer
owed before it, because restore replays the same rows through the same apply."""
from __future__ import annotations

import pytest

from pipeline import ReplayBuffer, SampleTimeout
from pipeline.lake import read_table
from tests.support.policies import group, rows


def _owed(buf: ReplayBuffer, partition: str = "train") -> tuple[int, list[str]]:
    part = buf._state.find(partition)
    return part.refill_owed, list(part.refill_replaces)


def _flaky(calls: list[int], fail: int):
    def refill(n: int) -> None:
        calls.append(n)
        if len(calls) <= fail:
            raise ConnectionError("rollout service unavailable")
    return refill


def test_a_restart_owes_the_prompts_of_a_refill_that_failed(tmp_path) -> None:
    calls: list[int] = []
    buf = ReplayBuffer.async_(lake=tmp_path, filter_groups_metric="reward",
                              refill_fn=_flaky(calls, fail=1), poll_interval=0.05)
    group(buf, "flat0", 1, [1.0, 1.0])
    group(buf, "flat1", 1, [0.0, 0.0])
    with pytest.raises(ConnectionError):
        buf.sample(1, "train", 1, timeout=5)
    live = _owed(buf)
    buf.close()
    assert live == (2, ["flat0", "flat1"])
    again = ReplayBuffer.async_(lake=tmp_path, filter_groups_metric="reward",
                                refill_fn=_flaky(calls, fail=0), poll_interval=0.05)
    assert _owed(again) == live
    group(again, "ok", 1, [0.0, 1.0])
    assert again.sample(1, "train", 1, timeout=5).uids == ["ok"]
    assert calls == [2, 2]                   # the restarted buffer asked for what it owed
    assert _owed(again) == (0, [])
    again.close()


def test_a_restart_owes_nothing_for_a_refill_that_was_served(tmp_path) -> None:
    calls: list[int] = []

    def refill(n: int) -> None:
        calls.append(n)
        for i in range(n):
            group(buf, f"new{i}", 1, [0.0, 1.0])

    buf = ReplayBuffer.async_(lake=tmp_path, filter_groups_metric="reward", refill_fn=refill,
                              poll_interval=0.05)
    group(buf, "flat", 1, [1.0, 1.0])
    assert buf.sample(1, "train", 1, timeout=5).uids == ["new0"]
    live = _owed(buf)
    buf.close()
    assert live == (0, []) and calls == [1]
    again = ReplayBuffer.async_(lake=tmp_path, filter_groups_metric="reward", refill_fn=refill,
                                poll_interval=0.05)
    assert _owed(again) == live
    again.close()


def test_a_refill_that_failed_twice_is_owed_once_after_a_restart(tmp_path) -> None:
    calls: list[int] = []
    buf = ReplayBuffer.async_(lake=tmp_path, filter_groups_metric="reward",
                              refill_fn=_flaky(calls, fail=2), poll_interval=0.05)
    group(buf, "flat", 1, [1.0, 1.0])
    for _ in range(2):
        with pytest.raises(ConnectionError):
            buf.sample(1, "train", 1, timeout=5)
    live = _owed(buf)
    buf.close()
    assert live == (1, ["flat"]) and calls == [1, 1]
    again = ReplayBuffer.async_(lake=tmp_path, filter_groups_metric="reward",
                                refill_fn=_flaky(calls, fail=0), poll_interval=0.05)
    assert _owed(again) == live
    again.close()


# --- what memory alone used to know: prompts held back, an ask nobody registered, the evictions
# --- of a call that raised -----------------------------------------------------------------------

def _admit_run(lake, reopen: bool) -> tuple[list[int], list[str]]:
    """admit with capacity 1: four stale groups evicted at step 5 are owed, asked one, two, one
    as capacity frees; with ``reopen`` the buffer is closed and reopened between the steps."""
    asks: list[int] = []
    made = iter(range(100))
    at = {"step": 5}

    def refill(n: int) -> None:
        asks.append(n)
        holder[0].register(partition="train", uids=[f"r{next(made)}" for _ in range(n)],
                           global_steps=at["step"])

    kw = dict(lake=lake, refill_fn=refill, max_off_policy_threshold=2,
              max_off_policy_strategy="admit", train_batch_size=2, poll_interval=0.05)
    holder = [ReplayBuffer.async_(**kw)]
    buf = holder[0]
    for u in ("s1", "s2", "s3", "s4"):
        group(buf, u, 3, [0.0, 1.0])
    for u in ("f1", "f2"):
        group(buf, u, 5, [0.0, 1.0])
    group(buf, "i1", 5, status="running")
    buf.release(buf.sample(5, "train", 2, timeout=5))
    if reopen:
        buf.close()
        holder[0] = buf = ReplayBuffer.async_(**kw)
    selected = []
    for step in (6, 7):
        at["step"] = step
        for u in [g for g in ["i1", *(f"r{i}" for i in range(100))]
                  if (v := buf.lookup("train", g)) is not None and v.status == "running"
                  or v is not None and v.status == "pending"]:
            buf.put(rows(u, [0.0, 1.0], version=step - 2))
            buf.update_status(partition="train", uids=[u], status="finished")
        batch = buf.sample(step, "train", 2, timeout=5)
        selected += batch.uids
        buf.release(batch)
    buf.close()
    return asks, selected


def test_prompts_admission_held_back_are_owed_after_a_restart(tmp_path) -> None:
    """A `refill_deferred` row records what admission held back: a reopened buffer asks for it
    as the running one did (it used to forget it: nothing owed, nothing asked, and the next
    sample waited for groups nobody would dispatch)."""
    running = _admit_run(tmp_path / "running", reopen=False)
    reopened = _admit_run(tmp_path / "reopened", reopen=True)
    assert running[0] == [1, 2, 1]
    assert reopened == running


def test_an_ask_nobody_registered_is_owed_again_by_reissue(tmp_path, caplog) -> None:
    """refill_fn returned (the ask counts as served) and the process stopped before any group
    of it was registered: the restarted buffer says so, and `reissue` (the rollout side is
    gone) owes those prompts again, in the lake too: the next sample asks for them."""
    calls: list[int] = []
    buf = ReplayBuffer.async_(lake=tmp_path, filter_groups_metric="reward",
                              refill_fn=calls.append, poll_interval=0.05)
    group(buf, "flat", 1, [1.0, 1.0])
    group(buf, "ok", 1, [0.0, 1.0])
    assert buf.sample(1, "train", 1, timeout=5).uids == ["ok"]
    assert calls == [1] and _owed(buf) == (0, [])
    buf.close()
    with caplog.at_level("WARNING", logger="replaylake"):
        again = ReplayBuffer.async_(lake=tmp_path, filter_groups_metric="reward",
                                    refill_fn=calls.append, poll_interval=0.05)
    assert "1 prompt(s) of the last refill ask of partition 'train' have no registered group" \
        in caplog.text
    assert _owed(again) == (0, [])           # a rollout side still alive may yet register them
    again.reissue(2)
    again.close()                            # the debt is in the lake: a restart keeps it
    third = ReplayBuffer.async_(lake=tmp_path, filter_groups_metric="reward",
                                refill_fn=calls.append, poll_interval=0.05)
    group(third, "later", 2, [0.0, 1.0])
    third.sample(2, "train", 1, timeout=5)
    assert calls == [1, 1]
    assert third._state.find("train").refill_deferred == (0, [])
    third.close()


def test_an_ask_whose_groups_registered_stays_served_after_a_restart(tmp_path) -> None:
    calls: list[int] = []

    def refill(n: int) -> None:
        calls.append(n)
        buf.register(partition="train", uids=[f"new{i}" for i in range(n)], global_steps=1)

    buf = ReplayBuffer.async_(lake=tmp_path, filter_groups_metric="reward", refill_fn=refill,
                              poll_interval=0.05)
    group(buf, "flat", 1, [1.0, 1.0])
    group(buf, "ok", 1, [0.0, 1.0])
    buf.sample(1, "train", 1, timeout=5)
    buf.close()
    again = ReplayBuffer.async_(lake=tmp_path, filter_groups_metric="reward", refill_fn=refill,
                                poll_interval=0.05)
    assert _owed(again) == (0, []) and calls == [1]
    again.close()


def test_evictions_of_a_call_that_raised_are_reported_after_a_restart(tmp_path) -> None:
    """A sample that evicted and then timed out owes its eviction metrics to the partition's
    next batch: in the same process and after a reopen alike (they used to be lost there)."""
    kw = dict(lake=tmp_path, max_off_policy_threshold=2, poll_interval=0.05)
    buf = ReplayBuffer.async_(**kw)
    group(buf, "old", 1, [0.0, 1.0])
    with pytest.raises(SampleTimeout):
        buf.sample(4, "train", 1, timeout=0.2)
    buf.close()
    again = ReplayBuffer.async_(**kw)
    group(again, "new", 4, [0.0, 1.0])
    got = again.sample(4, "train", 1, timeout=5).metrics
    assert got["training/off_policy/evicted_samples"] == 1
    assert got["training/off_policy/evicted_samples_staleness/max"] == 4.0
    group(again, "next", 5, [0.0, 1.0])
    assert "training/off_policy/evicted_samples" not in again.sample(5, "train", 1, timeout=5).metrics
    again.close()


DISCARDER = """
    import sys
    from pipeline import ReplayBuffer
    from tests.support.lake import write_apart
    from tests.support.policies import group
    if sys.argv[2:] == ["apart"]:         # as replaylake wrote before 2026-12
        write_apart()
    buf = ReplayBuffer.sync(lake=sys.argv[1], filter_groups_metric="reward",
                            refill_fn=lambda n: None, train_batch_size=2, gen_batch_size=3)
    for uid in ("a", "b", "c"):
        group(buf, uid, 1, [0.0, 1.0])
    buf.sample(1, "train", 2)             # discards c, selects a and b
"""


@pytest.mark.parametrize("apart", [False, True])
def test_discards_of_a_call_that_died_after_its_first_write_are_reported_once(
        tmp_path, apart) -> None:
    """The sync DAPO surplus is discarded in the selection's own write: killed right after it,
    the restart holds the batch (its metric rows report the discard) and no later batch
    reports the discard again. A lake written the earlier way (the discard, then the
    selection) killed between the two: the restart knows c is gone and reports the discard with
    the partition's next batch, as the same process reports the discards of a call that
    raised."""
    import signal
    import subprocess
    import sys

    from tests.support.lake import ROOT, python_env, write_script
    script, lake = write_script(tmp_path, "discarder.py", DISCARDER), tmp_path / "lake"
    proc = subprocess.run([sys.executable, str(script), str(lake), *(["apart"] if apart else [])],
                          cwd=ROOT, capture_output=True, text=True,
                          env=python_env(REPLAYLAKE_KILL_AT="decisions.acked:1"), timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    kw = dict(lake=lake, filter_groups_metric="reward", refill_fn=lambda n: None,
              train_batch_size=2, gen_batch_size=3)
    surplus = {"training/filter_groups/discarded_surplus_samples": 1}
    with ReplayBuffer.sync(**kw) as again:
        assert again.counts("train")["finished"] == (2 if apart else 0)   # c is gone
        if not apart:
            assert {r["name"]: r["value"] for r in read_table(lake, "metrics").to_pylist()
                    if r["name"] in surplus} == surplus                   # reported once ...
            again.release(again.held_batch(0))
            for uid in ("d", "e"):
                group(again, uid, 2, [0.0, 1.0])
        batch = again.sample(1 if apart else 2, "train", 2, timeout=5)
        assert batch.uids == (["a", "b"] if apart else ["d", "e"])
        assert batch.eviction_metrics == (surplus if apart else {})       # ... never twice
        again.release(batch)


def test_evictions_a_wait_for_sampleable_reported_are_not_reported_again_after_a_restart(
        tmp_path) -> None:
    """The wait's report is in the lake (metric rows without a batch); the restored buffer's
    next batch reported those evictions a second time."""
    from pipeline.lake import read_table
    kw = dict(lake=tmp_path, filter_groups_metric="reward", refill_fn=lambda n: None,
              max_off_policy_threshold=2)
    with ReplayBuffer.async_(**kw) as buf:
        group(buf, "z", 2, [1.0, 1.0])
        group(buf, "b", 2, [0.0, 1.0])
        ready = buf.wait_for_sampleable(3, "train", 1, timeout=5)
        assert ready.metrics == {"training/filter_groups/evicted_samples": 1}
    reports = [(r["batch_id"], r["name"], r["value"])
               for r in read_table(tmp_path, "metrics").to_pylist()]
    assert reports == [(None, "training/filter_groups/evicted_samples", 1.0)]
    with ReplayBuffer.async_(**kw) as again:
        batch = again.sample(3, "train", 1, timeout=5)
        assert batch.uids == ["b"]
        assert batch.eviction_metrics == {} and batch.filtered_reward_counts == {}
