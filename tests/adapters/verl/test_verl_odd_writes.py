"""Writes verl's own buffer copes with and the adapter once did not: trajectory keys cleared by
someone else, a key whose session is not ASCII digits or too large, `rm_scores` written as a
plain number, trajectories written without any tag, a prompt tag verl cannot use, a status verl
does not know. None of them may lose a batch, block the partition or leak a key."""
from __future__ import annotations

import logging
import signal

import pytest

from pipeline.adapters.verl import ReplayBufferAsync
from pipeline.adapters.verl.keys import parse_key
from pipeline.errors import IngestError
from tests.adapters.verl._harness import G, traj_record, uids_of

pytestmark = pytest.mark.verl


@pytest.fixture(autouse=True)
def _no_hang():
    """verl's `sample` blocks until it can fill the batch: where a regression would leave it
    waiting, the test fails after a minute instead of holding the suite."""
    def fail(*_):
        raise TimeoutError("still blocked after 60 s: the batch could not be filled")
    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def make(refills=None, **kw):
    return ReplayBufferAsync("colocate_async", {}, 8, "drop", {}, poll_interval=0.05,
                             refill_fn=(refills if refills is not None else []).append, **kw)


def _warnings(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records
                     if r.name == "replaylake.verl" and r.levelno == logging.WARNING)


def test_trajectory_keys_cleared_by_someone_else_retire_their_group_before_any_batch(
        tq, rollout, caplog):
    """The buffer took in a's two trajectories, then someone else cleared them (the prompt key
    stays). The core cannot train a without them: a is retired as `vanished` (its prompt key
    cleared) before the poll decides, so the batch is b alone, handed out whole. (It used to
    select a and b, clear both prompt keys, then fail on the key count: b was lost.)"""
    rollout.groups([G("a", 1), G("b", 1), G("c", 1)])
    buf = make()
    try:
        assert buf.get_sampleable_count(1, "train") == 3          # mirrored
        tq.kv_clear(keys=["a_0_0", "a_1_0"], partition_id="train")
        with caplog.at_level(logging.WARNING, logger="replaylake.verl"):
            meta, _ = buf.sample(global_steps=1, partition_id="train", batch_size=2)
        assert uids_of(meta.keys) == ["b", "c"] and len(meta.keys) == 4
        assert "a_0_0" in _warnings(caplog) and "vanished" in _warnings(caplog)
        assert buf.core.lookup("train", "a").removed
        assert "a" not in rollout.listing()
        # a key of a written again is a write to a removed group: cleared, never taken
        rollout.trajectories([G("a", 1, rewards=(0.0,))])
        rollout.groups([G("d", 1)])
        meta, _ = buf.sample(global_steps=1, partition_id="train", batch_size=1)
        assert uids_of(meta.keys) == ["d"]
        assert not [k for k in rollout.listing() if k.startswith("a")]
    finally:
        buf.close()


@pytest.mark.parametrize("key", ["a_²_0", "a_0_³", "a_99999999999999999999_0", "a_0_2147483648"])
def test_a_key_whose_numbers_are_not_ascii_or_too_large_is_left_alone(key):
    assert parse_key(key) is None
    assert parse_key("a_2147483647_0") == ("a", 2147483647, 0)


def test_a_malformed_trajectory_key_never_blocks_the_partition(tq, rollout):
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict
    rollout.prompts(["a"], 1, "running")
    records = [traj_record("a", 0, 1, 1.0)]
    _, f, t = traj_record("a", 1, 1, 0.0)
    records.append(("a_²_0", f, t))
    tq.kv_batch_put(keys=[k for k, _, _ in records], partition_id="train",
                    fields=list_of_dict_to_tensordict([f for _, f, _ in records]),
                    tags=[t for _, _, t in records])
    rollout.status(["a"], "finished")
    buf = make()
    try:
        meta, _ = buf.sample(global_steps=1, partition_id="train", batch_size=1)
        assert list(meta.keys) == ["a_0_0"]
        assert "a_²_0" in rollout.listing()                       # not ours to delete
    finally:
        buf.close()


