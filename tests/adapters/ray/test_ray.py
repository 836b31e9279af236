"""The buffer as a Ray actor: remote producers and one sampler on a real local Ray cluster, the
same errors as in-process, Arrow batches, refills requested from inside the actor."""
from __future__ import annotations

import inspect
import itertools
import threading
import time
import uuid

import pyarrow as pa
import pytest

from pipeline import ReplayBuffer
from pipeline.adapters.ray.client import RayReplayBuffer
from pipeline.errors import (
    BufferFullError,
    BufferUnavailableError,
    ConfigError,
    IngestError,
    LakeError,
    SampleTimeout,
    UnknownBatchError,
    UnknownGroupError,
)
from pipeline.lake.writer import read_table
from tests.support.lake import add_group, traj
from tests.support.ray_producers import GROUP, group_rows, produce

pytestmark = pytest.mark.usefixtures("ray_cluster")

def _name() -> str:
    return f"rl-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def actor(tmp_path, ray_cluster):
    """An async-preset buffer actor over a lake under tmp_path; killed afterwards."""
    client = RayReplayBuffer.start(lake=tmp_path / "lake", preset="async", name=_name(),
                                   poll_interval=0.05)
    yield client
    client.kill()


def test_remote_producers_and_one_sampler_lose_and_duplicate_no_group(actor, tmp_path,
                                                                       ray_cluster):
    ray = ray_cluster
    remote_produce = ray.remote(num_cpus=1)(produce)
    batch_groups, producers, per_producer = 4, 4, 6
    total = producers * per_producer
    first = ray.remote(num_cpus=0)(lambda c: c.sample(1, "train", batch_groups, timeout=60)) \
        .remote(actor)                          # waits inside the actor before anything exists
    done = [remote_produce.remote(actor, p, per_producer, 1) for p in range(producers)]
    batches = [ray.get(first)]
    while sum(b.num_groups for b in batches) < total:
        batches.append(actor.sample(1, "train", batch_groups, timeout=60))
    produced = list(itertools.chain.from_iterable(ray.get(done)))
    sampled = [u for b in batches for u in b.uids]
    assert sorted(sampled) == sorted(produced) and len(set(sampled)) == total
    for b in batches:
        assert isinstance(b.table, pa.Table) and b.table.num_rows == batch_groups * GROUP
        assert sorted(set(b.table.column("uid").to_pylist())) == sorted(b.uids)
        actor.release(b)
    actor.close()
    lake = tmp_path / "lake"
    traj_rows = read_table(lake, "trajectories")
    assert traj_rows.num_rows == total * GROUP
    assert len(set(zip(traj_rows.column("uid").to_pylist(),
                       traj_rows.column("session_id").to_pylist()))) == total * GROUP
    dec = read_table(lake, "decisions").to_pylist()
    selected = [d["uid"] for d in dec if d["kind"] == "select"]
    assert sorted(selected) == sorted(produced)
    assert sorted(d["uid"] for d in dec if d["kind"] == "release") == sorted(produced)


def test_errors_raised_inside_the_actor_reach_the_caller_with_their_type(actor):
    actor.register(partition="train", uids=["g0"], global_steps=1, n=GROUP)
    with pytest.raises(UnknownGroupError) as unknown:
        actor.put([traj("never-registered", 0)])
    assert [p.column for p in unknown.value.problems] == ["uid"]
    assert "unknown group" in str(unknown.value)
    assert any("Ray actor" in note for note in unknown.value.__notes__)
    with pytest.raises(SampleTimeout) as timeout:
        actor.sample(1, "train", 1, timeout=0.2)
    assert timeout.value.counts["pending"] == 1
    with pytest.raises(UnknownBatchError):
        actor.release(12345)
    with pytest.raises(IngestError, match="must be an integer >= 0"):
        actor.put([traj("g0", 0, min_gs=-1)])   # refused whole inside the actor
    assert actor.counts("train")["pending"] == 1


def test_a_malformed_row_is_refused_before_it_is_shipped(actor):
    actor.register(partition="train", uids=["g0"], global_steps=1)
    with pytest.raises(IngestError, match="reward"):
        actor.put([traj("g0", 0, reward="high")])


