"""The public API catches mistakes at the call, with errors chosen by structure, not spelling."""
from __future__ import annotations

import pytest

import pipeline
from pipeline import (
    ConfigError,
    IngestError,
    PresetKeywordError,
    ReplayBuffer,
    SampleTimeout,
    UnknownBatchError,
    UnknownGroupError,
)
from tests.support.lake import add_group, traj


def test_star_import_exports_every_name_it_lists():
    ns: dict = {}
    exec("from pipeline import *", ns)
    assert set(pipeline.__all__) <= set(ns)


def test_the_tensor_pool_and_its_error_are_public_names():
    from pipeline.to_torch.pool import TensorPool
    assert pipeline.TensorPool is TensorPool
    assert issubclass(pipeline.PoolError, pipeline.ReplayLakeError)
    with pytest.raises(pipeline.PoolError, match="max_bytes"):
        TensorPool(max_bytes=-1)


def test_a_batch_writes_its_tensors_into_a_pool_and_gets_them_back():
    import torch
    buf = ReplayBuffer.sync()
    add_group(buf, "g", 1, (0.0, 1.0, 1.0, 0.0))
    batch = buf.sample(global_steps=1, partition="train", batch_size=1, timeout=5)
    pool = pipeline.TensorPool()
    pooled = batch.to_torch(layout="packed", pool=pool)
    plain = batch.to_torch(layout="packed")
    assert pooled.keys() == plain.keys()
    assert all(torch.equal(pooled[k], plain[k]) for k in plain)
    assert pool.loaned_bytes > 0
    pool.give_back(pooled)
    assert pool.loaned_bytes == 0


def test_register_refuses_a_string_of_uids_and_an_empty_call():
    buf = ReplayBuffer.sync()
    with pytest.raises(ConfigError, match=r"uids=\['p0'\]"):
        buf.register(partition="train", uids="p0", global_steps=0)
    with pytest.raises(ConfigError, match="nothing to do"):
        buf.register()
    assert buf.partitions() == []


def test_refill_fn_must_be_callable_at_construction():
    with pytest.raises(ConfigError, match="refill_fn=5 must be callable"):
        ReplayBuffer.async_(refill_fn=5)


def test_put_of_one_dict_says_to_wrap_it_in_a_list():
    buf = ReplayBuffer.sync()
    buf.register(partition="train", uids=["p"], global_steps=0)
    with pytest.raises(IngestError, match=r"wrap it in a list"):
        buf.put(traj("p", 0))
    assert buf.put([traj("p", 0)]) == 1


def test_a_typo_in_a_preset_keyword_names_the_method_and_the_closest_keyword():
    with pytest.raises(PresetKeywordError, match=r"ReplayBuffer\.async_\(\).*'max_off_policy_threshold'"):
        ReplayBuffer.async_(max_off_policy_treshold=3)
    assert issubclass(PresetKeywordError, TypeError)


def test_a_second_release_raises_a_readable_unknown_batch_error():
    buf = ReplayBuffer.sync(poll_interval=0.05)
    add_group(buf, "a", 0)
    batch = buf.sample(0, "train", 1, timeout=5)
    buf.release(batch)
    with pytest.raises(UnknownBatchError) as info:
        buf.release(batch)
    assert str(info.value).startswith("batch 0 is not held")   # not a quoted repr
    assert isinstance(info.value, KeyError)


def test_partition_and_partition_id_are_the_same_argument():
    buf = ReplayBuffer.sync(poll_interval=0.05)
    add_group(buf, "a", 0)
    add_group(buf, "b", 0)
    assert buf.sample(0, partition="train", batch_size=1, timeout=5).uids == ["a"]
    assert buf.sample(0, partition_id="train", batch_size=1, timeout=5).uids == ["b"]
    with pytest.raises(ConfigError, match="disagree"):
        buf.sample(0, partition="train", partition_id="val", batch_size=1)
    assert buf.counts(partition_id="train") == buf.counts("train")


def test_partition_id_is_an_alias_of_partition_in_every_method():
    """Every method naming a partition takes verl's spelling too, with the same meaning."""
    buf = ReplayBuffer.sync(poll_interval=0.05)
    buf.register(partition_id="train", uids=["a", "b", "c"], global_steps=0)
    buf.put([traj(u, 0) for u in ("a", "b", "c")])
    buf.update_status(partition_id="train", uids=["a", "b", "c"], status="finished")
    assert buf.lookup(partition_id="train", uid="a") == buf.lookup("train", "a")
    buf.prepare(partition_id="train")
    assert buf.sampleable_uids(partition_id="train") == ["a", "b", "c"]
    assert buf.candidates(partition_id="train").equals(buf.candidates("train"))
    assert buf.retire(partition_id="train", uids=["c"]) == ["c"]
    batch = buf.sample(0, partition_id="train", batch_size=1, timeout=5)
    assert buf.held_batches(partition_id="train") == buf.held_batches("train") == \
        {batch.batch_id: [("a", 0, 0)]}
    with pytest.raises(ConfigError, match="retire: partition='train' and partition_id='val' "
                                          "disagree"):
        buf.retire("train", ["b"], partition_id="val")
    with pytest.raises(ConfigError, match="lookup: which partition"):
        buf.lookup(uid="a")


