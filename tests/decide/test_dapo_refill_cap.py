"""`max_num_gen_batches` in sync DAPO caps only the refills owed to filtered groups: prompts that
replace empty failures (`sync_refill_failed_groups`) are never counted against it, the cap is
never overshot, and its error names the eviction reasons the call actually saw."""
from __future__ import annotations

import pytest

from pipeline import RefillLimitError
from tests.support.policies import Refiller, group, make


def sync_dapo(ref: Refiller, cap: int):
    """Sync DAPO with failure refills, one prompt per dispatch unit, room for many in flight."""
    return make("sync", ref, filter_groups_metric="reward", train_batch_size=1, gen_batch_size=1,
                max_inflight_gen_batches=8, sync_refill_failed_groups=True,
                max_num_gen_batches=cap)


def test_refills_of_failures_do_not_count_against_max_num_gen_batches_in_sync_dapo():
    """Three empty failures (credit 1 each) and one flat group (credit 2): five prompts asked,
    of which only two replace a filtered group, exactly the cap of 2 x train_batch_size 1."""
    ref = Refiller(step=1, finish=lambda i: [0.0, 1.0])
    buf = sync_dapo(ref, cap=2)
    group(buf, "flat", 1, [1.0, 1.0])
    for i in range(3):
        group(buf, f"f{i}", 1, status="failure")
    batch = buf.sample(1, "train", 1, timeout=10)
    assert ref.calls == [5]
    assert batch.uids == ["refill0"]
    assert batch.metrics["training/rollout_failure/evicted_samples"] == 3


def test_sync_dapo_cap_counts_filtered_refills_only_and_names_the_reasons_seen():
    """Every refill comes back flat: after the first dispatch (3 for failures + 2 for the flat
    group) the next one would be 10 filtered refills past a cap of 2, so the call stops there."""
    ref = Refiller(step=1, finish=lambda i: [1.0, 1.0])
    buf = sync_dapo(ref, cap=2)
    group(buf, "flat", 1, [1.0, 1.0])
    for i in range(3):
        group(buf, f"f{i}", 1, status="failure")
    with pytest.raises(RefillLimitError, match="max_num_gen_batches") as info:
        buf.sample(1, "train", 1, timeout=10)
    assert ref.calls == [5]
    assert "3 failure" in str(info.value) and "zero_variance" in str(info.value)
    assert "already asked for 2 prompts to replace filtered groups" in str(info.value)


def test_sync_dapo_without_failures_still_stops_at_the_cap():
    ref = Refiller(step=1, finish=lambda i: [0.0, 0.0])
    buf = sync_dapo(ref, cap=3)
    group(buf, "flat", 1, [1.0, 1.0])
    with pytest.raises(RefillLimitError, match="zero_variance"):
        buf.sample(1, "train", 1, timeout=10)
    assert sum(ref.calls) <= 3
