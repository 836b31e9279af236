"""Differential scenarios: verl 0.9.1's real ReplayBuffer / ReplayBufferAsync and replaylake's verl
adapter, driven with identical writes over one real TransferQueue, must agree on every batch (keys,
in TransferQueue order), every metric, every refill call and every key left in TransferQueue.

Each test is one scenario run twice (tests/adapters/verl/_harness.py). Writes that must land while `sample`
waits are made by a thread after a delay much longer than the poll interval, so both runs see
them in the same polls.
"""
from __future__ import annotations

import pytest

from tests.adapters.verl._harness import G, assert_same, run_both, uids_of

pytestmark = pytest.mark.verl

EV = "training/off_policy/evicted_samples"
FILTERED = "training/filter_groups/evicted_samples"
SURPLUS = "training/filter_groups/discarded_surplus_samples"
FAILED = "training/rollout_failure/evicted_samples"
COUNTS = "_dapo_filtered_reward_counts"


def _gs(base: int, call: int, i: int) -> int:
    """Refilled groups get distinct dispatch steps (verl breaks global_steps ties by hash order,
    so a scenario whose cut went through a tie would not be reproducible)."""
    return base + 10 * (call - 1) + i


def pending_refill(base: int):
    """verl's refill_fn: n fresh prompts registered as pending."""
    def refill(ctx, n):
        call = len(ctx.refill_log)
        ctx.rollout.prompts([f"r{call}x{i}" for i in range(n)], [_gs(base, call, i) for i in range(n)])
    return refill


def finished_refill(base: int, rewards=lambda call, i: [0.0, 1.0]):
    """A refill whose groups have already settled when refill_fn returns (deterministic)."""
    def refill(ctx, n):
        call = len(ctx.refill_log)
        ctx.rollout.groups([G(f"r{call}x{i}", _gs(base, call, i), rewards=rewards(call, i))
                            for i in range(n)])
    return refill


def later_refill(base: int, delay: float, rewards=lambda call, i: [0.0, 1.0]):
    """A refill whose groups are dispatched now (pending) and settle ``delay`` seconds later."""
    def refill(ctx, n):
        call = len(ctx.refill_log)
        grps = [G(f"r{call}x{i}", _gs(base, call, i), rewards=rewards(call, i)) for i in range(n)]
        ctx.rollout.prompts([g.uid for g in grps], [g.gs for g in grps])
        for g in grps:
            ctx.later(delay, lambda g=g: ctx.rollout.finish(g))
    return refill


# --- sync --------------------------------------------------------------------------------------

def test_sync_returns_the_oldest_whole_groups_in_transfer_queue_order(tq):
    def scenario(ctx):
        ctx.rollout.groups([G("c", 3, rewards=[1.0, 0.0, 1.0]), G("a", 1, outputs=2),
                            G("b", 2, rewards=[0.5])])
        ctx.rollout.prompts(["p"], 0, "running")           # older, but in flight: not waited for
        buf = ctx.buffer("sync")
        first = ctx.sample(buf, 3, 2)
        assert uids_of(first.keys) == ["a", "b"] and len(first.keys) == 5   # a: 2 sessions x 2
        ctx.sample(buf, 3, 1)
    assert_same(*run_both(tq, scenario))


def test_sync_blocks_until_enough_groups_are_terminal(tq):
    def scenario(ctx):
        ctx.rollout.groups([G("done", 2)])
        ctx.rollout.prompts(["slow"], 1, "running")
        ctx.later(0.4, lambda: ctx.rollout.finish(G("slow", 1, rewards=[1.0, 1.0])))
        out = ctx.sample(ctx.buffer("sync"), 2, 2)
        assert set(uids_of(out.keys)) == {"slow", "done"}
    assert_same(*run_both(tq, scenario))


def test_sync_ignores_staleness_and_keeps_failure_groups_with_trajectories(tq):
    def scenario(ctx):
        ctx.rollout.groups([G("old", 0), G("failed", 5, "failure", rewards=[1.0])])
        buf = ctx.buffer("sync", threshold=1, strategy="wait")
        ctx.rollout.prompts(["inflight"], 0, "running")  # span 11 >= 1: would close async's gate
        out = ctx.sample(buf, 10, 2)
        assert out.metrics == {} and set(uids_of(out.keys)) == {"old", "failed"}
    assert_same(*run_both(tq, scenario))