def test_numpy_integers_are_taken_as_steps_sizes_and_batch_ids():
    """A trainer's step and sizes often come out of numpy (verl's arrays): taken as their int."""
    import numpy as np
    buf = ReplayBuffer.sync(poll_interval=0.05)
    add_group(buf, "a", 0)
    add_group(buf, "b", 0)
    assert buf.get_sampleable_count(np.int64(0), "train") == 2
    batch = buf.sample(np.int64(0), "train", np.int32(1), timeout=5)
    assert batch.step == 0 and type(batch.step) is int and batch.uids == ["a"]
    assert buf.held_batch(np.int64(batch.batch_id)).uids == ["a"]
    assert buf.held_batch(batch).uids == ["a"]
    buf.release(np.int64(batch.batch_id))


@pytest.mark.parametrize(("call", "match"), [
    (lambda b: b.sample(0, "train", 1, timeout="1"), r"sample: timeout='1' must be a number"),
    (lambda b: b.sample(0, "train", 1, timeout=float("nan")), r"sample: timeout=nan"),
    (lambda b: b.wait_for_sampleable(0, "train", 1, timeout="1"),
     r"wait_for_sampleable: timeout='1'"),
    (lambda b: b.sample(0, "train", 1, before_poll=3), r"sample: before_poll=3 must be callable"),
    (lambda b: b.wait_for_sampleable(0, "train", 0), r"wait_for_sampleable: target_count=0 must "
                                                     "be a positive int"),
    (lambda b: b.put([traj("a", 0)], timeout="x"), r"put: timeout='x' must be a number"),
    (lambda b: b.held_batch("0"), r"held_batch: '0' is not a batch"),
    (lambda b: b.release(1.0), r"release: 1.0 is not a batch"),
])
def test_wrongly_typed_arguments_are_config_errors_naming_the_call(call, match):
    buf = ReplayBuffer.sync(poll_interval=0.05)
    buf.register(partition="train", uids=["a"], global_steps=0)
    with pytest.raises(ConfigError, match=match):
        call(buf)
    assert buf.counts("train")["pending"] == 1         # nothing done


def test_put_timeout_none_waits_for_room_as_long_as_it_takes():
    """None means no limit, as for sample: the put waits until a release makes room."""
    import threading
    import time
    buf = ReplayBuffer.sync(poll_interval=0.05, max_live_bytes=300)   # room for one group
    add_group(buf, "a", 0)
    buf.register(partition="train", uids=["b"], global_steps=0)
    batch = buf.sample(0, "train", 1, timeout=5)
    done: list = []
    t = threading.Thread(target=lambda: done.append(buf.put([traj("b", 0)], timeout=None)))
    t.start()
    time.sleep(0.3)
    assert not done                          # still waiting: the budget is full
    buf.release(batch)
    t.join(timeout=10)
    assert done == [1]


@pytest.mark.parametrize(("kw", "match"), [
    ({"global_steps": -1}, "global_steps"), ({"batch_size": 0}, "batch_size"),
    ({"batch_size": True}, "batch_size"), ({"partition": "../x"}, "partition"),
])
def test_bad_sample_arguments_are_config_errors(kw, match):
    buf = ReplayBuffer.sync()
    args = {"global_steps": 0, "partition": "train", "batch_size": 1, **kw}
    with pytest.raises((ConfigError, IngestError), match=match):
        buf.sample(**args)


def test_reissue_with_a_negative_step_is_a_config_error():
    with pytest.raises(ConfigError, match="global_steps"):
        ReplayBuffer.sync().reissue(-1)


def test_sampling_a_partition_never_seen_names_the_known_ones(caplog):
    buf = ReplayBuffer.sync(poll_interval=0.05)
    add_group(buf, "a", 0)
    with pytest.raises(SampleTimeout, match=r"'trian' has never received a group.*'train'"):
        buf.sample(0, "trian", 1, timeout=0.1)
    assert any("trian" in r.getMessage() for r in caplog.records)