def test_a_bad_config_or_a_locked_lake_fails_start_with_the_in_process_error(tmp_path):
    with pytest.raises(ConfigError, match="max off policy threshold"):
        RayReplayBuffer.start(lake=None, name=_name(), max_off_policy_threshold=0)
    with pytest.raises(ConfigError, match="preset"):
        RayReplayBuffer.start(lake=None, name=_name(), preset="fast")
    with ReplayBuffer.async_(lake=tmp_path / "held"):          # this process holds the lock
        with pytest.raises(LakeError):
            RayReplayBuffer.start(lake=tmp_path / "held", name=_name())


def test_the_actor_hands_out_the_batch_the_in_process_buffer_hands_out(actor, tmp_path):
    local = ReplayBuffer.async_(lake=tmp_path / "local", poll_interval=0.05)
    for buf in (local, actor):
        for k, gs in enumerate((3, 1, 2)):
            uid = f"g{k}"
            buf.register(partition="train", uids=[uid], global_steps=gs, n=GROUP)
            buf.put(group_rows(uid, gs))
            buf.update_status(partition="train", uids=[uid], status="running")
            buf.update_status(partition="train", uids=[uid], status="finished")
    ours, theirs = actor.sample(3, "train", 2), local.sample(3, "train", 2)
    local.close()
    assert ours.uids == theirs.uids == ["g1", "g2"]
    assert ours.table.drop_columns(["ts"]).equals(theirs.table.drop_columns(["ts"]))
    assert ours.metrics == theirs.metrics
    assert (ours.batch_id, ours.step, ours.partition) == (theirs.batch_id, 3, "train")


def test_a_producer_task_finds_the_actor_by_name(actor, ray_cluster):
    ray = ray_cluster

    @ray.remote(num_cpus=0)
    def producer(name: str) -> int:
        client = RayReplayBuffer.connect(name)
        client.register(partition="train", uids=["v0"], global_steps=0)
        return client.put(group_rows("v0", 0))

    assert ray.get(producer.remote(actor.name)) == GROUP
    assert actor.counts("train")["pending"] == 1


def test_a_remote_put_retried_after_its_reply_was_lost_is_a_no_op(actor, ray_cluster, tmp_path):
    ray = ray_cluster

    @ray.remote(num_cpus=0)
    def producer(name: str) -> tuple[int, int]:
        client = RayReplayBuffer.connect(name)
        client.register(partition="train", uids=["r0"], global_steps=1, n=GROUP)
        client.put(group_rows("r0", 1)[:2])              # the reply this producer never saw
        again = client.put(group_rows("r0", 1))          # its retry, with the rest
        return int(again), again.already_stored

    stored, already = ray.get(producer.remote(actor.name))
    assert (stored, already) == (GROUP - 2, 2)
    retry = actor.put(group_rows("r0", 1))
    assert (retry, retry.already_stored) == (0, GROUP)
    with pytest.raises(IngestError, match=r"\('r0', 1, 0\) differs in reward") as err:
        actor.put([traj("r0", 1, reward=7.0)])
    assert any("Ray actor" in note for note in err.value.__notes__)
    trajectories = read_table(tmp_path / "lake", "trajectories")
    assert sorted(trajectories["session_id"].to_pylist()) == list(range(GROUP))


def test_pull_refill_records_what_the_buffer_asks_for_until_a_producer_takes_it(tmp_path,
                                                                                ray_cluster):
    client = RayReplayBuffer.start(lake=tmp_path / "lake", preset="async", name=_name(),
                                   refill="pull", filter_groups_metric="acc", poll_interval=0.05)
    try:
        def finished_group(uid: str, acc: list[float]) -> None:
            client.register(partition="train", uids=[uid], global_steps=1, n=len(acc))
            client.put([traj(uid, s, reward=a, reward_info={"acc": a})
                        for s, a in enumerate(acc)])
            client.update_status(partition="train", uids=[uid], status="running")
            client.update_status(partition="train", uids=[uid], status="finished")

        finished_group("flat", [1.0, 1.0])             # zero variance: evicted, refill owed
        finished_group("mixed", [0.0, 1.0])
        waiting = ray_cluster.remote(num_cpus=0)(
            lambda c: c.sample(1, "train", 2, timeout=60)).remote(client)
        owed = 0
        while owed == 0:
            owed = client.take_refills()
        assert owed == 1 and client.take_refills() == 0
        finished_group("refill-0", [0.0, 1.0])          # the producer answers the request
        batch = ray_cluster.get(waiting)
        assert sorted(batch.uids) == ["mixed", "refill-0"]
        assert batch.filtered_reward_counts == {1.0: 1}
    finally:
        client.kill()


