"""What the verl adapter writes to replaylake's lake: every mirrored trajectory (rewards, named
metrics, versions from the tags / extra_fields / inferred, tokens with mirror_fields=full) and
every decision; and a restart on the same lake picks up where the last instance stopped.
"""
from __future__ import annotations

import pyarrow.compute as pc
import pytest

from pipeline.adapters.verl.dropin import ReplayBufferAsync
from pipeline.lake.writer import read_table
from tests.adapters.verl._harness import G, uids_of

pytestmark = pytest.mark.verl


def make(lake, refills, threshold=2, **kw):
    def refill(n):
        refills.append(n)
        return n
    return ReplayBufferAsync("colocate_async", {}, threshold, "drop", {}, poll_interval=0.05,
                             refill_fn=refill, lake_dir=lake, **kw)


def test_trajectories_and_decisions_land_in_the_lake(tq, rollout, tmp_path):
    lake = tmp_path / "lake"
    rollout.groups([G("stale", 1, rewards=[0.5, 1.5]), G("flat", 4, rewards=[1.0, 1.0]),
                    G("tagged", 4, rewards=[0.0, 2.0], acc=[0.0, 1.0], vmin=1, vmax=3),
                    G("extra", 5, kw={"tag_versions": False}, vmin=2, vmax=4),
                    G("bare", 5, kw={"tag_versions": False, "extra_versions": False})])
    refills: list[int] = []
    buf = make(lake, refills, filter_groups_metric="acc", mirror_fields="full")
    meta, metrics = buf.sample(global_steps=5, partition_id="train", batch_size=2)
    assert refills == [2] and uids_of(meta.keys) == ["tagged", "extra"]
    assert metrics["training/off_policy/evicted_samples"] == 1
    assert metrics["_dapo_filtered_reward_counts"] == {1.0: 1}
    buf.close()

    traj = read_table(lake, "trajectories").sort_by([("uid", "ascending"),
                                                     ("session_id", "ascending")])
    rows = {(r["uid"], r["session_id"]): r for r in traj.to_pylist()}
    assert rows[("stale", 1)]["reward"] == 1.5                      # float32 sum of rm_scores
    assert dict(rows[("tagged", 1)]["reward_info"]) == {"acc": 1.0}
    assert (rows[("tagged", 0)]["min_global_steps"], rows[("tagged", 0)]["max_global_steps"]) == (1, 3)
    assert (rows[("extra", 0)]["min_global_steps"], rows[("extra", 0)]["max_global_steps"]) == (2, 4)
    assert rows[("bare", 0)]["versions_inferred"] and rows[("bare", 0)]["max_global_steps"] == 4
    assert not rows[("extra", 0)]["versions_inferred"]
    assert rows[("tagged", 0)]["response_ids"] == [100, 101, 102, 103]
    assert rows[("tagged", 0)]["prompt_ids"] == [0, 1, 2]
    assert rows[("tagged", 0)]["rollout_log_probs"] == [-0.5] * 4

    dec = read_table(lake, "decisions")
    evicted = dec.filter(pc.equal(dec["kind"], "evict"))
    assert sorted(zip(evicted["uid"].to_pylist(), evicted["reason"].to_pylist())) == [
        ("flat", "zero_variance"), ("stale", "stale")]
    selected = dec.filter(pc.equal(dec["kind"], "select"))
    assert sorted(selected["uid"].to_pylist()) == ["extra", "tagged"]


