"""The eviction, gating, filtering, failure and refill rules, scenario by scenario."""
from __future__ import annotations

import time

import pytest

from pipeline import (
    EmptyBatchError,
    MissingMetricError,
    RefillLimitError,
    ReplayBuffer,
)
from tests.support.policies import Background, Refiller, group, make, wait_until

EV = "training/off_policy/evicted_samples"
STALE = "training/off_policy/evicted_samples_staleness"
FILTERED = "training/filter_groups/evicted_samples"
SURPLUS = "training/filter_groups/discarded_surplus_samples"
FAILED = "training/rollout_failure/evicted_samples"


# --- stale drop --------------------------------------------------------------------------------

def test_async_drop_evicts_span_over_threshold_refills_and_returns_the_refill():
    ref = Refiller(step=5)
    buf = make("async", ref, max_off_policy_threshold=2)
    for uid, gs in (("g0", 0), ("g4", 4), ("g5", 5)):
        group(buf, uid, gs, [0.0, 1.0])
    batch = buf.sample(5, "train", 3, timeout=5)
    assert ref.calls == [1]
    assert batch.uids == ["g4", "g5", "refill0"]
    assert batch.metrics[EV] == 1
    assert batch.metrics[f"{STALE}/mean"] == 6.0
    assert batch.metrics[f"{STALE}/max"] == 6 and batch.metrics[f"{STALE}/min"] == 6


def test_stale_group_at_exact_threshold_is_kept_and_one_over_is_evicted():
    buf = make("async", max_off_policy_threshold=3)
    group(buf, "span3", 3, [0.0, 1.0])   # g=5: 5 - 3 + 1 = 3 == T -> kept
    group(buf, "span4", 2, [0.0, 1.0])   # 4 > T -> evicted
    batch = buf.sample(5, "train", 1, timeout=5)
    assert batch.uids == ["span3"]
    assert batch.metrics[EV] == 1 and batch.metrics[f"{STALE}/mean"] == 4.0


def test_threshold_none_disables_staleness():
    buf = make("async", max_off_policy_threshold=None)
    group(buf, "old", 0, [0.0, 1.0])
    assert buf.sample(1000, "train", 1, timeout=5).uids == ["old"]


def test_stale_evictions_of_two_polls_merge_with_count_weighted_mean():
    buf = make("async", Refiller(step=10, finish=lambda i: None), max_off_policy_threshold=1)
    ref = buf.config.refill_fn
    group(buf, "late0", 9, status="running")
    group(buf, "late1", 9, status="running")
    group(buf, "late2", 9, status="running")
    group(buf, "old", 1, [0.0, 1.0])      # span 10 at g=10

    def finish_late(n):
        ref.calls.append(n)
        if len(ref.calls) == 1:           # between poll 1 and poll 2: the three turn stale (span 2)
            for u in ("late0", "late1", "late2"):
                buf.put(__import__("tests.support.policies", fromlist=["rows"]).rows(u, [1.0, 0.0]))
                buf.update_status(partition="train", uids=[u], status="finished")
        group(buf, f"new{len(ref.calls)}", 10, [0.0, 1.0])  # registered pending + finished at once

    buf.config.__dict__["refill_fn"] = finish_late
    batch = buf.sample(10, "train", 1, timeout=5)
    assert ref.calls == [1, 3]
    m = batch.metrics
    assert (m[EV], m[f"{STALE}/mean"], m[f"{STALE}/max"], m[f"{STALE}/min"]) == (4, 4.0, 10, 2)


# --- wait gate ---------------------------------------------------------------------------------

def test_wait_gate_blocks_until_old_running_group_finishes():
    buf = make("async", max_off_policy_threshold=2, max_off_policy_strategy="wait")
    group(buf, "slow", 0, status="running")            # span 6 at g=5, >= 2
    group(buf, "ready", 4, [0.0, 1.0])
    call = Background(lambda: buf.sample(5, "train", 1, timeout=10))
    time.sleep(0.3)
    assert not call.done
    from tests.support.policies import rows
    buf.put(rows("slow", [0.0, 1.0]))
    buf.update_status(partition="train", uids=["slow"], status="finished")
    assert call.result().uids == ["slow"]               # span 6, never evicted under wait


