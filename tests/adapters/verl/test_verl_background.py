"""The verl adapter's thread, over the session's real TransferQueue: in either mode the clears a
call defers are made by the thread at once (or by `flush`, by the next listing before it lists,
or by `close`; `retire` makes its own); with `mirror_max_lag` a fresh view spares `sample` its
listing, a stale one is never used, and a listing the core rejects in the background is raised
by the next call."""
from __future__ import annotations

import logging
import time

import pytest

from pipeline.adapters.verl.background import check_max_lag, usable
from pipeline.adapters.verl.dropin import ReplayBufferAsync
from pipeline.errors import ConfigError, IngestError
from tests.adapters.verl._harness import PART, G, uids_of

pytestmark = pytest.mark.verl


def make(max_lag, poll_interval=0.05, **kw):
    return ReplayBufferAsync("colocate_async", {}, 8, "drop", {}, poll_interval=poll_interval,
                             refill_fn=lambda n: n, mirror_max_lag=max_lag, **kw)


def until(cond, seconds=10.0):
    """Wait for the background thread: True once ``cond()`` holds, False after ``seconds``."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return False


def prompts_left(rollout):
    return sorted(k for k, t in rollout.listing().items() if t.get("is_prompt"))


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), True, "1", [1]])
def test_mirror_max_lag_must_be_a_positive_finite_number_of_seconds(bad):
    with pytest.raises(ConfigError, match="mirror_max_lag"):
        check_max_lag(bad)
    with pytest.raises(ConfigError, match="mirror_max_lag"):
        make(bad)


def test_mirror_max_lag_also_comes_in_sampler_kwargs(tq, rollout):
    buf = ReplayBufferAsync("colocate_async", {}, 8, "drop", {"mirror_max_lag": 2},
                            refill_fn=lambda n: n)
    assert buf.mirror_max_lag == 2.0
    buf.close()


def test_without_the_option_the_thread_only_clears_and_every_call_lists(tq, rollout):
    rollout.groups([G(f"u{i}", 1) for i in range(3)])
    buf = make(None)
    meta, _ = buf.sample(global_steps=1, partition_id=PART, batch_size=2)
    chosen = set(uids_of(meta.keys))
    assert until(lambda: buf._background.cleared == 2)       # made after the call, unasked
    assert prompts_left(rollout) == sorted({"u0", "u1", "u2"} - chosen)
    assert buf._background.polls == 0 and buf.background_polls == 0    # never lists
    assert buf.mirror_lag(PART) is None
    buf.close()


@pytest.mark.parametrize("lag", [None, 30.0])
def test_flush_makes_the_clears_a_sample_left_and_returns_how_many(tq, rollout, lag):
    rollout.groups([G(f"f{i}", 1) for i in range(4)])
    buf = make(lag)
    buf._mirror(PART)
    buf._background.stop()                 # the thread never clears: flush must
    meta, _ = buf.sample(global_steps=1, partition_id=PART, batch_size=2)
    assert len(prompts_left(rollout)) == 4                   # owed, not yet made
    assert buf.flush() == 2
    assert prompts_left(rollout) == sorted({f"f{i}" for i in range(4)} - set(uids_of(meta.keys)))
    assert buf.flush() == 0
    buf.close()


def test_retire_clears_the_groups_keys_before_it_returns(tq, rollout):
    rollout.groups([G("r0", 1), G("r1", 1)])
    buf = make(None)
    buf.get_sampleable_count(1, PART)
    buf._background.stop()
    assert buf.retire(PART, ["r0"]) == ["r0"]
    assert sorted(rollout.listing()) == ["r1", "r1_0_0", "r1_1_0"]
    buf.close()


def test_a_clear_transferqueue_refuses_stays_owed_and_the_next_call_raises_it(tq, rollout,
                                                                             monkeypatch):
    rollout.groups([G(f"e{i}", 1) for i in range(3)])
    buf = make(None)
    buf._mirror(PART)
    buf._background.stop()
    meta, _ = buf.sample(global_steps=1, partition_id=PART, batch_size=1)
    real = tq.kv_clear

    def refuse(*a, **k):
        raise RuntimeError("TransferQueue is down")
    monkeypatch.setattr(tq, "kv_clear", refuse)     # TransferQueue refuses, then comes back
    with pytest.raises(RuntimeError, match="down"):
        buf.sample(global_steps=1, partition_id=PART, batch_size=1)
    assert buf._mirrors[PART].deferred == uids_of(meta.keys)[:1]   # still owed
    with pytest.raises(RuntimeError, match="down") as err:     # retire: done, its clear owed
        buf.retire(PART, ["e2"])
    assert "retired all the same" in "".join(err.value.__notes__)
    assert buf.core.lookup(PART, "e2").removed
    monkeypatch.setattr(tq, "kv_clear", real)
    second, _ = buf.sample(global_steps=1, partition_id=PART, batch_size=1)
    assert set(uids_of(second.keys)).isdisjoint(uids_of(meta.keys) + ["e2"])
    buf.flush()
    assert prompts_left(rollout) == [] and not [k for k in rollout.listing() if k[:2] == "e2"]
    buf.close()


def test_a_fresh_background_view_serves_the_first_poll_and_the_batch_is_the_same(tq, rollout):
    groups = [G(f"a{i}", 1 + i % 3, rewards=[0.0, float(i)]) for i in range(6)]
    rollout.groups(groups)
    plain = make(None)
    want_meta, want_metrics = plain.sample(global_steps=3, partition_id=PART, batch_size=4)
    plain.close()
    rollout.clear_all()

    buf = make(30.0)
    assert buf.get_sampleable_count(3, PART) == 0            # lists the empty partition
    rollout.groups(groups)
    m = buf._mirrors[PART]
    buf._background.wake()                                   # its period is 15 s
    assert until(lambda: buf.mirror_lag(PART) is not None and len(m.order) == 12)
    lag = buf.mirror_lag(PART)
    assert 0 <= lag <= 30.0
    meta, metrics = buf.sample(global_steps=3, partition_id=PART, batch_size=4)
    assert buf.background_polls == 1
    assert uids_of(meta.keys) == uids_of(want_meta.keys) and list(meta.keys) == list(want_meta.keys)
    assert metrics == want_metrics
    buf.close()


def test_selected_prompt_keys_are_cleared_by_the_thread_right_after_sample(tq, rollout):
    rollout.groups([G(f"s{i}", 1) for i in range(5)])
    buf = make(30.0)                       # period 15 s: only the call's wake makes it clear
    meta, _ = buf.sample(global_steps=1, partition_id=PART, batch_size=3)
    chosen = sorted(set(uids_of(meta.keys)))
    m = buf._mirrors[PART]
    assert until(lambda: not m.deferred and buf._background.cleared == 3)
    assert prompts_left(rollout) == sorted({f"s{i}" for i in range(5)} - set(chosen))
    assert set(meta.keys) <= set(rollout.listing())         # the batch itself is the trainer's
    buf.close()


def test_a_call_that_must_list_makes_the_owed_clears_before_it_lists(tq, rollout, caplog):
    rollout.groups([G(f"o{i}", 1) for i in range(6)])
    buf = make(30.0)
    buf._mirror(PART)
    buf._background.stop()                 # the thread never clears: the next call must
    first, _ = buf.sample(global_steps=1, partition_id=PART, batch_size=2)
    m = buf._mirrors[PART]
    assert len(m.deferred) == 2 and not buf.mirror_lag(PART)
    assert len(prompts_left(rollout)) == 6                   # owed, not yet made
    with caplog.at_level(logging.WARNING, logger="replaylake.verl"):
        second, _ = buf.sample(global_steps=1, partition_id=PART, batch_size=2)
    assert not [r for r in caplog.records if "orphan" in r.getMessage()]
    assert m.orphans_cleared == 0 and buf.background_polls == 0
    assert set(uids_of(first.keys)).isdisjoint(uids_of(second.keys))
    left = set(prompts_left(rollout))
    assert left.isdisjoint(uids_of(first.keys)) and len(left) == 4   # second's clears are owed
    buf.close()                                                       # close makes them
    assert sorted(prompts_left(rollout)) == sorted(
        {f"o{i}" for i in range(6)} - set(uids_of(first.keys)) - set(uids_of(second.keys)))


def test_a_view_older_than_the_lag_is_not_used(tq, rollout):
    rollout.groups([G(f"l{i}", 1) for i in range(4)])
    buf = make(0.2)
    assert buf.get_sampleable_count(1, PART) == 4
    buf._background.stop()                 # nothing refreshes the view any more
    m = buf._mirrors[PART]
    assert until(lambda: usable(m, 0.2) is False and m.listed_at is not None)
    rollout.groups([G("late", 1)])
    buf.sample(global_steps=1, partition_id=PART, batch_size=5)      # needs the late group
    assert buf.background_polls == 0
    buf.close()


def test_usable_needs_a_listing_within_the_lag_and_no_change_since():
    class M:
        epoch, fresh_epoch, listed_at = 4, 4, 100.0
    m = M()
    assert usable(m, 1.0, now=101.0) and not usable(m, 1.0, now=101.001)
    assert not usable(m, None, now=100.0)
    m.epoch = 5                            # a clear made or deferred since the listing
    assert not usable(m, 1.0, now=100.5)
    m.epoch, m.listed_at = 4, None         # a listing being applied
    assert not usable(m, 1.0, now=100.5)


def test_a_listing_the_core_rejects_in_the_background_is_raised_by_the_next_call(tq, rollout,
                                                                                  caplog):
    rollout.groups([G("ok", 1)])
    buf = make(0.2)
    assert buf.get_sampleable_count(1, PART) == 1
    tq.kv_batch_put(keys=["bad"], partition_id=PART, tags=[{"is_prompt": True,
                                                           "status": "pending"}])
    m = buf._mirrors[PART]
    with caplog.at_level(logging.WARNING, logger="replaylake.verl"):
        assert until(lambda: m.fresh_epoch == -1)
    assert any("global_steps" in r.getMessage() and "next call" in r.getMessage()
               for r in caplog.records)
    with pytest.raises(IngestError, match="'bad' has no 'global_steps'"):
        buf.sample(global_steps=1, partition_id=PART, batch_size=1)
    tq.kv_clear(keys=["bad"], partition_id=PART)
    meta, _ = buf.sample(global_steps=1, partition_id=PART, batch_size=1)
    assert uids_of(meta.keys) == ["ok"]
    buf.close()


def test_a_restart_after_a_stop_before_the_threads_clear_clears_the_prompt_keys(tq, rollout,
                                                                              tmp_path, caplog):
    rollout.groups([G("k0", 1), G("k1", 1)])
    first = make(None, lake_dir=tmp_path / "lake")
    first._mirror(PART)
    first._background.stop()               # the process stops before its thread clears
    meta, _ = first.sample(global_steps=1, partition_id=PART, batch_size=1)
    assert uids_of(meta.keys) == ["k0"] and "k0" in prompts_left(rollout)
    first.core.close()                     # gone, its clear never made (no close, no flush)
    first._mirrors[PART].deferred.clear()  # ... nor when it is collected: a dead process
    second = make(None, lake_dir=tmp_path / "lake")
    with caplog.at_level(logging.WARNING, logger="replaylake.verl"):
        again, _ = second.sample(global_steps=1, partition_id=PART, batch_size=1)
    assert uids_of(again.keys) == ["k1"]   # k0 is sampled, for the lake: never again
    second.flush()
    assert prompts_left(rollout) == []
    said = [r.getMessage() for r in caplog.records if "'k0'" in r.getMessage()]
    assert len(said) == 1 and "before its thread had cleared" in said[0]
    second.close()


@pytest.mark.parametrize("lag", [None, 0.1])
def test_close_stops_the_thread(tq, rollout, lag):
    rollout.groups([G("c", 1)])
    buf = make(lag)
    buf.get_sampleable_count(1, PART)
    thread = buf._background
    assert thread.alive
    buf.close()
    assert not thread.alive


def test_a_listing_that_began_before_one_of_the_adapters_clears_is_dropped(tq, rollout):
    rollout.groups([G("x", 1), G("y", 1)])
    buf = make(30.0)                       # period 15 s: the thread lists only when woken
    assert buf.get_sampleable_count(1, PART) == 2
    m, bg = buf._mirrors[PART], buf._background
    real_list, real_apply, taken, applied = m.list_keys, m.apply, [], []

    def list_then_clear():                 # a call's clear lands while the listing is in flight
        listing = real_list()
        taken.append(listing)
        with buf._lock:
            m.clear_keys(["x"])
        return listing

    def apply(listing, began, clear_orphans=True):
        applied.append(listing)
        return real_apply(listing, began, clear_orphans)
    m.list_keys, m.apply = list_then_clear, apply
    bg.wake()
    assert until(lambda: len(taken) == 1)
    m.list_keys = real_list
    bg.wake()                              # a listing that begins after the clear is applied
    assert until(lambda: bg.polls >= 1)
    assert applied and all(a is not taken[0] for a in applied)
    assert "x" in taken[0] and "x" not in m.listing
    buf.close()


def test_with_a_lake_the_threads_take_in_lands_there_and_a_restart_continues(tq, rollout,
                                                                            tmp_path):
    import pyarrow.compute as pc

    from pipeline.lake.writer import read_table
    lake = tmp_path / "lake"
    buf = make(30.0, lake_dir=lake)
    assert buf.get_sampleable_count(2, PART) == 0
    rollout.groups([G("p", 1), G("q", 2)])
    m = buf._mirrors[PART]
    buf._background.wake()
    assert until(lambda: buf.mirror_lag(PART) is not None and len(m.order) == 4)
    meta, _ = buf.sample(global_steps=2, partition_id=PART, batch_size=1)
    assert uids_of(meta.keys) == ["p"] and buf.background_polls == 1
    buf.close()                            # makes the deferred clear of p's prompt key
    assert prompts_left(rollout) == ["q"]
    traj = read_table(lake, "trajectories")
    assert sorted(set(traj["uid"].to_pylist())) == ["p", "q"]       # taken in by the thread
    assert traj.num_rows == 4 and traj["reward"].to_pylist().count(1.0) == 2
    tq.kv_clear(keys=list(meta.keys), partition_id=PART)            # the trainer's end of step
    again = make(30.0, lake_dir=lake)
    meta, _ = again.sample(global_steps=2, partition_id=PART, batch_size=1)
    assert uids_of(meta.keys) == ["q"]
    again.close()
    dec = read_table(lake, "decisions")
    assert sorted(dec.filter(pc.equal(dec["kind"], "select"))["uid"].to_pylist()) == ["p", "q"]
    assert dec.filter(pc.equal(dec["kind"], "release"))["uid"].to_pylist() == ["p"]


def test_rollouts_written_while_the_thread_lists_are_each_sampled_once(tq, rollout, caplog):
    """A writer puts groups (prompt tags, trajectories, statuses: three TransferQueue puts each,
    any of which a listing may fall inside) while the trainer samples and clears its batches;
    the thread lists all the while. Every group is handed out exactly once, none is lost, and no
    key is ignored or cleared as an orphan."""
    import threading
    written: list[str] = []
    stop = threading.Event()

    def writer():
        i = 0
        while not stop.is_set() and i < 120:
            grp = [G(f"w{i + j}", 1, rewards=[0.0, 1.0]) for j in range(3)]
            rollout.groups(grp)
            written.extend(g.uid for g in grp)
            i += 3
            time.sleep(0.005)
    buf = make(0.05, poll_interval=0.01)
    t = threading.Thread(target=writer, daemon=True)
    sampled: list[str] = []
    with caplog.at_level(logging.WARNING, logger="replaylake.verl"):
        t.start()
        try:
            for _ in range(25):
                meta, _ = buf.sample(global_steps=1, partition_id=PART, batch_size=4)
                got = uids_of(meta.keys)
                assert len(got) == 4 and len(meta.keys) == 8
                sampled.extend(got)
                tq.kv_clear(keys=list(meta.keys), partition_id=PART)   # the trainer's step
                time.sleep(0.02)
        finally:
            stop.set()
            t.join(30)
        done, m = time.monotonic(), buf._mirrors[PART]
        assert until(lambda: buf.mirror_lag(PART) is not None and m.listed_at > done)
        left = buf.get_sampleable_count(1, PART)              # a view begun after the last write
    buf.close()
    assert len(sampled) == len(set(sampled)) == 100
    assert set(sampled) <= set(written)
    assert left == len(written) - len(sampled)                # nothing lost
    assert not [r.getMessage() for r in caplog.records
                if "ignoring" in r.getMessage() or "orphan" in r.getMessage()]
    assert buf.background_polls > 0


def test_an_adapter_collected_before_its_thread_cleared_makes_the_clears_then(tq, rollout,
                                                                               monkeypatch):
    """Dropped without close() right after `sample` (the thread not there yet): collecting the
    adapter makes the clears its call owed; the selected prompt keys do not stay for good."""
    import gc

    from pipeline.adapters.verl.background import BackgroundMirror
    monkeypatch.setattr(BackgroundMirror, "_poll_all", lambda self, adapter: None)
    rollout.groups([G(f"d{i}", 1) for i in range(3)])
    buf = make(None)
    meta, _ = buf.sample(global_steps=1, partition_id=PART, batch_size=2)
    chosen = sorted(set(uids_of(meta.keys)))
    assert set(chosen) <= set(prompts_left(rollout))     # owed, not made
    thread = buf._background
    del buf
    gc.collect()
    assert prompts_left(rollout) == sorted({f"d{i}" for i in range(3)} - set(chosen))
    assert thread.cleared == 2 and not thread.alive


@pytest.mark.parametrize("lag", [None, 30.0])
def test_the_thread_ends_when_an_unclosed_adapter_is_collected(tq, rollout, lag):
    import gc
    buf = make(lag)                        # only the collection's wake ends it
    buf.get_sampleable_count(1, PART)
    thread = buf._background
    del buf
    gc.collect()
    assert until(lambda: not thread.alive, seconds=5.0)
