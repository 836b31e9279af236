"""Trajectories the buffer cannot take, named metrics as verl's float() reads them, the adapter's
`retire`, its strategy error, and verl's TransferQueue checkpoint resume over a lake that went
further: one bad group (or one rolled-back group) never blocks or leaks the partition.
"""
from __future__ import annotations

import logging

import pytest

from pipeline.adapters.verl import ReplayBufferAsync
from pipeline.errors import MissingMetricError
from tests.adapters.verl._harness import G, assert_same, run_both, traj_record, uids_of

pytestmark = pytest.mark.verl

FAILED = "training/rollout_failure/evicted_samples"


def make(refills, **kw):
    return ReplayBufferAsync("colocate_async", {}, 8, "drop", {}, poll_interval=0.05,
                             refill_fn=refills.append, **kw)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "replaylake.verl" and r.levelno == logging.WARNING]


def test_a_nan_reward_fails_its_group_only_and_the_others_are_sampled(tq, rollout, tmp_path,
                                                                       caplog):
    rollout.groups([G("good", 1), G("bad", 1, rewards=(float("nan"), 1.0))])
    refills: list[int] = []
    buf = make(refills, lake_dir=tmp_path / "lake")          # reads every reward (the default)
    try:
        with caplog.at_level(logging.WARNING, logger="replaylake.verl"):
            meta, metrics = buf.sample(global_steps=1, partition_id="train", batch_size=1)
        assert uids_of(meta.keys) == ["good"] and metrics == {FAILED: 1} and refills == [1]
        buf.flush()                       # the clears the call left to the adapter's thread
        assert sorted(rollout.listing()) == ["good_0_0", "good_1_0"]     # bad's keys cleared
        said = [m for m in _warnings(caplog) if "'bad'" in m]
        assert len(said) == 1 and "bad_0_0" in said[0] and "NaN" in said[0]
        assert buf.core.lookup("train", "bad").removed
    finally:
        buf.close()


def _bad_record(uid: str, session: int, **change) -> tuple[str, dict, dict]:
    import torch
    key, fields, tag = traj_record(uid, session, 1, float(session), acc=float(session))
    if "responses" in change:
        fields["responses"] = torch.tensor(change["responses"], dtype=torch.int64)
    if "version" in change:
        tag.update(min_global_steps=change["version"], max_global_steps=change["version"])
    if "acc" in change:
        fields["extra_fields"]["reward_extra_info"] = {"acc": change["acc"]}
    return key, fields, tag


def test_every_row_level_refusal_fails_just_its_group(tq, rollout, caplog):
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict
    uids = ["good", "negtok", "bigtok", "future", "listacc"]
    rollout.prompts(uids, 1, "running")
    records = [_bad_record("good", s) for s in (0, 1)] + [
        _bad_record("negtok", 0, responses=[-1, 2, 3, 4]), _bad_record("negtok", 1),
        _bad_record("bigtok", 0, responses=[2**40, 2, 3, 4]), _bad_record("bigtok", 1),
        _bad_record("future", 0, version=2**62), _bad_record("future", 1),
        _bad_record("listacc", 0, acc=[1.0]), _bad_record("listacc", 1)]
    tq.kv_batch_put(keys=[k for k, _, _ in records], partition_id="train",
                    fields=list_of_dict_to_tensordict([f for _, f, _ in records]),
                    tags=[t for _, _, t in records])
    rollout.status(uids, "finished")
    refills: list[int] = []
    buf = make(refills, mirror_fields="full", filter_groups_metric="acc")
    try:
        with caplog.at_level(logging.WARNING, logger="replaylake.verl"):
            meta, metrics = buf.sample(global_steps=1, partition_id="train", batch_size=1)
        assert uids_of(meta.keys) == ["good"] and metrics[FAILED] == 4 and refills == [4]
        buf.flush()
        assert sorted(rollout.listing()) == ["good_0_0", "good_1_0"]
        said = "\n".join(_warnings(caplog))
        for key, why in (("negtok_0_0", "token ids must be >= 0"), ("bigtok_0_0", "int32"),
                         ("future_0_0", "2**62"), ("listacc_0_0", "[1.0]")):
            assert key in said and why in said, (key, said)
    finally:
        buf.close()


def test_a_numeric_string_metric_is_read_as_verls_float_reads_it(tq):
    def scenario(ctx):
        ctx.rollout.groups([G("a", 1, acc=("1.0", "1.0")), G("z", 1, acc=(0.0, 1.0))])
        ctx.sample(ctx.buffer("async", filter_groups_metric="acc"), 1, 1)
    verl, ours = run_both(tq, scenario)
    assert_same(verl, ours)
    assert uids_of(ours[0].keys) == ["z"] and ours[0].metrics["_dapo_filtered_reward_counts"] == {
        1.0: 1}


def test_the_missing_metric_errors_way_on_works_on_the_adapter(tq, rollout):
    rollout.groups([G("a", 1, acc=(1.0, None)), G("z", 1, acc=(0.0, 1.0))])
    buf = make([], filter_groups_metric="acc")
    try:
        with pytest.raises(MissingMetricError, match=r"retire\('train', uids") as err:
            buf.sample(global_steps=1, partition_id="train", batch_size=1)
        assert "['a']" in str(err.value)
        assert buf.retire("train", ["a"], reason="missing_metric") == ["a"]
        assert sorted(rollout.listing()) == ["z", "z_0_0", "z_1_0"]      # a's keys cleared
        meta, _ = buf.sample(global_steps=1, partition_id="train", batch_size=1)
        assert uids_of(meta.keys) == ["z"]
    finally:
        buf.close()


def test_a_bad_strategy_error_lists_only_what_the_adapter_takes():
    from pipeline.adapters.verl import VerlStrategyError
    with pytest.raises(VerlStrategyError, match="Invalid max off policy strategy") as err:
        ReplayBufferAsync("colocate_async", {}, 8, "Drop", {})
    assert "'drop', 'wait', 'admit'" in str(err.value) and "mask" not in str(err.value)


def test_verls_checkpoint_resume_clears_groups_the_lake_already_trained(tq, rollout, tmp_path,
                                                                        caplog):
    lake, ckpt = tmp_path / "lake", str(tmp_path / "tq")
    rollout.groups([G("a", 1), G("b", 1)])
    tq.save_checkpoint(ckpt, metadata={"global_steps": 2})        # after step 1
    first = make([], lake_dir=lake)
    meta, _ = first.sample(global_steps=2, partition_id="train", batch_size=1)
    assert uids_of(meta.keys) == ["a"]
    tq.kv_clear(keys=meta.keys, partition_id="train")             # trained at step 2, then a crash
    first.close()
    rollout.clear_all()
    tq.load_checkpoint(ckpt)                                      # verl's resume: step-1 state
    second = make([], lake_dir=lake)
    try:
        with caplog.at_level(logging.WARNING, logger="replaylake.verl"):
            meta, _ = second.sample(global_steps=2, partition_id="train", batch_size=1)
        assert uids_of(meta.keys) == ["b"]
        second.flush()
        assert sorted(rollout.listing()) == ["b_0_0", "b_1_0"]    # none of a's keys left behind
        said = _warnings(caplog)
        assert len(said) == 1 and "'a'" in said[0] and "checkpoint" in said[0]
        assert "orphan" not in said[0]
    finally:
        second.close()
