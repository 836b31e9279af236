"""Where replaylake deliberately differs from verl 0.9.1 (the README's table of differences): each
test runs the same writes through both and shows verl's behaviour and ours side by side. Also the constructor
contract (same exception types and phrases) and the errors both raise alike.
"""
from __future__ import annotations

import threading
import time

import pytest

from pipeline.errors import ConfigError, MissingMetricError, RefillLimitError
from tests.adapters.verl._harness import PART, G, assert_same, run_both, uids_of

pytestmark = pytest.mark.verl

FILTERED = "training/filter_groups/evicted_samples"
FAILED = "training/rollout_failure/evicted_samples"
COUNTS = "_dapo_filtered_reward_counts"


def finished_refill(base: int, rewards=lambda call, i: [0.0, 1.0]):
    def refill(ctx, n):
        call = len(ctx.refill_log)
        ctx.rollout.groups([G(f"r{call}x{i}", base + 10 * (call - 1) + i, rewards=rewards(call, i))
                            for i in range(n)])
    return refill


def by_impl(scenario, tq):
    verl, ours = run_both(tq, scenario)
    return {"verl": verl, "ours": ours}


def test_ties_verl_breaks_by_set_hash_order_ours_by_terminal_arrival(tq):
    def scenario(ctx):
        ctx.rollout.groups([G(u, 1) for u in ("ta", "tb", "tc", "td", "te", "tf")])
        ctx.sample(ctx.buffer("async"), 1, 3)
    out = by_impl(scenario, tq)
    ours = set(uids_of(out["ours"][0].keys))
    verl = set(uids_of(out["verl"][0].keys))
    assert ours == {"ta", "tb", "tc"}                   # the first three to turn terminal
    assert len(verl) == 3 and verl <= {"ta", "tb", "tc", "td", "te", "tf"}   # set hash order:
    # which three depends on PYTHONHASHSEED (seen when running verl across processes)


def test_zero_variance_is_exact_equality_where_verl_tests_np_std(tq):
    def scenario(ctx):
        ctx.rollout.groups([G("tenths", 1, acc=[0.1, 0.1, 0.1], rewards=[0, 0, 0]),
                            G("tiny", 2, acc=[1e-200, 3e-200]), G("ok", 3)])
        buf = ctx.buffer("async", threshold=None, filter_groups_metric="acc",
                         refill=finished_refill(10))
        ctx.sample(buf, 10, 1)
    out = by_impl(scenario, tq)
    verl, ours = out["verl"][0], out["ours"][0]
    assert uids_of(verl.keys) == ["tenths"] and verl.metrics[COUNTS] == {1e-200: 1}
    assert uids_of(ours.keys) == ["tiny"] and ours.metrics[COUNTS] == {0.1: 1}


def test_finished_group_without_trajectories_is_an_empty_failure(tq):
    def scenario(ctx):
        ctx.rollout.groups([G("e1", 1, rewards=[]), G("s2", 2)])
        ctx.sample(ctx.buffer("async", refill=finished_refill(10)), 3, 2)
    out = by_impl(scenario, tq)
    verl, ours = out["verl"][0], out["ours"][0]
    assert set(uids_of(verl.keys)) == {"s2"} and verl.refills == [] and verl.metrics == {}
    assert set(uids_of(ours.keys)) == {"s2", "r1x0"} and ours.refills == [1]
    assert ours.metrics == {FAILED: 1}


def test_finished_group_without_trajectories_under_dapo_is_evicted_not_a_missing_metric(tq):
    def scenario(ctx):
        ctx.rollout.groups([G("m2", 1, rewards=[]), G("ok", 2)])
        ctx.sample(ctx.buffer("async", filter_groups_metric="acc", refill=finished_refill(10)), 3, 1)
    out = by_impl(scenario, tq)
    verl, ours = out["verl"][0], out["ours"][0]
    assert verl.error == "RuntimeError" and "['m2']" in verl.value and "m2" in verl.left
    assert ours.error is None and ours.metrics == {FAILED: 1} and "m2" not in ours.left


