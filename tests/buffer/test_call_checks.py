"""A call that raises changes nothing: release of a Batch this buffer does not hold, retire's
inputs, StepAggregator.add; and the arguments of calls checked as the constructor checks its
knobs (int64 sizes, dict/set uids, bool flags, waits no lock can take)."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from pipeline import (
    ConfigError,
    ReplayBuffer,
    SampleTimeout,
    StepAggregator,
    UnknownBatchError,
    UnknownMetricError,
)
from pipeline.decide import rules
from tests.support.lake import add_group, lake_history, traj


def decisions(lake) -> list[tuple]:
    return lake_history(lake)["decisions"]


# --- release: the Batch must be the held one -------------------------------------------------

@pytest.mark.parametrize("other_partition,other_uid", [("other", "x"), ("train", "y")])
def test_release_refuses_a_batch_of_another_buffer_and_releases_nothing(tmp_path, other_partition,
                                                                         other_uid):
    lake = tmp_path / "lake"
    mine_buf = ReplayBuffer.async_(lake=lake, max_off_policy_threshold=4)
    other_buf = ReplayBuffer.async_(max_off_policy_threshold=4)
    add_group(mine_buf, "a", 0)
    add_group(other_buf, other_uid, 0, partition=other_partition)
    mine = mine_buf.sample(1, "train", 1, timeout=5)
    theirs = other_buf.sample(1, other_partition, 1, timeout=5)
    assert theirs.batch_id == mine.batch_id          # the same id, another batch
    held, before = mine_buf.held_batches("train"), decisions(lake)
    with pytest.raises(UnknownBatchError, match=rf"release: this Batch \(partition "
                                                rf"'{other_partition}', uids \['{other_uid}'\]\) is "
                                                r"not batch 0 of this buffer \(partition 'train', "
                                                r"uids \['a'\]\)"):
        mine_buf.release(theirs)
    assert mine_buf.held_batches("train") == held and decisions(lake) == before
    with pytest.raises(UnknownBatchError, match="held_batch: this Batch"):
        mine_buf.held_batch(theirs)
    mine_buf.release(mine)                           # its own Batch still releases it
    assert mine_buf.held_batches("train") == {}
    mine_buf.close()


def test_release_by_id_releases_the_held_batch_as_before():
    buf = ReplayBuffer.async_(max_off_policy_threshold=4)
    add_group(buf, "a", 0)
    add_group(buf, "b", 0)
    first = buf.sample(1, "train", 1, timeout=5)
    second = buf.sample(1, "train", 1, timeout=5)
    buf.release(np.int64(first.batch_id))
    assert buf.held_batch(second).uids == second.uids
    buf.release(second.batch_id)
    assert buf.held_batches("train") == {}


# --- retire ------------------------------------------------------------------------------------

@pytest.fixture
def retiring(tmp_path):
    lake = tmp_path / "lake"
    buf = ReplayBuffer.async_(lake=lake, max_off_policy_threshold=4)
    buf.register(partition="train", uids=["a", "b"], global_steps=0, n=2, prompt_ids=[7, 8])
    buf.register(partition="train", uids=["c"], global_steps=5, n=2)
    yield buf, lake
    buf.close()


def test_retire_takes_each_uid_once(retiring):
    buf, lake = retiring
    assert buf.retire("train", ["a", "a", "b", "a"]) == ["a", "b"]
    evicts = [d for d in decisions(lake) if d[4] == "evict"]
    assert sorted(d[5] for d in evicts) == ["a", "b"]          # one row per group


@pytest.mark.parametrize("bad", [123, "", "  ", None, b"vanished"])
def test_retire_needs_a_str_reason_and_retires_nothing_without_one(retiring, bad):
    buf, lake = retiring
    before = decisions(lake)
    with pytest.raises(ConfigError, match=rf"retire: reason={bad!r} must be a non-empty str"):
        buf.retire("train", ["a"], reason=bad)
    assert decisions(lake) == before and buf.lookup("train", "a").removed is None


@pytest.mark.parametrize("reason", sorted(rules.reasons()))
def test_retire_refuses_the_name_of_an_eviction_rule(retiring, reason):
    """It would read as that rule's eviction in the metrics, a restored buffer and the lake."""
    buf, lake = retiring
    before = decisions(lake)
    with pytest.raises(ConfigError, match=rf"retire: reason='{reason}' is the name of the "
                                          f"{reason} eviction rule"):
        buf.retire("train", ["a"], reason=reason)
    assert decisions(lake) == before and buf.lookup("train", "a").removed is None