def test_sync_empty_failure_only_raises_and_consumes_nothing(tq):
    def scenario(ctx):
        ctx.rollout.groups([G("empty", 1, "failure", rewards=[])])
        buf = ctx.buffer("sync")
        assert ctx.sample(buf, 2, 1).error == "RuntimeError"
        ctx.rollout.groups([G("ok", 2)])
        out = ctx.sample(buf, 2, 2)                       # the empty group is still there
        assert uids_of(out.keys) == ["ok"]
    assert_same(*run_both(tq, scenario))


def test_sync_refill_failed_groups_replaces_empty_failures_while_short(tq):
    def scenario(ctx):
        ctx.rollout.groups([G("e1", 0, "failure", rewards=[]), G("e2", 0, "failure", rewards=[]),
                            G("f1", 0, "failure", rewards=[1.0]), G("ok", 1)])
        buf = ctx.buffer("sync", refill=finished_refill(10), sync_refill_failed_groups=True,
                         gen_batch_size=1)
        out = ctx.sample(buf, 2, 4)
        assert out.refills == [2] and out.metrics == {FAILED: 2} and len(out.keys) == 7
        ctx.rollout.groups([G("e3", 2, "failure", rewards=[]), G("ok2", 3)])
        out = ctx.sample(buf, 3, 1)                       # enough without it: evicted, not replaced
        assert out.refills == [] and out.metrics == {FAILED: 1}
    assert_same(*run_both(tq, scenario))


# --- async: drop, gate ---------------------------------------------------------------------------

def test_async_drop_keeps_span_t_evicts_span_t_plus_one_and_refills(tq):
    def scenario(ctx):
        ctx.rollout.groups([G("t1", 4, rewards=[1.0, 0.0, 0.0]),     # g=6, T=3: span 3 kept
                            G("t2", 3, vmin=1, vmax=2),               # span 4 evicted
                            G("t0", 1), G("f", 6, "failure"), G("n", 6)])
        ctx.rollout.prompts(["p"], 6, "running")
        buf = ctx.buffer("async", threshold=3, refill=pending_refill(6))
        out = ctx.sample(buf, 6, 2)
        assert out.refills == [3] and out.metrics[EV] == 2 and out.metrics[FAILED] == 1
        assert out.metrics[f"{EV}_staleness/mean"] == 5.0
        assert set(uids_of(out.keys)) == {"t1", "n"}
    assert_same(*run_both(tq, scenario))


def test_async_drop_evicts_a_group_that_turns_terminal_during_the_refill(tq):
    def scenario(ctx):
        ctx.rollout.groups([G("stale", 1), G("fresh", 4)])
        ctx.rollout.prompts(["old"], 2, "running")       # span 4 at g=5 once it finishes

        def refill(c, n):
            if len(c.refill_log) == 1:                   # settles while refill_fn runs
                c.rollout.finish(G("old", 2, rewards=[1.0, 0.0]))
            finished_refill(10)(c, n)
        buf = ctx.buffer("async", threshold=2, refill=refill)
        out = ctx.sample(buf, 5, 3)
        assert out.refills == [1, 1] and len(out.keys) == 6
        assert out.metrics[EV] == 2 and out.metrics[f"{EV}_staleness/mean"] == 4.5
        assert out.metrics[f"{EV}_staleness/min"] == 4.0
    assert_same(*run_both(tq, scenario))


def test_async_wait_gate_holds_sample_until_the_old_inflight_group_settles(tq):
    def scenario(ctx):
        ctx.rollout.groups([G("w1", 3), G("w2", 4)])
        ctx.rollout.prompts(["w3"], 2, "running")        # span 2 >= T=2 at g=3: gate closed
        buf = ctx.buffer("async", threshold=2, strategy="wait", trainer_mode="separate_async")
        assert ctx.count(buf, 3).value == 2                # the count ignores the gate
        ctx.later(0.4, lambda: ctx.rollout.finish(G("w3", 2, rewards=[1.0, 1.0])))
        waited = ctx.wait(buf, 3, 1)
        assert waited.value == {"w1", "w2", "w3"}
        out = ctx.sample(buf, 3, 2)
        assert set(uids_of(out.keys)) == {"w3", "w1"} and out.metrics == {}
    assert_same(*run_both(tq, scenario))


