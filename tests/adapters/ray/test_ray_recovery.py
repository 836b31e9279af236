"""The buffer actor's process killed (SIGKILL) while rollout workers on the other node put, or the
raylet of the node it runs on: Ray restarts the actor (on a node holding the lake's resource), the
new process takes the lake's lock over from the dead one and restores the buffer, the clients send
again the calls that were in flight, and the run goes on; every group is trained once and the lake
passes every exactly-once audit."""
from __future__ import annotations

import os
import signal
import threading
import time
import uuid

import psutil
import pytest

from jobs.audit import run_audits
from pipeline import ReplayBuffer
from pipeline.adapters.ray.client import RayReplayBuffer
from pipeline.errors import BufferUnavailableError, LakeError, UnknownBatchError
from pipeline.lake.writer import read_table
from tests.support.ray_cluster import NodeSpec
from tests.support.ray_producers import GROUP, RolloutWorker, group_rows

pytestmark = pytest.mark.usefixtures("ray_cluster")

WORKERS, GROUPS, BATCH = 3, 8, 4        # 24 groups of 4 sessions, trained 4 groups at a time
KILLS = (1, 3)                          # after how many trained batches each kill comes


def _workers(ray, n: int) -> list:
    return [ray.remote(num_cpus=0, resources={"rollout": 1}, max_restarts=0)(RolloutWorker)
            .remote() for _ in range(n)]


def _killer(client: RayReplayBuffer, trained: list, done: threading.Event,
            killed: list[int]) -> None:
    """SIGKILL the actor's process each time the trainer has trained KILLS[i] batches (the
    actor runs on this host: its pid is a local process)."""
    for after in KILLS:
        while len(trained) < after * BATCH and not done.is_set():
            time.sleep(0.01)
        if done.is_set():
            return
        pid = client.info()["pid"]
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)


def test_a_killed_buffer_actor_comes_back_and_the_run_loses_and_duplicates_nothing(
        tmp_path, ray_cluster):
    ray = ray_cluster
    lake = tmp_path / "lake"
    client = RayReplayBuffer.start(lake=lake, name=f"recover-{uuid.uuid4().hex[:8]}",
                                   place_on="lake", poll_interval=0.05, retry_wait=120)
    try:
        first = client.info()
        uids = [[f"w{k}-{i}" for i in range(GROUPS)] for k in range(WORKERS)]
        runs = [w.run.remote(client, mine, 0.01) for w, mine in zip(_workers(ray, WORKERS), uids)]
        trained: list[str] = []
        done, killed = threading.Event(), []
        killer = threading.Thread(target=_killer, args=(client, trained, done, killed))
        killer.start()
        try:
            while len(trained) < WORKERS * GROUPS:               # the trainer
                batch = client.sample(1, "train", BATCH, timeout=120)
                assert batch.table.num_rows == BATCH * GROUP
                trained.extend(batch.uids)
                client.release(batch)
        finally:
            done.set()
            killer.join()
        results = ray.get(runs, timeout=120)
        assert len(killed) == len(KILLS), "a kill did not land during the run"
        after = client.info()
        assert after["restarted"] and after["pid"] not in {first["pid"], *killed}
        assert after["node_id"] == first["node_id"]                # restarted on the lake node
        assert f"pid {killed[-1]} " in after["took_over_from"]      # the dead holder's lock
        retried = client.retries + sum(r for _, r in results)
        assert retried > 0, "no call was in flight at a kill"
        assert sorted(trained) == sorted(u for mine in uids for u in mine)
        client.close()
        _exactly_once(lake, [u for mine in uids for u in mine])
        print(f"killed {killed}; calls sent again: {retried}")
    finally:
        ray.kill(client.handle)


def _exactly_once(lake, uids: list[str]) -> None:
    audits = {a.name: a for a in run_audits(lake)}
    assert not [a.name for a in audits.values() if a.status == "FAIL"], audits
    assert {"no_trajectory_twice", "no_group_in_two_batches",
            "finished_groups_complete"} <= {n for n, a in audits.items() if a.status == "pass"}
    stored = read_table(lake, "trajectories")
    keys = list(zip(stored["uid"].to_pylist(), stored["session_id"].to_pylist()))
    assert sorted(keys) == sorted((u, s) for u in uids for s in range(GROUP))


def _finished(client: RayReplayBuffer, uid: str) -> None:
    client.register(partition="train", uids=[uid], global_steps=1, n=GROUP)
    client.put(group_rows(uid, 1))
    client.update_status(partition="train", uids=[uid], status="running")
    client.update_status(partition="train", uids=[uid], status="finished")


