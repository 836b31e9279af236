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


def big_group(uid: str, tokens: int, gs: int = 1) -> Any:
    """One group's trajectories as an Arrow table with ``tokens`` response tokens per session:
    a put large enough that a kill lands inside it."""
    import numpy as np
    import pyarrow as pa

    from schemas import TRAJECTORIES_INPUT
    offsets = pa.array(np.arange(GROUP + 1, dtype=np.int32) * tokens)
    responses = pa.ListArray.from_arrays(offsets, pa.array(np.zeros(GROUP * tokens, np.int32)))
    rows = {"partition": ["train"] * GROUP, "uid": [uid] * GROUP, "session_id": list(range(GROUP)),
            "index": [0] * GROUP, "min_global_steps": [gs - 1] * GROUP,
            "max_global_steps": [gs - 1] * GROUP, "reward": [float(s % 2) for s in range(GROUP)],
            "prompt_ids": [[1, 2]] * GROUP, "response_ids": responses,
            "is_padding": [False] * GROUP, "versions_inferred": [False] * GROUP}
    return pa.table({f.name: rows[f.name] if f.name in rows else pa.nulls(GROUP, f.type)
                     for f in TRAJECTORIES_INPUT}, schema=TRAJECTORIES_INPUT)


class LoggedProducer:
    """A rollout worker (the body of a Ray actor) that logs `start uid` before each put and
    `done uid` once the buffer acknowledged it, so a test that kills its process knows which put
    was in flight."""

    def pid(self) -> int:
        import os
        return os.getpid()

    def put_groups(self, client: Any, uids: list[str], tokens: int, log: str) -> None:
        for uid in uids:
            table = big_group(uid, tokens)
            with open(log, "a") as f:
                f.write(f"start {uid}\n")
            client.put(table)
            with open(log, "a") as f:
                f.write(f"done {uid}\n")


class RolloutWorker:
    """A rollout worker in its own process (the body of a Ray actor): registers, runs, puts one
    session at a time and finishes each of its groups; reports where it runs and how many of its
    calls its client had to send again."""

    def where(self) -> tuple[str, int]:
        import os

        import ray
        return ray.get_runtime_context().get_node_id(), os.getpid()

    def run(self, client: Any, uids: list[str], pause: float) -> tuple[list[str], int]:
        import time
        for uid in uids:
            client.register(partition="train", uids=[uid], global_steps=1, n=GROUP)
            client.update_status(partition="train", uids=[uid], status="running")
            for row in group_rows(uid, 1):
                client.put([row])
                time.sleep(pause)
            client.update_status(partition="train", uids=[uid], status="finished")
        return uids, client.retries
