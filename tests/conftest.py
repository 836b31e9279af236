"""Fixtures of the test suite: a lake directory, a buffer over it, the session's one Ray cluster,
and the hypothesis profiles. Helper functions live in the `tests.support` package.

Under `make test` the suite runs on two pytest-xdist workers (`--dist loadgroup`), in groups
(tests/support/xdist_groups.py): each test file is one group, so a module's expensive fixture (a
demo lake, a crash matrix's runs) is built once; the Ray and verl tests are one group together,
so the session's one Ray cluster (and verl's one TransferQueue) is started by one worker only.

Hypothesis profiles: ``ci`` (default; modest example counts, no deadline, so the suite stays fast
on 2 cores), ``dev`` (fewer) and ``thorough`` (many); pick one with HYPOTHESIS_PROFILE=<name>.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from pipeline import ReplayBuffer
from tests.support.extras import need
from tests.support.ray_cluster import LocalCluster, NodeSpec, auth_env

auth_env()            # before anything imports ray: Ray reads its auth settings once

# in CI, a skip for anything but a GPU or a vLLM install fails the run (tests/support/ci_skips.py)
# ... and the suite is scheduled on xdist workers in whole groups (tests/support/xdist_groups.py)
pytest_plugins = ["tests.support.ci_skips", "tests.support.xdist_groups"]

settings.register_profile("ci", deadline=None, max_examples=25, stateful_step_count=30,
                          suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.register_profile("dev", deadline=None, max_examples=10, stateful_step_count=20)
settings.register_profile("thorough", deadline=None, max_examples=500, stateful_step_count=60,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    """A fresh lake directory (created by the buffer on first use)."""
    return tmp_path / "lake"


@pytest.fixture
def buf(lake: Path):
    """A sync-preset buffer over ``lake`` with a test-speed poll interval; closed afterwards."""
    b = ReplayBuffer.sync(lake=lake, poll_interval=0.05)
    yield b
    b.close()


# The session's Ray cluster: a head holding the lake and one rollout node, each a raylet of its
# own on a loopback address. CPUs: the head's 2 serve the driver's tasks and TransferQueue's
# actors (each asks for one), the rollout node's 4 the producers; on 2-core machines more
# CPUs than cores is what keeps actors that each ask for one from waiting forever.
LAKE_NODE = NodeSpec("127.0.0.2", num_cpus=2, resources={"lake": 1})
ROLLOUT_NODE = NodeSpec("127.0.0.3", num_cpus=4, resources={"rollout": 4})


@pytest.fixture(scope="session")
def ray_local_cluster():
    """The session's multi-node Ray cluster (`tests.support.ray_cluster.LocalCluster`), started
    with `ray start` and joined by the test process as its driver; stopped at the session's end,
    and a test session that leaves any of its processes running fails."""
    ray = need("ray", "ray (or verl)")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    cluster = LocalCluster(LAKE_NODE, [ROLLOUT_NODE])
    try:
        cluster.start()
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes(ray)
        cluster.start_s = time.monotonic() - cluster.started_at
        yield cluster
    finally:
        _kill_named_actors(ray)
        ray.shutdown()
        cluster.stop()
        left = cluster.survivors()
        cluster.cleanup()
        print(f"\nray cluster: {1 + len(cluster.others)} nodes, up in {cluster.start_s:.1f}s, "
              f"stopped in {cluster.stop_s:.1f}s")
    assert not left, f"processes of the session's Ray cluster outlived it: pids {left}"


def _kill_named_actors(ray) -> None:
    """Kill the detached actors the session left (Ray Data's statistics and autoscaling
    coordinators, started by the tests that read a lake with Ray Data): a head node's raylet
    waits ~30 s for them at shutdown."""
    if not ray.is_initialized():
        return
    for actor in ray.util.list_named_actors(all_namespaces=True):
        try:
            ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]))
        except ValueError:            # gone meanwhile
            pass


@pytest.fixture(scope="session")
def ray_cluster(ray_local_cluster):
    """The `ray` module, connected to the session's one Ray cluster (the verl tests'
    TransferQueue runs on it too)."""
    import ray
    yield ray
