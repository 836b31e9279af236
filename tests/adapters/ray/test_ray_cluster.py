"""The session's Ray cluster has more than one node, and each piece runs where it is put: the
buffer actor on the node holding the lake, the rollout workers on the rollout node in processes
of their own, the trainer in the driver."""
from __future__ import annotations

import os
import uuid

import pytest

from pipeline.adapters.ray.client import RayReplayBuffer
from pipeline.errors import ConfigError
from tests.support.ray_producers import RolloutWorker


def _node_with(ray, resource: str) -> str:
    [node] = [n["NodeID"] for n in ray.nodes() if n["Alive"] and resource in n["Resources"]]
    return node


def test_the_cluster_has_a_lake_node_and_a_rollout_node_each_with_its_own_raylet(
        ray_local_cluster, ray_cluster):
    alive = [n for n in ray_cluster.nodes() if n["Alive"]]
    assert len(alive) == 2
    assert sorted(n["NodeManagerAddress"] for n in alive) == ["127.0.0.2", "127.0.0.3"]
    assert len({n["RayletSocketName"] for n in alive}) == 2
    assert _node_with(ray_cluster, "lake") != _node_with(ray_cluster, "rollout")
    assert ray_local_cluster.survivors()          # its processes are found by its temp dir


def test_the_buffer_runs_on_the_lake_node_and_the_producers_on_the_rollout_node(tmp_path,
                                                                                 ray_cluster):
    ray = ray_cluster
    lake_node, rollout_node = _node_with(ray, "lake"), _node_with(ray, "rollout")
    client = RayReplayBuffer.start(lake=tmp_path / "lake", name=f"place-{uuid.uuid4().hex[:8]}",
                                   place_on="lake", poll_interval=0.05)
    try:
        worker = ray.remote(num_cpus=0, resources={"rollout": 1})(RolloutWorker)
        workers = [worker.remote() for _ in range(2)]
        places = ray.get([w.where.remote() for w in workers])
        runs = [w.run.remote(client, [f"w{k}-{i}" for i in range(2)], 0.0)
                for k, w in enumerate(workers)]
        batch = client.sample(1, "train", 4, timeout=120)       # the trainer: this driver
        client.release(batch)
        info = client.info()
        assert info["node_id"] == lake_node == ray.get_runtime_context().get_node_id()
        assert [node for node, _ in places] == [rollout_node, rollout_node]
        pids = {pid for _, pid in places}
        assert len(pids) == 2 and not pids & {os.getpid(), info["pid"]}
        assert sorted(batch.uids) == sorted(u for uids, _ in ray.get(runs) for u in uids)
    finally:
        client.kill()


def test_place_on_must_name_a_resource(tmp_path, ray_cluster):
    with pytest.raises(ConfigError, match="place_on"):
        RayReplayBuffer.start(lake=None, name=f"p-{uuid.uuid4().hex[:8]}", place_on="")