def test_wait_gate_returns_a_finished_group_of_span_101_without_evicting():
    buf = make("async", max_off_policy_threshold=2, max_off_policy_strategy="wait")
    group(buf, "ancient", 0, [0.0, 1.0])
    batch = buf.sample(100, "train", 1, timeout=5)
    assert batch.uids == ["ancient"] and EV not in batch.metrics
    assert batch.table.column("group_span")[0].as_py() == 101


def test_wait_gate_opens_below_threshold_and_closes_at_exactly_threshold():
    buf = make("async", max_off_policy_threshold=4, max_off_policy_strategy="wait")
    group(buf, "inflight", 5, status="running")         # span 1 at g=5 -> does not block
    group(buf, "done", 5, [0.0, 1.0])
    assert buf.sample(5, "train", 1, timeout=5).uids == ["done"]
    group(buf, "done2", 5, [0.0, 1.0])
    with pytest.raises(TimeoutError) as error:          # span 4 == T at g=8 -> blocks
        buf.sample(8, "train", 1, timeout=0.3)
    # the timeout says that the gate, not a short buffer, held the batch, and names the group
    assert "max_off_policy_strategy='wait' holds the batch" in str(error.value)
    assert "'inflight' (dispatched at step 5, group span 4)" in str(error.value)


def test_sync_ignores_drop_and_wait():
    for strategy in ("drop", "wait"):
        buf = make("sync", max_off_policy_threshold=1, max_off_policy_strategy=strategy)
        group(buf, "old", 0, [0.0, 1.0])
        group(buf, "running", 0, status="running")
        batch = buf.sample(50, "train", 1, timeout=5)
        assert batch.uids == ["old"] and EV not in batch.metrics


# --- zero variance (DAPO) ---------------------------------------------------------------------

def test_async_dapo_evicts_three_zero_variance_groups_and_keeps_refills_buffered():
    ref = Refiller(step=1)
    buf = make("async", ref, filter_groups_metric="reward")
    group(buf, "z0", 1, [0.0, 0.0])
    group(buf, "z1", 1, [0.0, 0.0])
    group(buf, "z2", 1, [1.0, 1.0])
    group(buf, "mixed", 1, [0.0, 1.0])
    batch = buf.sample(1, "train", 1, timeout=5)
    assert ref.calls == [3]
    assert batch.uids == ["mixed"]
    assert batch.metrics[FILTERED] == 3
    assert batch.filtered_reward_counts == {0.0: 2, 1.0: 1}
    assert buf.get_sampleable_count(1, "train") == 3


def test_zero_variance_is_exact_equality_not_std():
    ref = Refiller(step=1)
    buf = make("async", ref, filter_groups_metric="reward")
    group(buf, "tenths", 1, [0.1, 0.1, 0.1])            # np.std gives 1.4e-17 here: verl keeps it
    group(buf, "tiny", 1, [0.0, 1e-300])                # np.std == 0 here: verl filters it
    batch = buf.sample(1, "train", 1, timeout=5)
    assert batch.uids == ["tiny"] and batch.filtered_reward_counts == {0.1: 1}


def test_single_trajectory_and_failure_groups_are_never_zero_variance():
    ref = Refiller(step=1)
    buf = make("sync", ref, filter_groups_metric="reward", train_batch_size=2, gen_batch_size=1)
    group(buf, "single", 1, [1.0])
    group(buf, "failed", 1, [1.0, 1.0], status="failure")
    batch = buf.sample(1, "train", 2, timeout=5)
    assert batch.uids == ["single", "failed"] and ref.calls == []


