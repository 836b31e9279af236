"""wait_for_sampleable reports what its evictions filtered, and sample then takes those groups."""
from __future__ import annotations

import pytest

from pipeline import SampleTimeout
from tests.support.policies import Refiller, group, make


def test_wait_for_sampleable_reports_the_filtered_reward_counts_of_its_evictions():
    ref = Refiller(step=1)
    buf = make("async", ref, filter_groups_metric="reward")
    group(buf, "z0", 1, [0.0, 0.0])
    group(buf, "z1", 1, [1.0, 1.0])
    group(buf, "mixed", 1, [0.0, 1.0])
    uids, metrics = buf.wait_for_sampleable(1, "train", 1, timeout=5)
    assert uids == ["mixed"]
    assert metrics["training/filter_groups/evicted_samples"] == 2
    assert metrics.reward_counts == {0.0: 1, 1.0: 1}
    assert buf.sampleable_uids("train") == ["mixed", "refill0", "refill1"]
    assert buf.sample(1, "train", 1, timeout=5).uids == ["mixed"]


def test_wait_for_sampleable_on_validation_reports_nothing():
    buf = make("async", Refiller(step=1, partition="val"), filter_groups_metric="reward")
    group(buf, "flat", 1, [1.0, 1.0], partition="val")
    uids, metrics = buf.wait_for_sampleable(1, "val", 1, timeout=5)
    assert uids == ["flat"] and metrics == {} and metrics.reward_counts == {}


def test_a_wait_for_sampleable_that_times_out_names_itself():
    buf = make("async")
    group(buf, "one", 1, [0.0, 1.0])
    with pytest.raises(SampleTimeout) as error:
        buf.wait_for_sampleable(1, "train", 2, timeout=0.2)
    assert str(error.value).startswith(
        "wait_for_sampleable(global_steps=1, partition='train', target_count=2) timed out")
