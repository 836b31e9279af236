"""The opt-in overlong rule: evict finished groups whose mean response length exceeds a limit."""
from __future__ import annotations

import pytest

from pipeline import ConfigError, ReplayBuffer
from tests.support.lake import traj

KEY = "training/overlong/evicted_samples"


def _group(buf, uid, lengths, gs=1):
    buf.register(partition="train", uids=[uid], global_steps=gs)
    buf.put([traj(uid, s, reward=float(s), response=[7] * n) for s, n in enumerate(lengths)])
    buf.update_status(partition="train", uids=[uid], status="finished")


def test_a_group_whose_mean_length_exceeds_the_limit_is_evicted_and_refilled():
    asked = []
    buf = ReplayBuffer.async_(max_response_length=4, refill_fn=asked.append, poll_interval=0.05)
    _group(buf, "long", [4, 5])      # mean 4.5 > 4
    _group(buf, "exact", [3, 5])     # mean 4: kept
    _group(buf, "short", [1, 2])
    batch = buf.sample(1, "train", 2, timeout=5)
    assert batch.uids == ["exact", "short"]
    assert batch.metrics[KEY] == 1
    assert asked == [1]


def test_the_rule_is_off_by_default_and_in_validation():
    buf = ReplayBuffer.async_(poll_interval=0.05)
    _group(buf, "long", [50, 60])
    assert buf.sample(1, "train", 1, timeout=5).uids == ["long"]
    val = ReplayBuffer.async_(max_response_length=1, poll_interval=0.05)
    val.register(partition="val", uids=["v"], global_steps=1)
    val.put([traj("v", 0, partition="val", response=[1, 2, 3])])
    val.update_status(partition="val", uids=["v"], status="finished")
    assert val.sample(1, "val", 1, timeout=5).uids == ["v"]


def test_sync_dapo_counts_an_overlong_group_like_a_filtered_one():
    asked = []

    def refill(n):
        asked.append(n)
        for i in range(n):
            _group(buf, f"r{len(asked)}_{i}", [1, 2])

    buf = ReplayBuffer.sync(filter_groups_metric="reward", refill_fn=refill, train_batch_size=1,
                            gen_batch_size=1, max_response_length=3, poll_interval=0.05)
    _group(buf, "long", [9, 9])
    batch = buf.sample(1, "train", 1, timeout=5)
    assert asked == [1] and batch.metrics[KEY] == 1   # credit 2, one free in-flight slot


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_max_response_length_must_be_a_positive_int(bad):
    with pytest.raises(ConfigError, match="max_response_length"):
        ReplayBuffer.async_(max_response_length=bad)