def test_named_metric_filter_and_missing_metric_error_names_groups():
    ref = Refiller(step=1, finish=lambda i: None)
    buf = make("async", ref, filter_groups_metric="acc")
    group(buf, "zacc", 1, [0.0, 1.0], acc=[1.0, 1.0])   # rewards differ, acc does not
    group(buf, "ok", 1, [0.0, 0.0], acc=[0.0, 1.0])
    batch = buf.sample(1, "train", 1, timeout=5)
    assert batch.uids == ["ok"] and batch.filtered_reward_counts == {1.0: 1}
    group(buf, "b_missing", 1, [0.0, 1.0], acc=[1.0, None])
    group(buf, "a_missing", 1, [0.0, 1.0], acc=[None, 1.0])
    before = buf.counts("train")
    with pytest.raises(MissingMetricError, match=r"\['a_missing', 'b_missing'\]") as err:
        buf.sample(1, "train", 1, timeout=5)
    assert buf.counts("train") == before                 # nothing evicted in that poll
    # the way out the error names: retire them, and sampling goes on without them
    assert "retire('train', uids, reason='missing_metric')" in str(err.value)
    assert buf.retire("train", ["a_missing", "b_missing"], reason="missing_metric") == \
        ["a_missing", "b_missing"]
    group(buf, "later", 1, [0.0, 1.0], acc=[0.0, 1.0])
    assert buf.sample(1, "train", 1, timeout=5).uids == ["later"]


# --- sync DAPO ----------------------------------------------------------------------------------

def test_sync_dapo_refills_two_per_filtered_group_and_discards_the_surplus():
    ref = Refiller(step=1)
    buf = make("sync", ref, filter_groups_metric="reward", train_batch_size=2, gen_batch_size=1)
    group(buf, "mixed", 1, [0.0, 1.0])
    group(buf, "flat", 1, [1.0, 1.0])
    batch = buf.sample(1, "train", 2, timeout=5)
    assert ref.calls == [2]
    assert batch.uids == ["mixed", "refill0"]
    assert batch.metrics[FILTERED] == 1 and batch.metrics[SURPLUS] == 1
    assert buf.get_sampleable_count(1, "train") == 0
    assert buf.lookup("train", "refill1").removed == "retired"   # its data is gone from memory


def test_sync_dapo_streams_credit_into_free_inflight_slots_and_drains():
    ref = Refiller(step=1, finish=lambda i: None)        # refills stay in flight until we finish
    buf = make("sync", ref, filter_groups_metric="reward", train_batch_size=2, gen_batch_size=1,
               max_inflight_gen_batches=1)
    group(buf, "flat", 1, [1.0, 1.0])
    group(buf, "running", 1, status="running")
    call = Background(lambda: buf.sample(1, "train", 2, timeout=10))
    wait_until(lambda: ref.calls == [1])                 # 2 slots - 1 running = 1 free slot
    time.sleep(0.2)
    assert ref.calls == [1] and not call.done
    from tests.support.policies import rows
    buf.put(rows("running", [0.0, 1.0]))
    buf.update_status(partition="train", uids=["running"], status="finished")
    wait_until(lambda: ref.calls == [1, 1])              # the slot it freed takes the rest
    assert not call.done                                 # sampleable 1 < 2: not full yet
    for u in ref.uids:
        buf.put(rows(u, [0.0, 1.0]))
        buf.update_status(partition="train", uids=[u], status="finished")
    batch = call.result()
    assert batch.uids == ["running", "refill0"] and batch.metrics[SURPLUS] == 1


def test_sync_dapo_drains_inflight_groups_before_returning():
    ref = Refiller(step=1)
    buf = make("sync", ref, filter_groups_metric="reward", train_batch_size=1, gen_batch_size=1)
    group(buf, "a", 1, [0.0, 1.0])
    group(buf, "b", 1, status="running")
    call = Background(lambda: buf.sample(1, "train", 1, timeout=10))
    time.sleep(0.3)
    assert not call.done                                 # full, but draining waits for "b"
    from tests.support.policies import rows
    buf.put(rows("b", [0.0, 1.0]))
    buf.update_status(partition="train", uids=["b"], status="finished")
    batch = call.result()
    assert batch.uids == ["a"] and batch.metrics[SURPLUS] == 1