def test_decisions_mode_stores_rewards_it_never_read_as_null_not_zero(tq, rollout, tmp_path):
    """`mirror_fields="decisions"` reads no reward: the lake says so (null), where a made-up 0.0
    would read as a run whose every answer failed; a reward read (`rewards` mode) is stored."""
    lake = tmp_path / "lake"
    rollout.groups([G("a", 1, rewards=[0.0, 1.0]), G("b", 1, rewards=[1.0, 2.0])])
    buf = make(lake, [], threshold=None, mirror_fields="decisions")
    buf.sample(global_steps=1, partition_id="train", batch_size=2)
    buf.close()
    traj = read_table(lake, "trajectories")
    assert traj.num_rows == 4 and traj["reward"].null_count == 4
    rollout.groups([G("c", 1, rewards=[0.5, 1.5])])
    again = make(lake, [], threshold=None, mirror_fields="rewards")
    again.get_sampleable_count(1, "train")
    again.close()
    traj = read_table(lake, "trajectories")
    stored = traj.filter(pc.equal(traj["uid"], "c"))["reward"].to_pylist()
    assert sorted(stored) == [0.5, 1.5] and traj["reward"].null_count == 4


@pytest.mark.parametrize("fields", ["decisions", "rewards", "full"])
def test_every_mode_stores_each_response_length_and_only_full_the_tokens(tq, rollout, tmp_path,
                                                                        fields):
    """The response length comes from verl's `response_len` tag (or, for a writer that leaves
    it out, the `responses` field), so a lake written without the token payload still holds
    every length: the lake's lengths, token-weighted staleness and waste figures are the run's."""
    lake = tmp_path / "lake"
    rollout.groups([G("three", 1, kw={"rlen": 3}), G("five", 1, kw={"rlen": 5}),
                    G("untagged", 1, kw={"rlen": 6, "length_tag": False})])
    buf = make(lake, [], threshold=None, mirror_fields=fields)
    buf.sample(global_steps=1, partition_id="train", batch_size=3)
    buf.close()
    traj = read_table(lake, "trajectories").to_pylist()
    assert sorted((r["uid"], r["n_response_tokens"]) for r in traj) == [
        ("five", 5), ("five", 5), ("three", 3), ("three", 3), ("untagged", 6), ("untagged", 6)]
    held = [len(r["response_ids"]) for r in traj]
    assert held == ([r["n_response_tokens"] for r in traj] if fields == "full" else [0] * 6)


def test_a_new_instance_on_the_same_lake_continues_and_releases_cleared_batches(tq, rollout,
                                                                                 tmp_path):
    lake = tmp_path / "lake"
    rollout.groups([G("a", 1), G("b", 2), G("c", 3)])
    refills: list[int] = []
    first = make(lake, refills, threshold=None)
    meta, _ = first.sample(global_steps=3, partition_id="train", batch_size=1)
    assert uids_of(meta.keys) == ["a"]
    first.close()
    rollout.tq.kv_clear(keys=meta.keys, partition_id="train")      # the trainer's end of step
    rollout.groups([G("d", 4)])
    second = make(lake, refills, threshold=None)
    meta, _ = second.sample(global_steps=4, partition_id="train", batch_size=2)
    assert uids_of(meta.keys) == ["b", "c"]
    rollout.tq.kv_clear(keys=meta.keys, partition_id="train")
    assert second.get_sampleable_count(4, "train") == 1             # d; the batch is released
    second.close()
    dec = read_table(lake, "decisions")
    released = dec.filter(pc.equal(dec["kind"], "release"))["uid"].to_pylist()
    assert sorted(released) == ["a", "b", "c"]          # a's batch: released after the restart


def test_prompts_reissued_by_verl_after_a_restart_are_reissued_in_the_core(tq, rollout, tmp_path):
    lake = tmp_path / "lake"
    rollout.groups([G("done", 1)])
    rollout.prompts(["inflight"], 1, "running")
    rollout.trajectories([G("inflight", 1, rewards=[1.0])])          # a partial group
    first = make(lake, [], threshold=None)
    assert first.get_sampleable_count(2, "train") == 1
    first.close()
    # verl resumes at step 5: clears the partial trajectories, re-tags the prompt pending at 5
    rollout.tq.kv_clear(keys=["inflight_0_0"], partition_id="train")
    rollout.tq.kv_put(key="inflight", partition_id="train",
                      tag={"status": "pending", "global_steps": 5})
    second = make(lake, [], threshold=None)
    assert second.get_sampleable_count(5, "train") == 1
    group = second.core.lookup("train", "inflight")
    assert (group.status, group.global_steps, group.keys) == ("pending", 5, frozenset())
    rollout.status(["inflight"], "running")
    rollout.finish(G("inflight", 5, rewards=[0.0, 1.0]))
    meta, _ = second.sample(global_steps=5, partition_id="train", batch_size=2)
    assert sorted(meta.keys) == ["done_0_0", "done_1_0", "inflight_0_0", "inflight_1_0"]
    second.close()


