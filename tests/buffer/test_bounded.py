"""Every loop of `sample` is bounded, and nothing owed is lost: DAPO refills capped without
overshoot, the timeout honoured on polls that refill, missing metrics never kept silently,
weighted means never guessed, and a refill_fn that raises does not forget the refill it owed."""
from __future__ import annotations

import time

import pytest

from pipeline import (
    MissingMetricError,
    RefillLimitError,
    ReplayBuffer,
    SampleTimeout,
    StepAggregator,
    UnknownMetricError,
)
from tests.support.policies import Refiller, group, make


def test_max_num_gen_batches_counts_only_refills_of_filtered_groups():
    """Three failures and one flat group are refilled (4 prompts); one refill comes back flat
    and is refilled again: 2 filtered refills, within a cap of 2, however many failures."""
    ref = Refiller(step=1, finish=lambda i: [0.0, 0.0] if i == 0 else [0.0, 1.0])
    buf = make("async", ref, filter_groups_metric="reward", train_batch_size=1,
               max_num_gen_batches=2)
    group(buf, "flat", 1, [1.0, 1.0])
    for i in range(3):
        group(buf, f"f{i}", 1, status="failure")
    batch = buf.sample(1, "train", 1, timeout=5)
    assert ref.calls == [4, 1] and batch.uids == ["refill1"]
    assert batch.metrics["training/rollout_failure/evicted_samples"] == 3


def test_the_refill_cap_is_never_overshot_and_the_error_names_the_reasons_seen():
    ref = Refiller(step=1, finish=lambda i: [0.0, 0.0])
    buf = make("async", ref, filter_groups_metric="reward", train_batch_size=1,
               max_num_gen_batches=3)
    for i in range(2):                       # one poll evicts two: 2 + 2 would pass 3
        group(buf, f"flat{i}", 1, [1.0, 1.0])
    with pytest.raises(RefillLimitError, match=r"zero_variance") as info:
        buf.sample(1, "train", 1, timeout=10)
    assert sum(ref.calls) <= 3
    assert "failure" not in str(info.value)


def test_timeout_is_honoured_by_polls_that_refill_synchronously():
    asked = []

    def refill(n):                           # answers at once with more flat groups: forever
        asked.append(n)
        for i in range(n):
            group(buf, f"r{len(asked)}_{i}", 1, [0.0, 0.0])

    buf = ReplayBuffer.async_(filter_groups_metric="reward", refill_fn=refill, poll_interval=0.05)
    group(buf, "flat", 1, [0.0, 0.0])
    start = time.monotonic()
    with pytest.raises(SampleTimeout):
        buf.sample(1, "train", 1, timeout=0.5)
    assert time.monotonic() - start < 3.0    # not 574 refills later
    assert asked


def test_a_single_trajectory_group_without_the_named_metric_is_an_error():
    buf = make("async", Refiller(step=1), filter_groups_metric="acc")
    group(buf, "one", 1, [1.0], acc=[None])
    with pytest.raises(MissingMetricError, match="one"):
        buf.sample(1, "train", 1, timeout=5)


def test_step_aggregator_requires_the_weight_of_a_mean():
    agg = StepAggregator()
    with pytest.raises(UnknownMetricError, match="weighted by 'n_trajectories'"):
        agg.add({"training/off_policy/trajectory_staleness/mean": 1.0})
    agg.add({"training/off_policy/trajectory_staleness/mean": 1.0}, {"n_trajectories": 1})
    agg.add({"training/off_policy/trajectory_staleness/mean": 2.0}, {"n_trajectories": 3})
    assert agg.result()["training/off_policy/trajectory_staleness/mean"] == 1.75


def test_step_aggregator_takes_the_weights_from_a_batch():
    buf = ReplayBuffer.sync(poll_interval=0.05)
    group(buf, "a", 1, [0.0, 1.0])
    group(buf, "b", 3, [0.0, 1.0, 1.0])
    agg = StepAggregator()
    for _ in range(2):
        agg.add(buf.sample(4, "train", 1, timeout=5))
    # a: 2 rows at staleness 4-1-0 = 3; b: 3 rows at 4-1-2 = 1 -> (2*3 + 3*1) / 5
    assert agg.result()["training/off_policy/trajectory_staleness/mean"] == pytest.approx(9 / 5)


