"""Producer code that Ray workers run in the Ray tests and the Ray benchmark.

It lives in an importable module (``tests.support.ray_producers``): Ray pickles module-level functions by
reference, and pytest imports test files under names (``test_ray``) a worker cannot import.
"""
from __future__ import annotations

from typing import Any

from tests.support.lake import traj

GROUP = 4   # sessions per group


def group_rows(uid: str, gs: int, sessions: int = GROUP) -> list[dict[str, Any]]:
    """One group's trajectories: versions ``gs - 1``, rewards alternating 0 / 1."""
    v = max(gs - 1, 0)
    return [traj(uid, s, min_gs=v, max_gs=v, reward=float(s % 2)) for s in range(sessions)]


def produce(client: Any, producer: int, groups: int, gs: int) -> list[str]:
    """What one rollout worker does: register, put every session, finish, for each group."""
    uids = []
    for k in range(groups):
        uid = f"p{producer}-{k}"
        client.register(partition="train", uids=[uid], global_steps=gs, n=GROUP)
        client.update_status(partition="train", uids=[uid], status="running")
        for row in group_rows(uid, gs):
            client.put([row])                     # sessions stream in one at a time
        client.update_status(partition="train", uids=[uid], status="finished")
        uids.append(uid)
    return uids