def test_all_zero_variance_data_stops_with_max_num_gen_batches_error():
    ref = Refiller(step=1, finish=lambda i: [1.0, 1.0])
    buf = make("sync", ref, filter_groups_metric="reward", train_batch_size=2, gen_batch_size=1,
               max_num_gen_batches=2)
    group(buf, "flat", 1, [0.0, 0.0])
    with pytest.raises(RefillLimitError, match="max_num_gen_batches"):
        buf.sample(1, "train", 2, timeout=10)
    assert sum(ref.calls) >= 4


def test_async_dapo_also_honours_max_num_gen_batches():
    ref = Refiller(step=1, finish=lambda i: [0.0, 0.0])
    buf = make("async", ref, filter_groups_metric="reward", train_batch_size=1,
               max_num_gen_batches=3)
    group(buf, "flat", 1, [0.0, 0.0])
    with pytest.raises(RefillLimitError, match="filtered"):
        buf.sample(1, "train", 1, timeout=10)
    assert sum(ref.calls) == 3


def test_sync_dapo_credit_below_gen_batch_size_with_nothing_in_flight_is_an_error():
    ref = Refiller(step=1)
    buf = make("sync", ref, filter_groups_metric="reward", train_batch_size=4, gen_batch_size=4)
    group(buf, "flat", 1, [1.0, 1.0])
    with pytest.raises(RefillLimitError, match="gen_batch_size=4"):
        buf.sample(1, "train", 4, timeout=5)
    assert ref.calls == []


# --- failures ------------------------------------------------------------------------------------

def test_async_evicts_every_failure_group_and_refills():
    ref = Refiller(step=2)
    buf = make("async", ref)
    group(buf, "failed_full", 1, [0.0, 1.0], status="failure")
    group(buf, "failed_empty", 1, status="failure")
    group(buf, "finished_empty", 1)                      # treated as an empty failure group
    batch = buf.sample(2, "train", 2, timeout=5)
    assert ref.calls == [3] and batch.metrics[FAILED] == 3
    assert batch.uids == ["refill0", "refill1"]


def test_sync_keeps_failure_groups_sampleable():
    buf = make("sync")
    group(buf, "failed", 0, [0.0, 1.0], status="failure")
    group(buf, "ok", 1, [0.0, 1.0])
    batch = buf.sample(1, "train", 2, timeout=5)
    assert batch.uids == ["failed", "ok"]
    assert set(batch.table.column("status").to_pylist()) == {"failure", "finished"}


def test_sync_refill_failed_groups_replaces_empty_failures_only_while_short():
    ref = Refiller(step=1)
    buf = make("sync", ref, sync_refill_failed_groups=True, gen_batch_size=1)
    for i in range(3):
        group(buf, f"empty{i}", 0, status="failure")
    group(buf, "one_traj", 0, [1.0], status="failure")
    group(buf, "ok", 0, [0.0, 1.0])
    group(buf, "running", 0, status="running")
    batch = buf.sample(1, "train", 4, timeout=5)
    assert ref.calls == [3] and batch.metrics[FAILED] == 3
    assert batch.uids == ["one_traj", "ok", "refill0", "refill1"]   # running not awaited


def test_sync_batch_without_any_trajectory_raises_and_consumes_nothing():
    buf = make("sync")
    group(buf, "empty", 0, status="failure")
    with pytest.raises(EmptyBatchError, match="sync_refill_failed_groups"):
        buf.sample(1, "train", 1, timeout=5)
    assert buf.get_sampleable_count(1, "train") == 1


# --- overlapping reasons, validation, depth queries ------------------------------------------