def test_a_refill_fn_that_raises_keeps_its_refill_owed_for_the_next_poll():
    calls = []

    def flaky(n):
        calls.append(n)
        if len(calls) == 1:
            raise ConnectionError("rollout service unavailable")
        for i in range(n):
            group(buf, f"new{i}", 1, [0.0, 1.0])

    buf = ReplayBuffer.async_(filter_groups_metric="reward", refill_fn=flaky, poll_interval=0.05)
    group(buf, "flat", 1, [1.0, 1.0])
    with pytest.raises(ConnectionError):
        buf.sample(1, "train", 1, timeout=5)
    batch = buf.sample(1, "train", 1, timeout=5)      # the owed prompt is asked for again
    assert calls == [1, 1] and batch.uids == ["new0"]


def test_a_version_from_the_future_is_flagged_but_not_changed(caplog):
    buf = ReplayBuffer.sync(poll_interval=0.05)
    buf.register(partition="train", uids=["f"], global_steps=5)
    buf.put([{"partition": "train", "uid": "f", "session_id": 0, "min_global_steps": 4,
              "max_global_steps": 9, "reward": 1.0, "prompt_ids": [1], "response_ids": [2]}])
    buf.update_status(partition="train", uids=["f"], status="finished")
    batch = buf.sample(5, "train", 1, timeout=5)
    assert batch.metrics["training/off_policy/trajectory_staleness/min"] == -5   # as verl
    assert any("from the future" in r.getMessage() for r in caplog.records)


def test_back_pressure_refuses_a_put_past_the_memory_budget_and_accepts_it_after_release():
    import threading

    from pipeline import BufferFullError
    from tests.support.lake import traj
    buf = ReplayBuffer.sync(poll_interval=0.05, max_live_bytes=3000)
    big = [0] * 200                                          # ~800 bytes of response ids
    group(buf, "held", 1, [0.0, 1.0])
    buf.register(partition="train", uids=["p"], global_steps=1)
    buf.put([traj("p", s, response=big) for s in range(2)])  # fits next to "held"
    with pytest.raises(BufferFullError, match="max_live_bytes=3,000"):
        buf.put([traj("p", s, response=big) for s in range(2, 4)])
    assert buf.lookup("train", "p").keys == frozenset({(0, 0), (1, 0)})   # nothing accepted
    batch = buf.sample(1, "train", 1, timeout=5)              # the trainer takes "held" ...
    threading.Timer(0.2, buf.release, [batch]).start()        # ... and releases it soon
    with pytest.raises(BufferFullError):                      # still over: p holds the rest
        buf.put([traj("p", s, response=big * 3) for s in range(2, 4)], timeout=0.5)
    assert buf.put([traj("p", 2, response=[1])], timeout=2.0) == 1


def test_a_put_larger_than_the_budget_is_accepted_into_an_empty_buffer():
    from tests.support.lake import traj
    buf = ReplayBuffer.sync(max_live_bytes=10)
    buf.register(partition="train", uids=["p"], global_steps=1)
    assert buf.put([traj("p", 0, response=[1] * 100)]) == 1


def test_a_put_waiting_on_a_budget_held_by_unfinishable_groups_is_refused_at_once():
    """Every byte held belongs to groups in flight that still lack sessions: no batch can be
    released and no group can finish without the very puts that wait, so waiting (even with
    timeout=None) could never end; the error says so instead of advising to wait."""
    from pipeline import BufferFullError
    from tests.support.lake import traj
    buf = ReplayBuffer.sync(poll_interval=0.05, max_live_bytes=2000)
    big = [0] * 200
    buf.register(partition="train", uids=["a", "b"], global_steps=1, n=2)
    buf.put([traj("a", 0, response=big), traj("b", 0, response=big)])
    with pytest.raises(BufferFullError, match=r"all belong to groups still in flight that lack "
                       r"sessions .* waiting cannot help; raise max_live_bytes"):
        buf.put([traj("a", 1, response=big)], timeout=5)
    assert buf.lookup("train", "a").keys == frozenset({(0, 0)})
    buf.register(partition="train", uids=["c"], global_steps=1, n=1)   # one that can finish
    assert buf.put([traj("c", 0, response=[1])]) == 1
    buf.update_status(partition="train", uids=["c"], status="running")
    buf.update_status(partition="train", uids=["c"], status="finished")
    with pytest.raises(BufferFullError, match=r"sample and release batches"):   # waits now
        buf.put([traj("a", 1, response=big)], timeout=0.1)