def test_with_reuse_siblings_a_reissued_prompt_keeps_its_completed_sessions(tq, rollout,
                                                                           tmp_path):
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    from tests.adapters.verl._harness import traj_record
    lake = tmp_path / "lake"
    rollout.groups([G("done", 1)])
    rollout.prompts(["inflight"], 1, "running")
    rollout.trajectories([G("inflight", 1, rewards=[1.0])])          # session 0, weights 0
    first = make(lake, [], threshold=None, reuse_siblings=True)
    assert first.get_sampleable_count(2, "train") == 1
    first.close()
    # a reuse-aware rollout side resumes at 5: keeps inflight_0_0, re-tags the prompt pending
    rollout.tq.kv_put(key="inflight", partition_id="train",
                      tag={"status": "pending", "global_steps": 5})
    second = make(lake, [], threshold=None, reuse_siblings=True)
    assert second.get_sampleable_count(5, "train") == 1
    group = second.core.lookup("train", "inflight")
    assert (group.status, group.global_steps, group.keys) == ("pending", 5, frozenset({(0, 0)}))
    assert second.missing_sessions("train") == {"inflight": None}   # registered without n
    rollout.status(["inflight"], "running")
    key, fields, tag = traj_record("inflight", 1, 5, 0.0)            # only the missing session
    rollout.tq.kv_batch_put(keys=[key], partition_id="train",
                            fields=list_of_dict_to_tensordict([fields]), tags=[tag])
    rollout.status(["inflight"], "finished")
    meta, _ = second.sample(global_steps=5, partition_id="train", batch_size=2)
    assert sorted(meta.keys) == ["done_0_0", "done_1_0", "inflight_0_0", "inflight_1_0"]
    rows = second.last_batch.table.filter(pc.equal(second.last_batch.table["uid"], "inflight"))
    assert sorted(zip(rows["session_id"].to_pylist(), rows["max_global_steps"].to_pylist())) == [
        (0, 0), (1, 4)]                                  # the kept sibling's older weights
    second.close()


def test_unusable_prompt_keys_are_rejected_and_nothing_else_is_lost(tq, rollout, tmp_path):
    from pipeline.errors import IngestError
    rollout.groups([G("good", 1)])
    rollout.prompts(["bad_uid"], 1)
    rollout.tq.kv_put(key="nogs", partition_id="train", tag={"is_prompt": True, "status": "pending"})
    buf = make(None, [])
    with pytest.raises(IngestError, match="bad_uid") as err:
        buf.get_sampleable_count(2, "train")
    assert "nogs" in str(err.value) and "global_steps" in str(err.value)
    rollout.tq.kv_clear(keys=["bad_uid", "nogs"], partition_id="train")
    assert buf.get_sampleable_count(2, "train") == 1


def test_fsync_and_max_response_length_reach_the_core_from_sampler_kwargs(tmp_path):

    buf = ReplayBufferAsync(trainer_mode="colocate_async", trainer_config={},
                            max_off_policy_threshold=4, max_off_policy_strategy="drop",
                            sampler_kwargs={"lake_dir": str(tmp_path / "lake"), "fsync": True,
                                            "max_response_length": 7})
    try:
        assert buf.core.lake.fsync is True
        assert dict(buf.core.config.uses("overlong").params) == {"max_response_length": 7}
    finally:
        buf.close()