def test_a_node_whose_raylet_dies_takes_the_actor_down_and_it_comes_back_on_another_lake_node(
        tmp_path, ray_local_cluster, ray_cluster):
    """A third node also carrying the ``lake`` resource (the lake is on a path both see), the
    actor placed there (soft node affinity); its raylet SIGKILLed between calls: the node is
    lost with the actor's process, Ray restarts the actor on the session's lake node, which
    takes the lake over, and the calls sent meanwhile wait and go through."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray = ray_cluster
    spare = NodeSpec("127.0.0.4", num_cpus=1, resources={"lake": 1})
    head = [n["NodeID"] for n in ray.nodes() if n["Alive"] and "lake" in n["Resources"]]
    spare_id = ray_local_cluster.add(ray, spare)
    lake, client, killed = tmp_path / "lake", None, None
    try:
        client = RayReplayBuffer.start(
            lake=lake, name=f"raylet-{uuid.uuid4().hex[:8]}", place_on="lake",
            poll_interval=0.05, retry_wait=120,
            actor_options={"scheduling_strategy": NodeAffinitySchedulingStrategy(spare_id,
                                                                                 soft=True)})
        first = client.info()
        assert first["node_id"] == spare_id
        uids = [f"g{i}" for i in range(6)]
        for uid in uids[:3]:
            _finished(client, uid)
        batch = client.sample(1, "train", 2, timeout=30)
        client.release(batch)
        trained = list(batch.uids)
        killed = ray_local_cluster.kill_raylet(spare)
        t0 = time.monotonic()
        # the actor's process outlives its raylet for a moment (calls to an actor go straight to
        # its process), then sees the raylet gone and exits
        while psutil.pid_exists(first["pid"]) and time.monotonic() - t0 < 60:
            time.sleep(0.05)
        assert not psutil.pid_exists(first["pid"]), "the actor's process outlived its raylet"
        died = time.monotonic() - t0
        for uid in uids[3:]:                 # sent while the actor is down: they wait, retry
            _finished(client, uid)
        gap = time.monotonic() - t0
        while len(trained) < len(uids):
            batch = client.sample(1, "train", 2, timeout=60)
            trained.extend(batch.uids)
            client.release(batch)
        after = client.info()
        assert after["restarted"] and after["node_id"] in head and after["pid"] != first["pid"]
        assert f"pid {first['pid']} " in after["took_over_from"]   # the dead holder's lock
        assert not any(n["Alive"] for n in ray.nodes() if n["NodeID"] == spare_id)
        assert sorted(trained) == sorted(uids)
        client.close()
        _exactly_once(lake, uids)
        print(f"raylet {killed} killed; the actor's process gone after {died:.1f}s, the calls "
              f"after it through at {gap:.1f}s; calls sent again: {client.retries}")
    finally:
        if client is not None:
            ray.kill(client.handle)
        if killed is None:                   # never leave a second lake node alive
            ray_local_cluster.kill_raylet(spare)


def test_a_sample_whose_reply_died_with_the_actor_gets_its_batch_when_sent_again(tmp_path,
                                                                             ray_cluster):
    """The actor's process SIGKILLs itself right after the sample's selection and metric rows
    are in the lake, before its reply leaves (a lake kill point, set in the actor's
    environment): the client sends the call again under the same key, and the restarted actor
    answers with that batch, instead of choosing another while the first stays held."""
    lake = tmp_path / "lake"
    client = RayReplayBuffer.start(
        lake=lake, name=f"reply-{uuid.uuid4().hex[:8]}", place_on="lake", poll_interval=0.05,
        retry_wait=120,
        actor_options={"runtime_env": {"env_vars": {"REPLAYLAKE_KILL_AT": "metrics.acked:1"}}})
    try:
        for uid in ("a", "b", "c"):
            _finished(client, uid)
        first = client.info()
        batch = client.sample(1, "train", 2, timeout=60)
        after = client.info()
        assert after["restarted"] and after["pid"] != first["pid"] and client.retries > 0
        assert batch.uids == ["a", "b"] and batch.off_policy_metrics
        assert client.held_batches("train") == {batch.batch_id: [
            (u, s, 0) for u in ("a", "b") for s in range(GROUP)]}
        assert client.counts("train") == {"pending": 0, "running": 0, "finished": 1,
                                          "failure": 0, "sampled": 2}
        client.release(batch)
        client.close()
        assert not [a.name for a in run_audits(lake) if a.status == "FAIL"]
    finally:
        ray_cluster.kill(client.handle)


def test_an_actor_dead_for_good_fails_every_call_at_once_and_kill_then_does_nothing(
        tmp_path, ray_cluster):
    """No restart left (killed with max_restarts=0, or ended by `kill`): a call fails at once,
    saying so, instead of waiting out its retry_wait; a second `kill` does nothing."""
    client = RayReplayBuffer.start(lake=tmp_path / "lake", name=f"dead-{uuid.uuid4().hex[:8]}",
                                   place_on="lake", max_restarts=0, retry_wait=60)
    ended = RayReplayBuffer.start(lake=None, name=f"ended-{uuid.uuid4().hex[:8]}", retry_wait=60)
    other = RayReplayBuffer.connect(ended.name, retry_wait=60)    # another client of it
    try:
        client.register(partition="train", uids=["g"], global_steps=1, n=GROUP)
        os.kill(client.info()["pid"], signal.SIGKILL)
        ended.kill()
        t0 = time.monotonic()
        with pytest.raises(BufferUnavailableError, match="is dead and Ray will not restart it"):
            client.counts("train")
        with pytest.raises(BufferUnavailableError, match="is dead and Ray will not restart it"):
            other.partitions()
        with pytest.raises(BufferUnavailableError, match=r"was ended by kill\(\), so counts"):
            ended.counts("train")
        assert time.monotonic() - t0 < 20 and client.retries + other.retries < 5
        ended.kill()
        client.kill()                        # nothing to close: only the actor to end
    finally:
        ray_cluster.kill(client.handle)


def test_a_restart_that_finds_its_lake_locked_says_why_and_opens_it_once_free(tmp_path,
                                                                              ray_cluster):
    """Another process opens the lake between the actor's death and its restart: calls wait
    for their retry_wait, then fail naming the lock's holder; once the lake is free, the actor
    opens it on the next call and goes on."""
    lake = tmp_path / "lake"
    client = RayReplayBuffer.start(lake=lake, name=f"locked-{uuid.uuid4().hex[:8]}",
                                   place_on="lake", poll_interval=0.05, retry_wait=60)
    brief = RayReplayBuffer(client.handle, client.name, retry_wait=1.5)
    try:
        _finished(client, "a")
        dead = client.info()["pid"]
        os.kill(dead, signal.SIGSTOP)                      # it holds the lock until it is gone
        os.kill(dead, signal.SIGKILL)
        holder = _open_first(lake)
        assert f"pid {os.getpid()} " in client.info()["reopen_error"]   # restarted, no lake
        with pytest.raises(BufferUnavailableError, match=(
                r"did not serve counts\(\) within retry_wait=1.5s: it was restarted but cannot "
                rf"open its lake \(LakeError: the lake .* is already open for writing by pid "
                rf"{os.getpid()} ")):
            brief.counts("train")
        holder.close()
        assert brief.counts("train")["finished"] == 1
        after = client.info()
        assert after["restarted"] and after["reopen_error"] is None and after["pid"] != dead
    finally:
        ray_cluster.kill(client.handle)


def _open_first(lake) -> ReplayBuffer:
    """The lake opened in this process as soon as the dead actor's lock is gone (before Ray
    has restarted the actor, which takes a new worker process: seconds)."""
    end = time.monotonic() + 30
    while True:
        try:
            return ReplayBuffer.async_(lake=lake)
        except LakeError:
            if time.monotonic() > end:
                raise
            time.sleep(0.005)


def test_a_batch_held_when_the_actor_died_comes_back_through_a_new_client(tmp_path, ray_cluster):
    name = f"held-{uuid.uuid4().hex[:8]}"
    client = RayReplayBuffer.start(lake=tmp_path / "lake", name=name, place_on="lake",
                                   poll_interval=0.05, retry_wait=60)
    try:
        for uid in ("a", "b", "c"):
            _finished(client, uid)
        held = client.sample(1, "train", 2, timeout=30)           # never released: the death
        dead = client.info()["pid"]
        os.kill(dead, signal.SIGKILL)
        again = RayReplayBuffer.connect(name, retry_wait=60)      # the trainer, reconnecting
        assert list(again.held_batches("train")) == [held.batch_id]
        back = again.held_batch(held.batch_id)
        assert again.info()["pid"] != dead and again.info()["restarted"]
        assert (back.batch_id, back.step, back.partition, back.uids) == \
            (held.batch_id, held.step, held.partition, held.uids)
        assert back.table.drop_columns(["ts"]).equals(held.table.drop_columns(["ts"]))
        assert back.off_policy_metrics == held.off_policy_metrics
        assert back.eviction_metrics == {}                        # those were sample's
        again.release(back)
        with pytest.raises(UnknownBatchError) as remote:
            again.held_batch(held.batch_id)
    finally:
        ray_cluster.kill(client.handle)
    with ReplayBuffer.sync(lake=tmp_path / "local") as local, \
            pytest.raises(UnknownBatchError) as in_process:
        local.held_batch(held.batch_id)
    assert str(remote.value) == str(in_process.value) and "held_batches" in str(remote.value)
    assert any("Ray actor" in note for note in remote.value.__notes__)
