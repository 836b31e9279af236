"""A rollout worker's process killed (SIGKILL) in the middle of a `put` to the buffer's Ray actor:
the actor stays up, every put is whole or absent (a retry of the whole put is then accepted once
or found stored identically, all its rows: a no-op, never half), and the trainer's `sample`, waiting in
the actor all along, goes on once the groups are complete, each group exactly once."""
from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from pipeline.adapters.ray.client import RayReplayBuffer
from pipeline.lake.writer import read_table
from tests.support.ray_producers import GROUP, LoggedProducer, big_group

pytestmark = pytest.mark.usefixtures("ray_cluster")

TOKENS = 100_000                  # per session: a 1.6 MB put
DELAYS = (0.0, 0.002, 0.005, 0.01, 0.02)   # after a put starts, when the kill comes
PER_KILL = 4                      # groups each killed producer was to put


def _lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def _kill_mid_put(ray, client, uids: list[str], log: Path, delay: float) -> None:
    """Start a producer of ``uids``, SIGKILL its process ``delay`` s into its second put."""
    producer = ray.remote(num_cpus=0, max_restarts=0)(LoggedProducer).remote()
    pid = ray.get(producer.pid.remote())
    running = producer.put_groups.remote(client, uids, TOKENS, str(log))
    end = time.monotonic() + 60
    while sum(line.startswith("start") for line in _lines(log)) < 2:
        assert time.monotonic() < end, "the producer never started its second put"
        time.sleep(0.001)
    time.sleep(delay)
    os.kill(pid, signal.SIGKILL)
    try:
        ray.get(running, timeout=60)
    except ray.exceptions.RayActorError:
        return                          # the kill landed while the producer was putting
    # on a loaded machine the producer may finish its puts before the kill lands: then every
    # one of them was acknowledged (the test needs some kill inside a put, over all delays)
    done = {line.split()[1] for line in _lines(log) if line.startswith("done")}
    assert done == set(uids), f"the producer returned without putting {sorted(set(uids) - done)}"


def _retry(client, uid: str) -> str:
    """Send the whole put again: `absent` (now accepted) or `whole` (every row already stored
    identically: the retry is a no-op)."""
    got = client.put(big_group(uid, TOKENS))
    assert sorted((got, got.already_stored)) == [0, GROUP], f"{uid}: half a put landed: {got!r}"
    return "absent" if got == GROUP else "whole"


def test_a_producer_killed_mid_put_leaves_each_put_whole_or_absent(tmp_path, ray_cluster):
    ray = ray_cluster
    client = RayReplayBuffer.start(lake=tmp_path / "lake", preset="async",
                                   name=f"chaos-{uuid.uuid4().hex[:8]}", poll_interval=0.05)
    try:
        uids = [f"k{k}-{i}" for k in range(len(DELAYS)) for i in range(PER_KILL)]
        client.register(partition="train", uids=uids, global_steps=1, n=GROUP)
        client.update_status(partition="train", uids=uids, status="running")
        trainer = ray.remote(num_cpus=0)(
            lambda c: c.sample(1, "train", len(uids), timeout=300)).remote(client)
        acked, in_flight = set(), []
        for k, delay in enumerate(DELAYS):
            log = tmp_path / f"producer-{k}.log"
            _kill_mid_put(ray, client, uids[k * PER_KILL:(k + 1) * PER_KILL], log, delay)
            lines = _lines(log)
            acked |= {line.split()[1] for line in lines if line.startswith("done")}
            if lines[-1].startswith("start"):
                in_flight.append(lines[-1].split()[1])
            assert client.counts("train")["running"] == len(uids)     # the actor is up
        assert in_flight, "no kill landed inside a put"
        time.sleep(1.0)   # a put the dead producer had handed over finishes (or never runs)
        verdicts = {u: _retry(client, u) for u in uids}
        assert all(verdicts[u] == "whole" for u in acked)       # acknowledged: stored once
        client.update_status(partition="train", uids=uids, status="finished")
        batch = ray.get(trainer, timeout=120)
        assert sorted(batch.uids) == sorted(uids)
        assert batch.table.num_rows == len(uids) * GROUP
        keys = list(zip(batch.table.column("uid").to_pylist(),
                        batch.table.column("session_id").to_pylist()))
        assert len(set(keys)) == len(keys)
        client.release(batch)
        client.close()
        traj = read_table(tmp_path / "lake", "trajectories")
        stored = list(zip(traj.column("uid").to_pylist(), traj.column("session_id").to_pylist()))
        assert sorted(stored) == sorted((u, s) for u in uids for s in range(GROUP))
        print(f"in flight at the kill: {[(u, verdicts[u]) for u in in_flight]}; "
              f"acknowledged before it: {len(acked)}")
    finally:
        ray.kill(client.handle)