class _Stopped(Exception):
    pass


def _loops_forever(buf, call, seconds: float) -> bool:
    """Run a verl `sample` that would never return in a thread for ``seconds``; report whether it
    was still running, then end it (its next poll raises)."""
    def target():
        try:
            call()
        except _Stopped:
            pass
    t = threading.Thread(target=target, daemon=True)
    t.start()
    time.sleep(seconds)
    alive = t.is_alive()

    def stop():
        raise _Stopped
    buf._sync_metadata_from_transfer_queue = stop
    t.join(10)
    assert not t.is_alive()
    return alive


def test_sync_dapo_credit_below_gen_batch_size_verl_sleeps_forever_ours_raises(tq):
    state = {}

    def scenario(ctx):
        ctx.rollout.groups([G("z", 1, rewards=[1.0, 1.0]), G("ok", 2)])
        buf = ctx.buffer("sync", filter_groups_metric="reward", train_batch_size=4,
                         gen_batch_size=4, refill=finished_refill(10))
        if ctx.impl == "ours":
            with pytest.raises(RefillLimitError, match="gen_batch_size=4"):
                buf.sample(global_steps=3, partition_id="train", batch_size=2)
            state["ours"] = ctx.refill_log
            return
        state["verl_alive"] = _loops_forever(
            buf, lambda: buf.sample(global_steps=3, partition_id="train", batch_size=2), 1.0)
        state["verl"] = list(ctx.refill_log)
    run_both(tq, scenario)
    assert state["verl_alive"] and state["verl"] == [] and state["ours"] == []


def test_all_zero_variance_data_verl_refills_forever_ours_stops_at_max_num_gen_batches(tq):
    state = {}

    def scenario(ctx):
        ctx.rollout.groups([G("z", 1, rewards=[0.0, 0.0])])
        flat = finished_refill(10, lambda c, i: [1.0, 1.0])
        if ctx.impl == "ours":
            buf = ctx.buffer("async", threshold=None, filter_groups_metric="reward", refill=flat,
                             train_batch_size=1, max_num_gen_batches=3)
            with pytest.raises(RefillLimitError, match="filtered"):
                buf.sample(global_steps=10, partition_id="train", batch_size=1)
            state["ours"] = list(ctx.refill_log)
            return
        buf = ctx.buffer("async", threshold=None, filter_groups_metric="reward", refill=flat)
        state["verl_alive"] = _loops_forever(
            buf, lambda: buf.sample(global_steps=10, partition_id="train", batch_size=1), 1.5)
        state["verl"] = len(ctx.refill_log)
    run_both(tq, scenario)
    assert state["verl_alive"] and state["verl"] >= 5
    assert state["ours"] == [1, 1, 1]


def test_late_trajectory_of_a_terminal_group_is_an_orphan_cleared_not_sampled(tq):
    def scenario(ctx):
        ctx.rollout.groups([G("g", 1)])
        buf = ctx.buffer("async")
        ctx.count(buf, 2)                                   # both have seen the finished group
        ctx.rollout.trajectories([G("g", 1, rewards=[0.0, 1.0, 1.0])])   # a third one, late
        ctx.sample(buf, 2, 1)
    out = by_impl(scenario, tq)
    verl, ours = out["verl"][1], out["ours"][1]
    assert sorted(verl.keys) == ["g_0_0", "g_1_0", "g_2_0"]
    assert sorted(ours.keys) == ["g_0_0", "g_1_0"] and "g_2_0" not in ours.left


def test_late_status_write_recreating_a_prompt_key_verl_leaks_it_ours_clears_it(tq):
    def scenario(ctx):
        ctx.rollout.groups([G("o1", 1), G("o2", 2)])
        buf = ctx.buffer("async")
        ctx.sample(buf, 2, 1)                               # o1's prompt key is cleared
        ctx.rollout.status(["o1"], "finished")              # a late write re-creates it
        ctx.sample(buf, 2, 1)
    out = by_impl(scenario, tq)
    assert out["verl"][1].left["o1"] == "traj"              # verl: a "trajectory key", forever
    assert "o1" not in out["ours"][1].left
    assert set(uids_of(out["verl"][1].keys)) == set(uids_of(out["ours"][1].keys)) == {"o2"}