def test_async_gate_also_applies_to_validation_but_nothing_is_evicted_there(tq):
    def scenario(ctx):
        ctx.rollout.groups([G("v1", 1, rewards=[1.0, 1.0]), G("v2", 1, "failure", rewards=[])],
                           partition="val")
        ctx.rollout.prompts(["v3"], 8, "running", partition="val")
        ctx.later(0.3, lambda: ctx.rollout.finish(G("v3", 8, rewards=[0.0]), partition="val"))
        buf = ctx.buffer("async", threshold=2, strategy="wait", filter_groups_metric="acc",
                         refill=pending_refill(9))
        out = ctx.sample(buf, 9, 3, partition="val")
        assert out.metrics == {} and out.refills == [] and len(out.keys) == 3
    assert_same(*run_both(tq, scenario))


def test_validation_partition_never_evicts_filters_or_refills(tq):
    def scenario(ctx):
        ctx.rollout.groups([G("v1", 1, rewards=[1.0, 1.0]), G("v2", 1, "failure", rewards=[]),
                            G("v3", 9, "failure", rewards=[0.0])], partition="val")
        buf = ctx.buffer("async", threshold=2, filter_groups_metric="acc", refill=pending_refill(9))
        out = ctx.sample(buf, 9, 3, partition="val")
        assert out.metrics == {} and len(out.keys) == 3
        sync = ctx.buffer("sync", filter_groups_metric="reward", refill=pending_refill(9),
                          train_batch_size=1, gen_batch_size=1)
        ctx.rollout.groups([G("v4", 1, "failure", rewards=[])], partition="val")
        out = ctx.sample(sync, 9, 1, partition="val")     # empty group: no error in val
        assert out.keys == []
    assert_same(*run_both(tq, scenario))


def test_async_evicts_every_failure_group_and_refills_them(tq):
    def scenario(ctx):
        ctx.rollout.groups([G("f1", 1, "failure", rewards=[0.0, 1.0]),
                            G("f2", 1, "failure", rewards=[]), G("ok", 2)])
        buf = ctx.buffer("async", refill=finished_refill(10), sync_refill_failed_groups=True)
        out = ctx.sample(buf, 2, 2)
        assert out.refills == [2] and out.metrics == {FAILED: 2}
    assert_same(*run_both(tq, scenario))


# --- DAPO ----------------------------------------------------------------------------------------

def test_async_dapo_named_metric_filters_refills_and_counts_rewards(tq):
    def scenario(ctx):
        ctx.rollout.groups([G("z1", 1, rewards=[1, 1, 1, 1]), G("z2", 2, rewards=[0, 0, 0]),
                            G("z4", 3, rewards=[0, 1, 0, 1], acc=[0.0, 1.0, 0.0, 1.0]),
                            G("z5", 4, rewards=[1]), G("z6", 5, "failure", rewards=[1, 1]),
                            G("z7", 6, rewards=[0.0, 1.0], acc=[0.5, 0.5])])
        zero_first = finished_refill(10, lambda c, i: [1.0, 1.0] if (c, i) == (1, 0) else [0, 1])
        buf = ctx.buffer("async", threshold=None, filter_groups_metric="acc", refill=zero_first)
        assert ctx.count(buf, 10).value == 2
        out = ctx.sample(buf, 10, 3)
        assert out.refills == [4, 1] and set(uids_of(out.keys)) == {"z4", "z5", "r1x1"}
        assert out.metrics[FILTERED] == 4 and out.metrics[COUNTS] == {1.0: 2, 0.0: 1, 0.5: 1}
    assert_same(*run_both(tq, scenario))


def test_async_dapo_reward_metric_sums_rm_scores(tq):
    def scenario(ctx):
        ctx.rollout.groups([G("a", 1, rewards=[0.25, 0.25]), G("b", 2, rewards=[0.25, 0.5]),
                            G("c", 3, rewards=[3.0, 3.0, 3.0], outputs=2)])
        buf = ctx.buffer("async", threshold=None, filter_groups_metric="reward",
                         refill=finished_refill(10))
        out = ctx.sample(buf, 10, 2)
        assert set(uids_of(out.keys)) == {"b", "r1x0"}
        assert out.metrics[COUNTS] == {0.25: 1, 3.0: 1}
    assert_same(*run_both(tq, scenario))