def test_retire_keeps_taking_the_reasons_the_docs_name(retiring):
    buf, _ = retiring
    assert buf.retire("train", ["a"], reason="missing_metric") == ["a"]   # a check, no rule
    assert buf.retire("train", ["b"]) == ["b"]                            # 'vanished'


def test_retire_refuses_a_step_before_a_groups_dispatch_and_retires_nothing(retiring):
    buf, lake = retiring
    before = decisions(lake)
    with pytest.raises(ConfigError, match=r"retire: global_steps=0 precedes the dispatch step of "
                                          r"'c' \(dispatched at step 5\)"):
        buf.retire("train", ["a", "c"], global_steps=0)
    assert decisions(lake) == before
    assert buf.lookup("train", "a").removed is None and buf.lookup("train", "c").removed is None
    assert buf.retire("train", ["a", "c"], global_steps=5) == ["a", "c"]
    spans = {d[5]: d[7] for d in decisions(lake) if d[4] == "evict"}
    assert spans == {"a": 6, "c": 1}


@pytest.mark.parametrize("bad", [{"a": 1}, {"a"}, frozenset({"a"}), 5])
def test_retire_and_register_refuse_uids_that_are_no_list(retiring, bad):
    buf, lake = retiring
    before = decisions(lake)
    with pytest.raises(ConfigError, match=r"uids=.* must be a list of uids"):
        buf.retire("train", bad)
    with pytest.raises(ConfigError, match=r"register: uids=.* must be a list of uids"):
        buf.register(partition="train", uids=bad, global_steps=1, n=2)
    assert decisions(lake) == before and buf.lookup("train", "a").removed is None


def test_retire_refuses_a_uid_that_is_no_str(retiring):
    buf, _ = retiring
    with pytest.raises(ConfigError, match=r"retire: uids\[1\]=\['b'\] is not a uid"):
        buf.retire("train", ["a", ["b"]])
    assert buf.lookup("train", "a").removed is None


def test_register_takes_uids_as_a_tuple_or_an_array():
    buf = ReplayBuffer.async_()
    buf.register(partition="train", uids=("t1",), global_steps=0, n=2)
    buf.register(partition="train", uids=np.array(["t2", "t3"]), global_steps=0, n=2)
    assert buf.counts("train")["pending"] == 3


# --- sizes, flags and waits of calls ---------------------------------------------------------

def test_dispatch_capacity_refuses_batch_sizes_beyond_int64():
    buf = ReplayBuffer.async_(max_off_policy_threshold=4)
    with pytest.raises(ConfigError, match=rf"dispatch_capacity: batch_size={2**70} must be a "
                                          r"positive int no larger than 2\*\*63 - 1"):
        buf.dispatch_capacity(0, "train", batch_size=2**70)
    with pytest.raises(ConfigError, match=rf"dispatch_capacity: batch_size={2**61} with "
                                          "max_off_policy_threshold 4"):
        buf.dispatch_capacity(0, "train", batch_size=2**61)     # 4 x 2**61 places: no int64
    assert buf.dispatch_capacity(0, "train", batch_size=2**60) == 2**62


def test_sample_refuses_a_batch_size_beyond_int64():
    buf = ReplayBuffer.async_()
    with pytest.raises(ConfigError, match=rf"sample: batch_size={2**63} must be a positive int"):
        buf.sample(0, "train", 2**63, timeout=0)


@pytest.mark.parametrize("bad", ["no", 1, None])
def test_reissue_release_held_must_be_a_bool(bad):
    buf = ReplayBuffer.async_(max_off_policy_threshold=4)
    add_group(buf, "a", 0)
    batch = buf.sample(1, "train", 1, timeout=5)
    with pytest.raises(ConfigError, match=f"reissue: release_held={bad!r} must be True or False"):
        buf.reissue(1, release_held=bad)
    assert list(buf.held_batches("train")) == [batch.batch_id]