def test_the_selected_prompt_keys_clear_verl_makes_in_sample_ours_right_after_it(tq):
    seen: dict[str, list[bool]] = {}

    def scenario(ctx):
        ctx.rollout.groups([G("p1", 1), G("p2", 2)])
        buf = ctx.buffer("async")
        if ctx.impl == "ours":             # the thread held back, so the owed clear is seen
            buf._mirror(PART)
            buf._background.stop()
        meta, _ = buf.sample(global_steps=2, partition_id=PART, batch_size=1)
        assert uids_of(meta.keys) == ["p1"]
        seen[ctx.impl] = ["p1" in ctx.rollout.listing()]
        if ctx.impl == "ours":
            buf.flush()                    # what the thread does right after the call
            seen[ctx.impl].append("p1" in ctx.rollout.listing())
    run_both(tq, scenario)
    assert seen == {"verl": [False], "ours": [True, False]}


def test_batch_size_must_be_positive_where_verl_slices(tq):
    def scenario(ctx):
        ctx.rollout.groups([G("a", 1), G("b", 2), G("c", 3)])
        ctx.sample(ctx.buffer("async"), 3, -1)
        ctx.sample(ctx.buffer("async"), 3, 0)
    out = by_impl(scenario, tq)
    assert set(uids_of(out["verl"][0].keys)) == {"a", "b"}        # all but the last one
    assert out["verl"][1].error == "ValueError"                    # TQ: empty key list
    assert [o.error for o in out["ours"]] == ["ValueError", "ValueError"]   # ConfigError
    assert "batch_size" in out["ours"][0].value


def test_reward_metric_without_rm_scores_verl_keyerror_ours_missing_metric(tq):
    def scenario(ctx):
        ctx.rollout.groups([G("n1", 1, kw={"rm_scores": False})])
        ctx.sample(ctx.buffer("async", filter_groups_metric="reward", refill=finished_refill(10)),
                   2, 1)
    out = by_impl(scenario, tq)
    assert out["verl"][0].error == "KeyError"
    assert out["ours"][0].error == "RuntimeError" and "rm_scores" in out["ours"][0].value
    assert out["verl"][0].left == out["ours"][0].left               # nothing evicted or cleared


def test_missing_named_metric_raises_in_both_before_anything_is_evicted(tq):
    def scenario(ctx):
        ctx.rollout.groups([G("bmissing", 1, acc=[1.0, None]), G("amissing", 2, acc=[None, 0.0]),
                            G("fail", 3, "failure"), G("ok", 4)])
        ctx.sample(ctx.buffer("async", filter_groups_metric="acc", refill=finished_refill(10)), 5, 1)
    verl, ours = run_both(tq, scenario)
    assert_same(verl, ours)
    assert verl[0].error == "RuntimeError" and "['amissing', 'bmissing']" in verl[0].value
    assert isinstance(MissingMetricError("x"), RuntimeError)


# --- constructor ---------------------------------------------------------------------------------

BASE = dict(trainer_mode="sync", trainer_config={}, max_off_policy_threshold=8,
            max_off_policy_strategy="drop", sampler_kwargs={})
