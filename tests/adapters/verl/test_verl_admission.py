"""`dispatch_capacity` on the verl adapter's async class (an addition: verl has none), over
TransferQueue: it mirrors what the rollout side wrote, and with `max_off_policy_strategy=
"admit"` the buffer's refills keep to it."""
from __future__ import annotations

import pytest

from pipeline.adapters.verl.dropin import ReplayBufferAsync
from tests.adapters.verl._harness import G, uids_of

pytestmark = pytest.mark.verl


def make(**kw):
    return ReplayBufferAsync("colocate_async", {}, 2, "drop", {}, poll_interval=0.05,
                             refill_fn=lambda n: n, train_batch_size=2, **kw)


def test_the_capacity_counts_what_transferqueue_holds(tq, rollout):
    buf = make()
    assert buf.dispatch_capacity(3, "train") == 4
    rollout.groups([G("a", 3), G("b", 3)])
    rollout.prompts(["c"], 3, "running")
    assert buf.dispatch_capacity(3, "train") == 1
    meta, _ = buf.sample(global_steps=3, partition_id="train", batch_size=2)
    assert uids_of(meta.keys) == ["a", "b"]
    assert buf.dispatch_capacity(3, "train") == 1           # step 3's batch took 2 places
    assert buf.dispatch_capacity(4, "train") == 3
    assert buf.dispatch_capacity(4, "train", batch_size=3) == 5
    buf.close()


def test_admit_paces_the_refills_verl_would_ask_at_once(tq, rollout):
    """Two stale groups evicted, three fresh ones sampleable: 4 - 3 = 1 place, one refill
    (the rollout side writes the prompts it was asked for before refill_fn returns, as the
    buffer's refill contract says)."""
    refills: list[int] = []
    rollout.groups([G("old0", 1), G("old1", 1), G("a", 3), G("b", 3), G("c", 3)])

    def refill(n):
        rollout.prompts([f"new{len(refills) + i}" for i in range(n)], 3)
        refills.append(n)
    buf = ReplayBufferAsync("colocate_async", {}, 2, "admit", {}, poll_interval=0.05,
                            refill_fn=refill, train_batch_size=2)
    meta, metrics = buf.sample(global_steps=3, partition_id="train", batch_size=2)
    assert uids_of(meta.keys) == ["a", "b"]
    assert metrics["training/off_policy/evicted_samples"] == 2
    assert refills == [1]
    buf.close()


@pytest.mark.parametrize("cls", ["ReplaylakeSampler", "ReplayBufferAsync"])
def test_mask_is_refused_by_the_adapter_naming_what_to_use_instead(cls):
    """verl's trainer never reads `loss_mask`: a masked group would train with its loss on."""
    from pipeline.adapters.verl import dropin
    mode = "colocate_async"
    with pytest.raises(AssertionError, match="'mask' is not a verl value.*loss_mask"):
        getattr(dropin, cls)(mode, {}, 2, "mask", {}, poll_interval=0.05)
    with pytest.raises(ValueError, match="use 'drop', 'wait' or 'admit'"):
        getattr(dropin, cls)(mode, {}, 2, "mask", {}, poll_interval=0.05)