def test_group_both_stale_and_zero_variance_is_refilled_once_counted_under_both(tq):
    def scenario(ctx):
        ctx.rollout.groups([G("sz", 1, rewards=[1.0, 1.0]), G("s", 1), G("z", 9, rewards=[0, 0]),
                            G("f", 9, "failure", rewards=[1.0, 1.0])])
        buf = ctx.buffer("async", threshold=2, filter_groups_metric="reward",
                         refill=finished_refill(10))
        out = ctx.sample(buf, 10, 2)
        assert out.refills == [4] and set(uids_of(out.keys)) == {"r1x0", "r1x1"}
        assert (out.metrics[EV], out.metrics[FILTERED], out.metrics[FAILED]) == (2, 2, 1)
    assert_same(*run_both(tq, scenario))


def test_sync_dapo_credit_two_per_filtered_group_then_drain_and_discard_surplus(tq):
    def scenario(ctx):
        ctx.rollout.groups([G("d0", 1, rewards=[1, 1, 1, 1]), G("d1", 2, rewards=[0, 1, 0, 1]),
                            G("d2", 3, rewards=[0, 0])])
        buf = ctx.buffer("sync", filter_groups_metric="reward", train_batch_size=2,
                         gen_batch_size=1, max_inflight_gen_batches=2,
                         refill=finished_refill(10, lambda c, i: [0, 0] if (c, i) == (1, 0)
                                                else [1, 0]))
        out = ctx.sample(buf, 10, 2)
        # credit 2 x 2 -> refill(4) into 4 free slots; one refill is flat again; full -> drain
        assert out.refills == [4] and set(uids_of(out.keys)) == {"d1", "r1x1"}
        assert out.metrics == {FILTERED: 3, COUNTS: {1.0: 1, 0.0: 2}, SURPLUS: 2}
    assert_same(*run_both(tq, scenario))


def test_sync_dapo_streams_credit_into_bounded_inflight_slots_and_drains(tq):
    def scenario(ctx):
        ctx.rollout.groups([G("flat", 1, rewards=[1.0, 1.0])])
        ctx.rollout.prompts(["run"], 2, "running")
        ctx.later(0.5, lambda: ctx.rollout.finish(G("run", 2)))
        buf = ctx.buffer("sync", filter_groups_metric="reward", train_batch_size=2,
                         gen_batch_size=1, max_inflight_gen_batches=1,
                         refill=later_refill(10, 1.0))
        out = ctx.sample(buf, 10, 2)
        assert set(uids_of(out.keys)) == {"run", "r1x0"}
        # credit 2, 2 slots - 1 in flight = 1 -> refill(1); "run" settles -> its slot -> refill(1);
        # r1x0 settles -> full -> drain r2x0 -> oldest 2, one surplus
        assert out.refills == [1, 1]
        assert out.metrics == {FILTERED: 1, COUNTS: {1.0: 1}, SURPLUS: 1}
    assert_same(*run_both(tq, scenario))


def test_sync_dapo_with_failure_refill_counts_one_credit_per_empty_failure(tq):
    def scenario(ctx):
        ctx.rollout.groups([G("e", 1, "failure", rewards=[]), G("z", 2, rewards=[0, 0]),
                            G("ok", 3), G("f", 4, "failure", rewards=[1.0])])
        buf = ctx.buffer("sync", filter_groups_metric="reward", train_batch_size=4,
                         gen_batch_size=1, sync_refill_failed_groups=True,
                         refill=finished_refill(10))
        out = ctx.sample(buf, 10, 4)
        assert out.refills == [3] and out.metrics[FAILED] == 1 and out.metrics[SURPLUS] == 1
    assert_same(*run_both(tq, scenario))


# --- depth queries -------------------------------------------------------------------------------