def test_refill_through_a_user_actor_registers_new_prompts_from_inside_sample(tmp_path,
                                                                             ray_cluster):
    ray = ray_cluster
    name = _name()

    @ray.remote(num_cpus=0)
    class Dispatcher:
        """A rollout manager: asked for k prompts, registers them and starts their rollouts."""

        def __init__(self) -> None:
            self.asked: list[int] = []

        def refill(self, k: int) -> None:
            client = RayReplayBuffer.connect(name)
            for _ in range(k):
                uid = f"refill-{len(self.asked)}"
                self.asked.append(k)
                client.register(partition="train", uids=[uid], global_steps=1, n=2)
                client.put([traj(uid, s, reward=float(s), reward_info={"acc": float(s)})
                            for s in range(2)])
                client.update_status(partition="train", uids=[uid], status="running")
                client.update_status(partition="train", uids=[uid], status="finished")

        def asked_for(self) -> list[int]:
            return self.asked

    dispatcher = Dispatcher.remote()
    client = RayReplayBuffer.start(lake=tmp_path / "lake", preset="async", name=name,
                                   refill=(dispatcher, "refill"), filter_groups_metric="acc",
                                   poll_interval=0.05)
    try:
        client.register(partition="train", uids=["flat"], global_steps=1, n=2)
        client.put([traj("flat", s, reward=1.0, reward_info={"acc": 1.0}) for s in range(2)])
        client.update_status(partition="train", uids=["flat"], status="running")
        client.update_status(partition="train", uids=["flat"], status="finished")
        batch = client.sample(1, "train", 1, timeout=60)
        assert batch.uids == ["refill-0"]
        assert ray.get(dispatcher.asked_for.remote()) == [1]
    finally:
        client.kill()


def test_the_actor_answers_the_dispatch_capacity_the_in_process_buffer_answers(tmp_path):
    client = RayReplayBuffer.start(lake=tmp_path / "lake", preset="async", name=_name(),
                                   poll_interval=0.05, max_off_policy_threshold=2,
                                   max_off_policy_strategy="admit", train_batch_size=2)
    local = ReplayBuffer.async_(max_off_policy_threshold=2, max_off_policy_strategy="admit",
                                train_batch_size=2, poll_interval=0.05)
    try:
        for buf in (local, client):
            assert buf.dispatch_capacity(1, "train") == 4
            buf.register(partition="train", uids=["g0"], global_steps=1, n=GROUP)
            buf.put(group_rows("g0", 1))
            buf.update_status(partition="train", uids=["g0"], status="finished")
            buf.register(partition="train", uids=["g1"], global_steps=1, n=GROUP)
        assert client.dispatch_capacity(1, "train") == local.dispatch_capacity(1, "train") == 2
        assert client.dispatch_capacity(1, "train", batch_size=3) == 4
        with pytest.raises(ConfigError, match="batch_size"):
            client.dispatch_capacity(1, "train", batch_size=0)
    finally:
        client.kill()


def test_the_actor_resumes_in_flight_groups_keeping_their_completed_sessions(actor):
    actor.register(partition="train", uids=["a", "b"], global_steps=1, n=GROUP)
    actor.put(group_rows("a", 1)[:3])
    assert actor.resume(4, "train") == {"train": [("a", [3]), ("b", [0, 1, 2, 3])]}
    actor.put(group_rows("a", 1)[3:])
    actor.update_status(partition="train", uids=["a"], status="running")
    actor.update_status(partition="train", uids=["a"], status="finished")
    batch = actor.sample(4, "train", 1)
    assert batch.table["session_id"].to_pylist() == [0, 1, 2, 3]
    assert set(batch.table["global_steps"].to_pylist()) == {4}


def test_the_client_takes_the_parameters_of_every_in_process_method():
    """Names, order, kinds and defaults, method by method: code written against `ReplayBuffer`
    runs against the actor. `add_listener` alone is not offered (its callback would run in the
    actor's process, not the caller's)."""
    public = {n for n, _ in inspect.getmembers(ReplayBuffer, inspect.isfunction)
              if not n.startswith("_")}
    assert "sample" in public and "add_listener" in public
    for name in sorted(public - {"add_listener"}):
        ours = inspect.signature(getattr(RayReplayBuffer, name)).parameters.values()
        theirs = inspect.signature(getattr(ReplayBuffer, name)).parameters.values()
        assert [(p.name, p.kind, p.default) for p in ours] == \
            [(p.name, p.kind, p.default) for p in theirs], name