def test_unknown_group_error_is_chosen_by_the_problem_kind():
    buf = ReplayBuffer.sync()
    with pytest.raises(UnknownGroupError):
        buf.put([traj("ghost", 0)])
    buf.register(partition="train", uids=["p"], global_steps=0)
    with pytest.raises(IngestError) as info:            # one unknown, one invalid row
        buf.put([traj("ghost", 0), traj("p", 0, min_gs=3, max_gs=1)])
    assert not isinstance(info.value, UnknownGroupError)
    assert {p.kind for p in info.value.problems} == {"unknown_group", "invalid"}


def test_lookup_returns_a_frozen_view():
    buf = ReplayBuffer.sync()
    buf.register(partition="train", uids=["p"], global_steps=3, n=2)
    view = buf.lookup("train", "p")
    assert (view.uid, view.global_steps, view.n, view.status, view.removed) == \
        ("p", 3, 2, "pending", None)
    with pytest.raises(AttributeError):
        view.status = "finished"
    assert buf.lookup("train", "nobody") is None


def test_lookup_many_is_lookup_of_each_uid_in_order():
    """Live, retired and unknown uids, and a partition nothing ever named; a uid that is not a
    str is refused, naming it."""
    buf = ReplayBuffer.sync()
    add_group(buf, "done", 1)
    add_group(buf, "kept", 2)
    buf.retire("train", ["done"])
    uids = ["kept", "nobody", "done", "kept"]
    assert buf.lookup_many("train", uids) == [buf.lookup("train", u) for u in uids]
    assert [v and v.removed for v in buf.lookup_many("train", uids)] == \
        [None, None, "retired", None]
    assert buf.lookup_many("elsewhere", ["kept"]) == [None]
    assert buf.lookup_many(partition_id="train", uids=["kept"]) == [buf.lookup("train", "kept")]
    assert buf.lookup_many("train", []) == []
    with pytest.raises(ConfigError, match="uid 7 must be"):
        buf.lookup_many("train", ["kept", 7])
    with pytest.raises(ConfigError, match="one string"):
        buf.lookup_many("train", "kept")


def test_retire_removes_live_groups_for_good_with_a_decision_of_its_own(tmp_path):
    from pipeline.lake.writer import read_table
    with ReplayBuffer.sync(lake=tmp_path / "lake", poll_interval=0.05) as buf:
        add_group(buf, "done", 1)
        add_group(buf, "flying", 1, status="running")
        add_group(buf, "kept", 2)
        assert buf.retire("train", ["done", "flying", "nobody"]) == ["done", "flying"]
        assert buf.counts("train") == {"pending": 0, "running": 0, "finished": 1, "failure": 0,
                                       "sampled": 0}
        assert buf.sample(2, "train", 1, timeout=5).uids == ["kept"]
        with pytest.raises(UnknownGroupError):
            buf.put([traj("flying", 1)])
    dec = read_table(tmp_path / "lake", "decisions").to_pylist()
    assert [(d["uid"], d["kind"], d["reason"]) for d in dec if d["reason"] == "vanished"] == [
        ("done", "evict", "vanished"), ("flying", "evict", "vanished")]
    with ReplayBuffer.sync(lake=tmp_path / "lake") as again:      # restore agrees
        assert again.lookup("train", "done").removed == "retired"


def test_errors_with_extra_fields_survive_pickling():
    import pickle

    from schemas import Problem
    err = UnknownGroupError("trajectories", [Problem("uid", (1,), "unknown", "unknown_group")])
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is UnknownGroupError and back.problems == err.problems
    assert str(back) == str(err)
    t = pickle.loads(pickle.dumps(SampleTimeout("waited", {"pending": 2})))
    assert t.counts == {"pending": 2}


def test_a_partition_without_groups_is_named_once_while_others_have_some(caplog) -> None:
    """A misspelt partition waits like an empty one; one warning names the ones with groups
    (an adapter's `before_poll`, which brings groups in at the first poll, turns it off)."""
    import logging

    from tests.support.policies import group
    buf = ReplayBuffer.async_(max_off_policy_threshold=None)
    group(buf, "u1", 1, [0.0, 1.0])
    with caplog.at_level(logging.WARNING, logger="replaylake"):
        for _ in range(2):
            with pytest.raises(SampleTimeout):
                buf.sample(1, "trian", 1, timeout=0.01)
        with pytest.raises(SampleTimeout):
            buf.sample(1, "other", 1, timeout=0.01, before_poll=lambda: None)
    said = [r.getMessage() for r in caplog.records if "has no group yet" in r.getMessage()]
    assert len(said) == 1 and "'trian'" in said[0] and "['train']" in said[0]