def test_rm_scores_written_as_a_number_is_that_reward_and_a_word_fails_its_group_only(
        tq, rollout, tmp_path, caplog):
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict
    rollout.prompts(["num", "word", "ok"], 1, "running")
    records = []
    for uid, values in (("num", (1.0, 0.0)), ("word", ("high", 0.0)), ("ok", (1.0, 0.0))):
        for s, v in enumerate(values):
            k, f, t = traj_record(uid, s, 1, 0.0)
            f["rm_scores"] = v if uid != "ok" else f["rm_scores"]
            records.append((k, f, t))
    tq.kv_batch_put(keys=[k for k, _, _ in records], partition_id="train",
                    fields=list_of_dict_to_tensordict([f for _, f, _ in records]),
                    tags=[t for _, _, t in records])
    rollout.status(["num", "word", "ok"], "finished")
    buf = make(lake_dir=tmp_path / "lake")            # the lake records every reward
    try:
        with caplog.at_level(logging.WARNING, logger="replaylake.verl"):
            meta, _ = buf.sample(global_steps=1, partition_id="train", batch_size=2)
        assert uids_of(meta.keys) == ["num", "ok"]
        assert buf.last_batch.table.column("reward").to_pylist() == [1.0, 0.0, 0.0, 0.0]
        assert "word_0_0" in _warnings(caplog) and "rm_scores" in _warnings(caplog)
        assert not [k for k in rollout.listing() if k.startswith("word")]
    finally:
        buf.close()


def test_trajectories_written_without_any_tag_are_taken_once_their_group_is_finished(tq, rollout):
    """verl's put writes a key, then its tags, so a listing between the two shows `{}`: such a
    key waits. Once the group's terminal status is listed its trajectories were written whole,
    so a key still without tags has none: it is taken (versions from extra_fields), not left
    waiting forever while its group is evicted as an empty failure."""
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict
    rollout.prompts(["g"], 1, "running")
    records = [traj_record("g", s, 1, float(s)) for s in (0, 1)]
    tq.kv_batch_put(keys=[k for k, _, _ in records], partition_id="train",
                    fields=list_of_dict_to_tensordict([f for _, f, _ in records]))
    refills: list[int] = []
    buf = make(refills)
    try:
        assert buf.get_sampleable_count(1, "train") == 0          # untagged, group running
        rollout.status(["g"], "finished")
        meta, _ = buf.sample(global_steps=1, partition_id="train", batch_size=1)
        assert list(meta.keys) == ["g_0_0", "g_1_0"] and refills == []
        table = buf.last_batch.table        # versions read from extra_fields, as documented
        assert table.column("min_global_steps").to_pylist() == [0, 0]
        assert table.column("versions_inferred").to_pylist() == [False, False]
    finally:
        buf.close()


def test_a_prompt_tag_verl_cannot_use_is_named_with_its_key_and_the_way_on(tq, rollout):
    tq.kv_batch_put(keys=["bad"], partition_id="train",
                    tags=[{"is_prompt": True, "status": "running", "global_steps": "3"}])
    rollout.groups([G("ok", 1)])
    buf = make()
    try:
        with pytest.raises(IngestError) as err:
            buf.sample(global_steps=1, partition_id="train", batch_size=1)
        text = str(err.value)
        assert "'bad'" in text and "global_steps '3' (str)" in text and "kv_clear" in text
        tq.kv_clear(keys=["bad"], partition_id="train")           # the way on it names
        meta, _ = buf.sample(global_steps=1, partition_id="train", batch_size=1)
        assert uids_of(meta.keys) == ["ok"]
    finally:
        buf.close()


def test_a_status_verl_does_not_write_leaves_the_group_as_it_was(tq, rollout, caplog):
    rollout.groups([G("ok", 1)])
    rollout.prompts(["odd"], 1, "running")
    rollout.trajectories([G("odd", 1)])
    rollout.status(["odd"], "succeeded")
    buf = make()
    try:
        with caplog.at_level(logging.WARNING, logger="replaylake.verl"):
            meta, _ = buf.sample(global_steps=1, partition_id="train", batch_size=1)
            assert buf.get_sampleable_count(1, "train") == 0
        assert uids_of(meta.keys) == ["ok"]
        said = _warnings(caplog)
        assert said.count("'succeeded'") == 1 and "'odd'" in said      # warned once
        assert buf.core.lookup("train", "odd").status == "pending"     # as first listed
        rollout.status(["odd"], "finished")
        meta, _ = buf.sample(global_steps=1, partition_id="train", batch_size=1)
        assert uids_of(meta.keys) == ["odd"]
    finally:
        buf.close()


def test_a_second_partition_is_not_called_empty_before_its_first_poll(tq, rollout, caplog):
    """The core warns of a partition without groups while others have some (a misspelt name);
    through the adapter a partition's groups arrive at its first poll, so no warning then."""
    rollout.groups([G("t", 1)])
    rollout.groups([G("v", 1)], partition="val")
    buf = make()
    try:
        with caplog.at_level(logging.WARNING):
            buf.sample(global_steps=1, partition_id="train", batch_size=1)
            meta, _ = buf.sample(global_steps=1, partition_id="val", batch_size=1)
        assert uids_of(meta.keys) == ["v"]
        assert not [r for r in caplog.records if "has no group yet" in r.getMessage()]
    finally:
        buf.close()
