"""Refills a pulling producer has not taken yet outlive a restart of the buffer's actor: the
lake holds every ask, a ledger beside it what the producers took, and the restarted actor owes
the difference; a `take_refills` sent again after its reply was lost gets the count it was
handed, not a second one."""
from __future__ import annotations

import os
import signal
import threading
import time
import uuid

import polars as pl
import pytest

from pipeline import ReplayBuffer
from pipeline.adapters.ray.client import RayReplayBuffer
from pipeline.adapters.ray.refills import RefillLedger, RefillRequests, asked_in_lake
from pipeline.errors import SampleTimeout
from tests.support.lake import traj


def _group(buf, uid: str, acc: list[float]) -> None:
    buf.register(partition="train", uids=[uid], global_steps=1, n=len(acc))
    buf.put([traj(uid, s, reward=a, reward_info={"acc": a}) for s, a in enumerate(acc)])
    buf.update_status(partition="train", uids=[uid], status="running")
    buf.update_status(partition="train", uids=[uid], status="finished")


def _ask_one(buf, uid: str) -> None:
    """A zero-variance group, evicted by a `sample` that then asks for one new prompt."""
    _group(buf, uid, [1.0, 1.0])
    with pytest.raises(SampleTimeout):
        buf.sample(1, "train", 2, timeout=0.2)


def _opened(lake, restarted: bool) -> tuple[ReplayBuffer, RefillRequests]:
    """What the actor's open does, in process: a buffer pulling its refills, and its ledger."""
    refills = RefillRequests()
    buf = ReplayBuffer.async_(lake=lake, refill_fn=refills, filter_groups_metric="acc",
                              poll_interval=0.01)
    refills.keep_in(RefillLedger(lake, fsync=True), asked_in_lake(lake), restarted=restarted)
    return buf, refills


def test_the_ledger_owes_after_a_restart_what_the_lake_asked_and_no_producer_took(tmp_path):
    lake = tmp_path / "lake"
    buf, refills = _opened(lake, restarted=False)
    _group(buf, "mixed", [0.0, 1.0])
    _ask_one(buf, "flat-0")
    assert refills.take("t1") == 1
    assert refills.take("t1") == 1 and refills.take("t2") == 0     # t1's retry: the same count
    _ask_one(buf, "flat-1")                                        # asked, never taken
    buf.close()                                                    # the process dies here
    buf, again = _opened(lake, restarted=True)
    assert again.take("t1") == 1          # a take whose reply the death lost, sent again
    assert again.take("t3") == 1          # the ask nobody took: owed again
    assert again.take("t4") == 0
    buf.close()
    buf, fresh = _opened(lake, restarted=False)       # a new actor owes none of the old asks
    assert fresh.take("t5") == 0
    buf.close()


def test_a_restart_owes_the_pulled_refills_again_and_serves_the_calls_in_flight_at_the_death(
        tmp_path, ray_cluster):
    """The actor's process stopped, then killed, with a `register` of a polars frame and a
    `take_refills` in flight: both are sent again to the restarted actor and land as first
    calls would; the refill the lake asked for before the death is handed out then."""
    client = RayReplayBuffer.start(lake=tmp_path / "lake", name=f"pull-{uuid.uuid4().hex[:8]}",
                                   place_on="lake", refill="pull", filter_groups_metric="acc",
                                   poll_interval=0.05, retry_wait=120)
    try:
        _group(client, "mixed", [0.0, 1.0])
        _ask_one(client, "flat")
        pid = client.info()["pid"]
        frame = pl.DataFrame({"partition": ["train"], "uid": ["late"], "global_steps": [1],
                              "n": [2]})
        answers: dict[str, object] = {}

        def call(name: str, fn) -> threading.Thread:
            def run() -> None:
                try:
                    answers[name] = fn()
                except BaseException as exc:      # noqa: BLE001 - the test reads it
                    answers[name] = exc
            thread = threading.Thread(target=run)
            thread.start()
            return thread

        os.kill(pid, signal.SIGSTOP)
        threads = [call("register", lambda: client.register(frame)),
                   call("take", client.take_refills)]
        time.sleep(0.5)                                # both sent to the stopped process
        os.kill(pid, signal.SIGKILL)
        for thread in threads:
            thread.join(120)
        assert answers == {"register": None, "take": 1}
        assert client.retries >= 2 and client.info()["pid"] != pid
        assert client.lookup("train", "late").n == 2 and client.take_refills() == 0
        _group(client, "refill-0", [0.0, 1.0])         # the producer answers the ask
        assert sorted(client.sample(1, "train", 2, timeout=30).uids) == ["mixed", "refill-0"]
    finally:
        client.kill()