def test_a_put_timeout_beyond_what_a_wait_takes_waits_for_room():
    """A timeout past threading.TIMEOUT_MAX raised a bare OverflowError; it waits as None does."""
    buf = ReplayBuffer.async_(max_off_policy_threshold=4, max_live_bytes=300)
    add_group(buf, "a", 0)
    buf.register(partition="train", uids=["b"], global_steps=0, n=2)
    batch = buf.sample(1, "train", 1, timeout=5)
    done: dict = {}

    def put() -> None:
        try:
            done["stored"] = buf.put([traj("b", 0), traj("b", 1)], timeout=1e10)
        except Exception as exc:          # reported below
            done["error"] = exc

    t = threading.Thread(target=put, daemon=True)
    t.start()
    t.join(0.5)
    assert done == {}                     # waiting for room
    buf.release(batch)
    t.join(10)
    assert done == {"stored": 2}


def test_timeouts_take_numpy_numbers():
    buf = ReplayBuffer.async_()
    buf.register(partition="train", uids=["a"], global_steps=0, n=2)
    with pytest.raises(SampleTimeout):
        buf.sample(1, "train", 1, timeout=np.float32(0.05))


# --- StepAggregator.add: all or nothing --------------------------------------------------------

SAMPLES = "training/off_policy/evicted_samples"
SPANS = "training/off_policy/trajectory_spans/mean"


def test_a_mean_without_its_weight_adds_nothing_and_the_retry_counts_once():
    agg = StepAggregator()
    m = {SAMPLES: 2, SPANS: 1.5}
    with pytest.raises(UnknownMetricError, match="weighted by 'n_trajectories'"):
        agg.add(m)
    assert agg.result() == {}
    agg.add(m, weights={"n_trajectories": 4})
    assert agg.result() == {SAMPLES: 2, SPANS: 1.5}


def test_an_undeclared_key_adds_nothing():
    agg = StepAggregator()
    with pytest.raises(UnknownMetricError, match="'training/bogus' is not declared"):
        agg.add({SAMPLES: 3, "training/bogus": 1})
    assert agg.result() == {}


@pytest.mark.parametrize("metrics,kw,match", [
    ({SAMPLES: None}, {}, rf"metrics\['{SAMPLES}'\]=None must be a finite number"),
    ({SAMPLES: "3"}, {}, rf"metrics\['{SAMPLES}'\]='3' must be a finite number"),
    ({SAMPLES: True}, {}, rf"metrics\['{SAMPLES}'\]=True must be a finite number"),
    ({SAMPLES: float("nan")}, {}, rf"metrics\['{SAMPLES}'\]=nan must be a finite number"),
    ({SAMPLES: 2.5}, {}, rf"metrics\['{SAMPLES}'\]=2.5 must be a whole number"),
    (5, {}, "metrics=5 must be a dict"),
    ([(SAMPLES, 1)], {}, r"metrics=\[.*\] must be a dict"),
    (None, {}, "metrics=None"),
    ({SAMPLES: 1}, {"reward_counts": {1.0: "x"}}, r"reward_counts\[1.0\]='x' must be an int >= 0"),
    ({SAMPLES: 1}, {"reward_counts": {1.0: -1}}, r"reward_counts\[1.0\]=-1 must be an int >= 0"),
    ({SAMPLES: 1}, {"reward_counts": {"high": 1}}, "reward_counts has the key 'high'"),
    ({SAMPLES: 1}, {"reward_counts": [1.0]}, r"reward_counts=\[1.0\] must be a dict"),
    ({SPANS: 1.5}, {"weights": {"n_trajectories": None}},
     r"weights\['n_trajectories'\]=None must be a finite number >= 0"),
    ({SPANS: 1.5}, {"weights": {"n_trajectories": -4}},
     r"weights\['n_trajectories'\]=-4 must be a finite number >= 0"),
])
def test_a_bad_value_is_a_config_error_naming_it_and_adds_nothing(metrics, kw, match):
    agg = StepAggregator()
    agg.add({SAMPLES: 1}, reward_counts={0.0: 1})
    before = (agg.result(), dict(agg.reward_counts))
    with pytest.raises(ConfigError, match=rf"StepAggregator.add: {match}"):
        agg.add(metrics, **kw)
    assert (agg.result(), agg.reward_counts) == before


def test_numpy_values_are_added_as_numbers():
    agg = StepAggregator()
    agg.add({SAMPLES: np.int64(2), SPANS: np.float32(1.5)},
            weights={"n_trajectories": np.int64(4)}, reward_counts={np.float64(1.0): np.int64(2)})
    agg.add({SAMPLES: 3.0})
    assert agg.result() == {SAMPLES: 5, SPANS: 1.5}
    assert agg.reward_counts == {1.0: 2}
