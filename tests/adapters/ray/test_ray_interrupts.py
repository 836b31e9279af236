"""A trainer interrupted (Ctrl-C) while its `sample` waits in the buffer's actor: the call is
given up in the actor too, so it chooses nothing behind the trainer's back, or, if it had chosen
its batch already, keeps it for the trainer's next `sample` of that partition at the same step,
as the in-process buffer does."""
from __future__ import annotations

import os
import signal
import threading
import time
import uuid

import pytest

from pipeline.adapters.ray.client import RayReplayBuffer
from pipeline.adapters.ray.deliveries import Abandoned, Deliveries
from tests.support.lake import add_group

CALL = {"global_steps": 3, "partition": "train", "batch_size": 1, "timeout": None}


def _batch(batch_id: int, step: int = 3) -> tuple:
    """A batch as the actor's `sample` answers it (payload, metadata)."""
    return (b"rows", {"batch_id": batch_id, "step": step, "partition": "train"})


def test_a_call_given_up_before_it_starts_never_runs():
    deliveries, ran = Deliveries(), []
    assert deliveries.abandon("t1") == "abandoned"
    with pytest.raises(Abandoned):
        deliveries.run("t1", CALL, lambda: ran.append(1))
    assert ran == []


def test_a_call_given_up_while_it_waits_stops_before_its_next_poll():
    deliveries = Deliveries()

    def waiting() -> None:
        deliveries.abandon("t1")             # the caller's Ctrl-C, between two polls
        deliveries.check("t1")               # what the next poll runs first
        raise AssertionError("polled after the caller gave up")

    with pytest.raises(Abandoned):
        deliveries.run("t1", CALL, waiting)
    assert deliveries.run("t2", CALL, lambda: _batch(5), claim=lambda kept: True) == _batch(5)


def test_a_batch_chosen_after_its_caller_gave_up_goes_to_the_next_sample_at_that_step():
    deliveries, claimed = Deliveries(), []

    def chooses() -> tuple:
        deliveries.abandon("t1")             # Ctrl-C after the last poll began: it chooses
        return _batch(7)

    with pytest.raises(Abandoned):
        deliveries.run("t1", CALL, chooses, claim=lambda kept: True)
    again = deliveries.run("t2", CALL, lambda: _batch(8),
                           claim=lambda kept: claimed.append(kept.batch_id) or True)
    assert again == _batch(7) and claimed == [7]
    assert deliveries.run("t3", CALL, lambda: _batch(8), claim=lambda kept: True) == _batch(8)


def test_a_kept_batch_remembers_the_request_its_call_named():
    """The actor hands a kept batch only to a call with the same request (or to any, when the
    given-up call named none): the request named by the call is kept with it."""
    deliveries, kept = Deliveries(), []

    def chooses() -> tuple:
        deliveries.abandon("t1")
        return _batch(7)

    with pytest.raises(Abandoned):
        deliveries.run("t1", {**CALL, "request": "step-3"}, chooses, claim=lambda k: True)
    deliveries.run("t2", {**CALL, "request": "other"}, lambda: _batch(8),
                   claim=lambda k: kept.append(k) or False)
    assert [(k.batch_id, k.request) for k in kept] == [(7, "step-3")]


def test_a_caller_that_gives_up_after_the_answer_left_is_told_to_read_it():
    deliveries = Deliveries()
    assert deliveries.run("t1", CALL, lambda: _batch(4), claim=lambda kept: True) == _batch(4)
    assert deliveries.abandon("t1") == "replied"


def test_a_sample_waits_for_a_given_up_call_of_its_partition_to_end():
    deliveries, order = Deliveries(), []
    polling, release = threading.Event(), threading.Event()

    def slow_choice() -> tuple:
        polling.set()
        release.wait(10)                     # a poll under way when the caller gives up
        order.append("old chose")
        return _batch(9)

    old = threading.Thread(target=lambda: pytest.raises(
        Abandoned, deliveries.run, "t1", CALL, slow_choice, lambda kept: True))
    old.start()
    polling.wait(10)
    deliveries.abandon("t1")
    threading.Timer(0.2, release.set).start()
    got = deliveries.run("t2", CALL, lambda: order.append("new polled") or _batch(10),
                         claim=lambda kept: True)
    old.join(10)
    assert got == _batch(9) and order == ["old chose"]


def test_a_trainer_interrupted_while_sample_waits_leaves_nothing_chosen_behind_its_back(
        tmp_path, ray_cluster):
    client = RayReplayBuffer.start(lake=tmp_path / "lake", name=f"ctrl-c-{uuid.uuid4().hex[:8]}",
                                   poll_interval=0.05)
    try:
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        with pytest.raises(KeyboardInterrupt):
            client.sample(1, "train", 1, timeout=30)       # waits: nothing registered yet
        add_group(client, "a", 1)
        add_group(client, "b", 1)
        time.sleep(0.5)                                     # ten polls of a call still running
        assert client.held_batches("train") == {}
        batch = client.sample(1, "train", 1, timeout=30)   # the trainer runs the cell again
        assert batch.uids == ["a"]
        assert list(client.held_batches("train")) == [batch.batch_id]
    finally:
        client.kill()