SAME = [  # (label, class, keywords, exception classes both must raise, phrase in both)
    ("threshold 0", "sync", dict(max_off_policy_threshold=0), AssertionError,
     "Invalid max off policy threshold"),
    ("threshold 2.0", "sync", dict(max_off_policy_threshold=2.0), AssertionError,
     "Invalid max off policy threshold"),
    ("strategy keep", "sync", dict(max_off_policy_strategy="keep"), AssertionError,
     "Invalid max off policy strategy"),
    ("strategy keep, threshold None", "async",
     dict(max_off_policy_threshold=None, max_off_policy_strategy="keep"), AssertionError,
     "Invalid max off policy strategy"),
    ("filter without refill_fn", "async", dict(filter_groups_metric="acc"), ValueError,
     "requires refill_fn"),
    ("failure refill without refill_fn", "async", dict(sync_refill_failed_groups=True), ValueError,
     "requires refill_fn"),
    ("sync filter, max_inflight 0", "sync",
     dict(filter_groups_metric="acc", refill_fn=print, max_inflight_gen_batches=0,
          train_batch_size=2, gen_batch_size=1), ValueError, "max_inflight_gen_batches"),
    ("sync failure refill, gen_batch_size None", "sync",
     dict(sync_refill_failed_groups=True, refill_fn=print), ValueError,
     "requires gen_batch_size=1"),
    ("async ignores sync-only checks", "async",
     dict(sync_refill_failed_groups=True, refill_fn=print, max_inflight_gen_batches=0), None, ""),
    ("sync failure refill ok", "sync",
     dict(sync_refill_failed_groups=True, refill_fn=print, gen_batch_size=1), None, ""),
]


def _classes(kind: str):
    from verl.trainer.ppo.v1 import replay_buffer as verl

    import pipeline.adapters.verl as ours
    name = "ReplayBuffer" if kind == "sync" else "ReplayBufferAsync"
    return getattr(verl, name), getattr(ours, name)


@pytest.mark.parametrize("label,kind,kw,exc,phrase", SAME, ids=[c[0] for c in SAME])
def test_constructor_errors_match_verl(tq, label, kind, kw, exc, phrase):
    for cls in _classes(kind):
        if exc is None:
            cls(**{**BASE, **kw})
            continue
        with pytest.raises(exc, match=phrase):
            cls(**{**BASE, **kw})
    if exc is AssertionError:      # ours is a ValueError too
        with pytest.raises(ValueError):
            _classes(kind)[1](**{**BASE, **kw})


@pytest.mark.parametrize("kw", [dict(max_off_policy_threshold=True),
                                dict(filter_groups_metric="acc", refill_fn=print),
                                dict(max_inflight_gen_batches=0),
                                dict(train_batch_size=-1, gen_batch_size=0)],
                         ids=["bool threshold", "sync DAPO without batch sizes",
                              "sync max_inflight 0", "sync batch sizes <= 0"])
def test_constructor_rejects_what_verl_accepts_and_crashes_on_later(tq, kw):
    verl_cls, ours_cls = _classes("sync")
    verl_cls(**{**BASE, **kw})
    with pytest.raises(ConfigError):
        ours_cls(**{**BASE, **kw})


def test_a_numpy_integer_threshold_is_taken_as_its_value(tq):
    """verl asserts a Python int; a threshold read from a numpy array or a config that produced
    one is the same number to replaylake."""
    import numpy as np
    verl_cls, ours_cls = _classes("async")
    with pytest.raises(AssertionError):
        verl_cls(**{**BASE, "max_off_policy_threshold": np.int64(3)})
    buf = ours_cls(**{**BASE, "max_off_policy_threshold": np.int64(3)})
    assert buf.core.config.bound() == 3 and type(buf.core.config.bound()) is int


def test_a_depth_query_clears_nothing_even_with_an_orphan_present(tq):
    def scenario(ctx):
        ctx.rollout.groups([G("g", 1), G("h", 2)])
        buf = ctx.buffer("async")
        ctx.count(buf, 2)
        ctx.rollout.trajectories([G("g", 1, rewards=[0.0, 1.0, 1.0])])   # a late, orphan key
        ctx.count(buf, 2)
        ctx.sample(buf, 2, 1)
    out = by_impl(scenario, tq)["ours"]
    assert "g_2_0" in out[1].left                 # the depth query left TransferQueue alone
    assert "g_2_0" not in out[2].left             # sample clears the orphan