def test_the_actor_answers_the_in_process_keywords_as_the_in_process_buffer(tmp_path):
    """`partition=` or its `partition_id=` alias on every call, `put(timeout=)` waiting for room
    under `max_live_bytes`, `release` of what is not a batch, and the reads beside `counts`:
    the same answers and errors from the actor as in process."""
    client = RayReplayBuffer.start(lake=tmp_path / "lake", preset="sync", name=_name(),
                                   poll_interval=0.05, max_live_bytes=300)   # one group's room
    local = ReplayBuffer.sync(poll_interval=0.05, max_live_bytes=300)
    try:
        answers = [_keyword_calls(buf) for buf in (local, client)]
        assert answers[0] == answers[1]
        for buf in (local, client):
            with pytest.raises(ConfigError, match=r"^release: 'abc' is not a batch; pass"):
                buf.release("abc")
        with pytest.raises(ConfigError, match="before_poll= runs in the buffer's own process"):
            client.sample(1, partition="train", batch_size=1, before_poll=lambda: None)
    finally:
        client.kill()


def _keyword_calls(buf) -> list:
    """Calls by keyword, as the README writes them; what each answered."""
    add_group(buf, "a", 1)
    buf.register(partition_id="train", uids=["b", "c"], global_steps=1, n=2)
    got = [buf.counts(partition="train"), buf.counts(partition_id="train"),
           buf.lookup(partition="train", uid="b"), buf.get_sampleable_count(1, partition="train"),
           buf.lookup_many(partition_id="train", uids=["b", "nobody", "a"]),
           buf.sampleable_uids(partition_id="train")]
    batch = buf.sample(global_steps=1, partition="train", batch_size=1, timeout=5)
    got += [batch.uids, list(buf.held_batches(partition="train"))]
    with pytest.raises(BufferFullError, match="pass put"):
        buf.put([traj("b", s) for s in range(2)], timeout=0)        # "a" fills the budget
    threading.Timer(0.3, buf.release, [batch]).start()
    got.append(int(buf.put([traj("b", s) for s in range(2)], timeout=30)))   # waits for room
    buf.update_status(partition_id="train", uids=["b"], status="finished")
    buf.prepare(partition="train")
    got.append(buf.candidates(partition="train")["uid"].to_pylist())
    got += [buf.retire(partition_id="train", uids=["c", "zz"]), buf.counts("train")]
    got.append(buf.reissue(2, partition="train"))
    return got


def test_a_dead_refill_dispatcher_is_the_refill_functions_error_not_the_buffer_actors(
        tmp_path, ray_cluster):
    """The actor asks a dispatcher actor that died: `sample` raises that error at once, as an
    in-process refill_fn that raises, with one failed ask in the lake; the buffer actor, alive,
    is not waited for as if it had died."""
    ray = ray_cluster

    @ray.remote(num_cpus=0)
    class Dispatcher:
        def refill(self, k: int) -> None:
            return None

    dispatcher = Dispatcher.remote()
    client = RayReplayBuffer.start(lake=tmp_path / "lake", preset="async", name=_name(),
                                   refill=(dispatcher, "refill"), filter_groups_metric="acc",
                                   poll_interval=0.05, retry_wait=30)
    try:
        pid = client.info()["pid"]
        client.register(partition="train", uids=["flat"], global_steps=1, n=2)
        client.put([traj("flat", s, reward=1.0, reward_info={"acc": 1.0}) for s in range(2)])
        client.update_status(partition="train", uids=["flat"], status="finished")
        ray.kill(dispatcher)
        t0 = time.monotonic()
        with pytest.raises(ray.exceptions.ActorDiedError) as died:
            client.sample(1, "train", 1, timeout=20)
        assert time.monotonic() - t0 < 10 and client.retries == 0
        assert not isinstance(died.value, BufferUnavailableError)
        assert "refill dispatcher" in str(died.value)
        assert client.info()["pid"] == pid
        client.close()
        kinds = read_table(tmp_path / "lake", "decisions")["kind"].to_pylist()
        assert (kinds.count("refill"), kinds.count("refill_failed")) == (1, 1)
    finally:
        client.kill()