def test_depth_queries_count_without_effects_and_wait_evicts_like_sample(tq):
    def scenario(ctx):
        ctx.rollout.groups([G("old", 1), G("mid", 3), G("new", 4), G("fail", 4, "failure")])
        buf = ctx.buffer("async", threshold=2, refill=finished_refill(10))
        assert [ctx.count(buf, g).value for g in (4, 5)] == [2, 1]   # TQ untouched by counts
        waited = ctx.wait(buf, 4, 3)
        assert waited.refills == [2] and waited.metrics[EV] == 1 and len(waited.value) == 4
        out = ctx.sample(buf, 4, 3)
        assert out.metrics == {} and set(uids_of(out.keys)) == {"mid", "new", "r1x0"}
        assert ctx.count(buf, 4).value == 1
    assert_same(*run_both(tq, scenario))


def test_trainer_clearing_a_batch_releases_it_and_late_batches_still_match(tq):
    def scenario(ctx):
        ctx.rollout.groups([G(f"g{i}", i) for i in range(1, 7)])
        buf = ctx.buffer("async", threshold=4, refill=finished_refill(20))
        first = ctx.sample(buf, 5, 2)                               # g1 (span 5) evicted
        assert set(uids_of(first.keys)) == {"g2", "g3"} and first.refills == [1]
        ctx.tq.kv_clear(keys=first.keys, partition_id="train")      # the trainer, end of step
        second = ctx.sample(buf, 6, 2)
        assert set(uids_of(second.keys)) == {"g4", "g5"} and second.metrics == {}
        ctx.tq.kv_clear(keys=second.keys, partition_id="train")
        third = ctx.sample(buf, 11, 2)                              # g6: span 6 > 4
        assert third.metrics[EV] == 1
    assert_same(*run_both(tq, scenario))


def test_groups_whose_keys_someone_else_cleared_are_gone_for_both(tq):
    """verl's trainer clears a partition after a failed step; both buffers forget its groups
    (ours retires them in the core with a decision of their own) and sample the new ones."""
    def scenario(ctx):
        ctx.rollout.groups([G("empty", 1, "failure", rewards=[])])
        buf = ctx.buffer("sync")
        assert ctx.sample(buf, 2, 1).error == "RuntimeError"   # nothing consumed
        ctx.rollout.clear_all()                                 # the trainer resets the partition
        ctx.rollout.groups([G("a", 2), G("b", 3)])
        out = ctx.sample(buf, 3, 2)
        assert uids_of(out.keys) == ["a", "b"]
    assert_same(*run_both(tq, scenario))


def test_sync_dapo_after_a_partition_reset_selects_only_listed_groups(tq):
    """The case found in a sync DAPO run: an empty-batch error, the partition reset, new groups:
    the vanished group must not be selected (ours selected it and failed again)."""
    def scenario(ctx):
        ctx.rollout.groups([G("old", 1, "failure", rewards=[])])
        buf = ctx.buffer("sync", refill=finished_refill(50), filter_groups_metric="reward",
                         train_batch_size=1, gen_batch_size=1)
        assert ctx.sample(buf, 2, 1).error == "RuntimeError"
        ctx.rollout.clear_all()
        ctx.rollout.groups([G("e1", 2, "failure", rewards=[]), G("fin", 3)])
        out = ctx.sample(buf, 3, 2)
        assert set(uids_of(out.keys)) == {"fin"}
    assert_same(*run_both(tq, scenario))


def test_keys_listed_before_their_tags_are_written_join_once_the_tags_arrive(tq):
    """TransferQueue's put creates a key, then writes its tags: a listing in between shows `{}`.
    Played here by writing empty tags first. verl skips such a key in that poll and sees it at
    the next; so does the adapter (it used to ignore the key for good)."""
    def scenario(ctx):
        buf = ctx.buffer("async", threshold=4)
        ctx.rollout.groups([G("a", 3)])
        ctx.tq.kv_batch_put(keys=["b", "c"], partition_id="train", tags=[{}, {}])
        ctx.count(buf, 3)                                  # lists a, and b / c without tags
        ctx.rollout.prompts(["b", "c"], 3, "running")      # their tags, then their rollouts
        ctx.rollout.trajectories([G("b", 3), G("c", 3)])
        ctx.rollout.status(["b", "c"], "finished")
        ctx.count(buf, 3)
        out = ctx.sample(buf, 3, 3)
        assert sorted(uids_of(out.keys)) == ["a", "b", "c"]
    assert_same(*run_both(tq, scenario))