def test_group_both_stale_and_zero_variance_is_refilled_once_and_counted_under_both():
    ref = Refiller(step=10)
    buf = make("async", ref, max_off_policy_threshold=2, filter_groups_metric="reward")
    group(buf, "stale_flat", 1, [1.0, 1.0])
    batch = buf.sample(10, "train", 1, timeout=5)
    assert ref.calls == [1]
    assert batch.metrics[EV] == 1 and batch.metrics[FILTERED] == 1
    assert batch.filtered_reward_counts == {1.0: 1}


def test_validation_partition_never_evicts_filters_or_refills():
    ref = Refiller(step=10, partition="val")
    buf = make("async", ref, max_off_policy_threshold=1, filter_groups_metric="reward")
    group(buf, "old_flat", 0, [1.0, 1.0], partition="val")
    group(buf, "failed", 0, [0.0], status="failure", partition="val")
    batch = buf.sample(10, "val", 2, timeout=5)
    assert batch.uids == ["old_flat", "failed"] and ref.calls == []
    assert not batch.eviction_metrics and batch.filtered_reward_counts == {}
    assert all(k.startswith("validation/") for k in batch.metrics)


def test_metric_prefix_is_training_only_for_partition_exactly_train():
    buf = make("async", max_off_policy_threshold=1)
    group(buf, "old", 0, [0.0, 1.0], partition="train2")
    group(buf, "new", 5, [0.0, 1.0], partition="train2")
    batch = buf.sample(5, "train2", 1, timeout=5)
    assert batch.metrics["validation/off_policy/evicted_samples"] == 1


def test_get_sampleable_count_evicts_nothing_and_wait_for_sampleable_does():
    ref = Refiller(step=5)
    buf = make("async", ref, max_off_policy_threshold=2)
    group(buf, "old", 0, [0.0, 1.0])
    group(buf, "new", 5, [0.0, 1.0])
    assert buf.get_sampleable_count(5, "train") == 1
    assert buf.counts("train")["finished"] == 2 and ref.calls == []
    uids, metrics = buf.wait_for_sampleable(5, "train", 2, timeout=5)
    assert uids == ["new", "refill0"] and ref.calls == [1] and metrics[EV] == 1
    assert buf.sample(5, "train", 2, timeout=5).uids == uids


def test_no_refill_fn_means_evicted_groups_are_not_replaced():
    buf = make("async", max_off_policy_threshold=1)
    group(buf, "old", 0, [0.0, 1.0])
    with pytest.raises(TimeoutError):
        buf.sample(5, "train", 1, timeout=0.3)
    assert buf.counts("train")["finished"] == 0


def test_stale_bound_invariant_holds_for_every_selected_group():
    buf = ReplayBuffer.async_(max_off_policy_threshold=3, poll_interval=0.05)
    for gs in range(10):
        group(buf, f"g{gs}", gs, [0.0, 1.0])
    batch = buf.sample(10, "train", 2, timeout=5)          # g=10, T=3: only gs 8 and 9 survive
    assert batch.uids == ["g8", "g9"]
    assert max(batch.table.column("group_span").to_pylist()) <= 3
    assert batch.metrics[EV] == 8


def test_sync_dapo_draining_that_can_no_longer_fill_raises_instead_of_hanging():
    from pipeline.decide.policies.context import CallState, PollContext, PollOutcome
    from pipeline.decide.policies.refill import DapoCredit
    policy, st = DapoCredit(train_batch_size=2, gen_batch_size=1), CallState(draining=True)
    ctx = PollContext(step=1, partition="train", batch_size=2)
    assert policy.after_poll(PollOutcome(0, {}, 0, 0, sampleable=1, inflight=1), st, ctx) == 0
    with pytest.raises(RefillLimitError, match="nothing is in flight"):
        policy.after_poll(PollOutcome(0, {}, 0, 0, sampleable=1, inflight=0), st, ctx)
