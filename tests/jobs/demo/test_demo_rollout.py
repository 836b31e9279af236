"""The demo's rollout side in pieces: the weights a worker reads (also when they are sent to
another process), one `Worker`'s generation, and `Rollout` feeding workers it does not run
itself (what `demo --ray` does with its actors), over a real buffer."""
from __future__ import annotations

import time

import pytest
import torch

from jobs.demo.policy import Policy
from jobs.demo.rollout import Rollout, RolloutStats, WeightStore, Worker
from pipeline import ReplayBuffer


def test_every_published_version_reaches_the_listeners_and_a_copy_keeps_only_newer_ones():
    torch.manual_seed(0)
    policy = Policy()
    store = WeightStore(policy)
    seen = []
    store.publish_to(lambda version, state: seen.append((version, state["head.bias"].clone())))
    with torch.no_grad():
        policy.head.bias.add_(1.0)
    store.publish(policy, 1)
    store.publish(policy, 2)
    assert [v for v, _ in seen] == [1, 2]
    assert torch.equal(seen[0][1], policy.head.bias)

    copy = WeightStore(version=1, state=store.latest()[1])
    copy.receive(3, {"v": torch.tensor(3)})
    copy.receive(2, {"v": torch.tensor(2)})            # arrived late: older than what it holds
    copy.receive(3, {"v": torch.tensor(-3)})           # the same version again: kept as it was
    assert copy.version == 3 and int(copy.latest()[1]["v"]) == 3
    with pytest.raises(ValueError, match="a policy or a state"):
        WeightStore()


def test_a_worker_tags_each_answer_with_the_version_it_holds_and_finishes_its_groups():
    torch.manual_seed(0)
    weights = WeightStore(version=5, state=Policy().state_dict())
    buf = ReplayBuffer.async_(poll_interval=0.05)
    buf.register(partition="train", uids=["a", "b"], global_steps=6, n=4)
    worker = Worker(buf, weights, seed=1, waves=2)
    stats = worker.generate([("a", [1, 2], [0, 1, 2, 3]), ("b", [7], [0, 1, 2, 3])])
    assert stats.trajectories == 8 and stats.failed_sessions == 0
    assert buf.counts("train")["finished"] == 2
    batch = buf.sample(6, "train", 2, timeout=5)
    table = batch.table
    assert set(table.column("min_global_steps").to_pylist()) == {5}
    assert set(table.column("max_global_steps").to_pylist()) == {5}
    assert sorted(len(r) for r in table.column("response_ids").to_pylist()) == [1] * 4 + [2] * 4


def test_rollout_feeds_workers_it_does_not_run_and_adds_up_what_they_report():
    torch.manual_seed(0)
    weights = WeightStore(Policy())
    buf = ReplayBuffer.async_(poll_interval=0.05)
    rollout = Rollout(buf, weights, n=2, workers=2, failure_rate=0.0, seed=3)
    calls: list[int] = []

    def work_of(seed: int):
        worker = Worker(buf, weights, seed=seed, **rollout.worker_settings())

        def work(items):
            calls.append(seed)
            return worker.generate(items)
        return work

    rollout.start([work_of(s) for s in rollout.worker_seeds()])
    try:
        rollout.dispatch(6)
        deadline = time.monotonic() + 30
        while buf.counts("train")["finished"] < 6 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        rollout.stop()
    rollout.check()
    assert buf.counts("train")["finished"] == 6
    assert set(calls) <= set(rollout.worker_seeds()) and calls
    produced = rollout.drain_stats()
    assert produced.trajectories == 12
    assert rollout.drain_stats() == RolloutStats()     # drained once
