"""A listener (`add_listener`; the verl adapter's clears TransferQueue keys there) that raises
after the buffer wrote a change: the change stands, the rest of the call's work is done, and the
error reaches the caller saying so. A poll whose eviction's listener raised still owes the
refill (it was never decided, and the buffer starved for good, across a restart too); a sample
whose selection's listener raised keeps its batch for the retry (the batch stayed held for
nobody, and the retry chose another)."""
from __future__ import annotations

import pytest

from pipeline import ReplayBuffer, SampleTimeout, UnknownBatchError
from pipeline.lake import read_table
from tests.support.policies import group


class FailsOnce:
    """A listener that raises the first time it is told of ``kind``."""

    def __init__(self, kind: str):
        self.kind, self.failed, self.seen = kind, False, []

    def __call__(self, kind, partition, uids, batch_id) -> None:
        self.seen.append((kind, list(uids), batch_id))
        if kind == self.kind and not self.failed:
            self.failed = True
            raise RuntimeError(f"data plane down on {kind}")


def test_an_eviction_whose_listener_raised_still_owes_its_refill(tmp_path):
    calls: list[int] = []
    kw = dict(lake=tmp_path, max_off_policy_threshold=1, poll_interval=0.02)
    buf = ReplayBuffer.async_(refill_fn=calls.append, **kw)
    listener = FailsOnce("evict")
    buf.add_listener(listener)
    group(buf, "a", 0, [0.0, 1.0])
    group(buf, "b", 0, [0.0, 1.0])
    with pytest.raises(RuntimeError, match="data plane down on evict") as err:
        buf.sample(5, "train", 1, timeout=1)
    assert any("the change stands" in n for n in err.value.__notes__)
    assert calls == []                       # the call raised before asking: still owed
    with pytest.raises(SampleTimeout):
        buf.sample(5, "train", 1, timeout=0.2)
    assert calls == [2]                      # the next call asks for both
    buf.close()
    rows = [(r["kind"], r["count"]) for r in read_table(tmp_path, "decisions").to_pylist()
            if r["kind"] != "evict"]
    assert rows == [("refill", 2), ("refill_failed", 2), ("refill", 2)]


def test_a_selection_whose_listener_raised_keeps_its_batch_for_the_retry(tmp_path):
    buf = ReplayBuffer.sync(lake=tmp_path, poll_interval=0.02)
    listener = FailsOnce("select")
    buf.add_listener(listener)
    group(buf, "a", 0, [0.0, 1.0])
    group(buf, "b", 0, [0.0, 1.0])
    with pytest.raises(RuntimeError, match="data plane down on select"):
        buf.sample(1, "train", 1, timeout=1)
    batch = buf.sample(1, "train", 1, timeout=1)          # the retry: that very batch
    assert (batch.batch_id, batch.uids) == (0, ["a"])
    assert list(buf.held_batches("train")) == [0] and buf.counts("train")["finished"] == 1
    buf.release(batch)
    buf.close()
    names = {r["batch_id"] for r in read_table(tmp_path, "metrics").to_pylist()}
    assert names == {0}                      # its metric rows written, once the retry got it


def test_a_release_whose_listener_raised_stands_and_says_so(tmp_path):
    buf = ReplayBuffer.sync(poll_interval=0.02)
    buf.add_listener(FailsOnce("release"))
    group(buf, "a", 0, [0.0, 1.0])
    batch = buf.sample(1, "train", 1)
    with pytest.raises(RuntimeError, match="data plane down on release") as err:
        buf.release(batch)
    assert any("after the buffer wrote that change: the change stands" in n
               for n in err.value.__notes__)
    assert buf.held_batches("train") == {}
    with pytest.raises(UnknownBatchError):
        buf.release(batch)


def test_every_listener_is_told_of_every_effect_even_when_one_raises():
    buf = ReplayBuffer.async_(max_off_policy_threshold=1, refill_fn=lambda n: None,
                              poll_interval=0.02)
    first, second = FailsOnce("evict"), FailsOnce("never")
    buf.add_listener(first)
    buf.add_listener(second)
    group(buf, "a", 0, [0.0, 1.0])
    group(buf, "c", 5, [0.0, 1.0])
    with pytest.raises(RuntimeError):
        buf.sample(5, "train", 1, timeout=1)
    assert second.seen == [("evict", ["a"], None)]       # told though the first one raised
    assert buf.sample(5, "train", 1, timeout=1).uids == ["c"]
    assert [k for k, _, _ in second.seen] == ["evict", "select"]


@pytest.mark.parametrize("lake", [False, True])
def test_close_ends_a_sample_and_a_put_waiting_in_other_threads(tmp_path, lake):
    """A trainer shutting down closes the buffer while its sampler thread waits (timeout=None
    waited forever) and a producer waits for room: both end, saying the buffer was closed."""
    import threading

    from pipeline.errors import BufferUnavailableError
    from tests.support.lake import traj
    buf = ReplayBuffer.sync(lake=tmp_path if lake else None, poll_interval=0.05,
                            max_live_bytes=2000)
    buf.register(partition="train", uids=["a", "b"], global_steps=1)    # n unknown: may finish
    buf.put([traj("a", 0, response=[0] * 300)])
    ended: dict[str, BaseException] = {}

    def run(name, fn) -> None:
        try:
            fn()
        except BaseException as exc:     # noqa: BLE001 - the test reads it
            ended[name] = exc

    threads = [threading.Thread(target=run, args=("sample", lambda: buf.sample(1, "train", 1)),
                                daemon=True),
               threading.Thread(target=run, args=("put", lambda: buf.put(
                   [traj("b", 0, response=[0] * 300)], timeout=None)), daemon=True)]
    for t in threads:
        t.start()
    threads[0].join(0.3)              # (they end alike whether they wait already or not yet)
    buf.close()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert isinstance(ended["sample"], BufferUnavailableError)
    assert "the buffer was closed while this call waited; nothing was chosen" in str(
        ended["sample"])
    assert isinstance(ended["put"], BufferUnavailableError)
    assert "nothing of this call was accepted" in str(ended["put"])
    assert buf.lookup("train", "b").keys == frozenset()
