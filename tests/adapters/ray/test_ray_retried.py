"""What the actor takes out of a call sent again after a restart: the part the lost attempt
already did, and nothing else (in process: the functions the actor applies to its buffer)."""
from __future__ import annotations

import pytest

from pipeline import ReplayBuffer
from pipeline.adapters.ray.retried import register_left, release_left, status_left
from pipeline.errors import IngestError
from tests.support.ray_producers import GROUP, group_rows


def _registered(buf: ReplayBuffer, uids: list[str]) -> dict:
    kwargs = {"partition": "train", "uids": uids, "global_steps": 1, "n": GROUP}
    buf.register(**kwargs)
    return kwargs


def test_a_retried_register_drops_the_groups_the_lost_attempt_registered():
    buf = ReplayBuffer.async_()
    landed = _registered(buf, ["a", "b"])
    assert register_left(buf, landed) is None                       # it all landed: a no-op
    lost = {**landed, "uids": ["c", "d"]}
    assert register_left(buf, lost) == lost                         # none landed: all of it
    other_n = {**landed, "n": GROUP + 1}
    assert register_left(buf, other_n) == other_n                   # not the same call: refused
    with pytest.raises(IngestError, match="already registered"):
        buf.register(**other_n)
    rows = [{"partition": "train", "uid": "a", "global_steps": 1, "n": GROUP},
            {"partition": "train", "uid": "e", "global_steps": 1, "n": GROUP}]
    assert register_left(buf, {"data": rows}) == {"data": [rows[1]]}



def test_a_retried_register_keeps_the_prompt_ids_and_datasets_of_the_groups_it_leaves_in():
    buf = ReplayBuffer.async_()
    buf.register(partition="train", uids=["a"], global_steps=1, n=GROUP, prompt_ids=[7])
    call = {"partition": "train", "uids": ["a", "b", "c"], "global_steps": 1, "n": GROUP,
            "prompt_ids": [7, 8, 9], "dataset": ["x", "y", None]}
    assert register_left(buf, call) == {**call, "uids": ["b", "c"], "prompt_ids": [8, 9],
                                        "dataset": ["y", None]}
    one_name = {**call, "dataset": "x"}                  # one name for all stays as it is
    assert register_left(buf, one_name) == {**one_name, "uids": ["b", "c"],
                                            "prompt_ids": [8, 9]}
    buf.register(**register_left(buf, call))
    assert [buf.lookup("train", u).prompt_id for u in "abc"] == [7, 8, 9]

def test_a_retried_status_update_drops_the_groups_already_at_or_past_that_status():
    buf = ReplayBuffer.async_()
    _registered(buf, ["a", "b", "c"])
    buf.update_status(partition="train", uids=["a", "b"], status="running")
    call = {"partition": "train", "uids": ["a", "b", "c"], "status": "running"}
    assert status_left(buf, call) == {**call, "uids": ["c"]}
    for uid in ("a", "b"):
        buf.put(group_rows(uid, 1))
    buf.update_status(partition="train", uids=["a"], status="finished")
    buf.update_status(partition="train", uids=["b"], status="failure")
    assert status_left(buf, call) == {**call, "uids": ["c"]}        # both moved past running
    finish = {"partition": "train", "uids": ["a", "b"], "status": "finished"}
    assert status_left(buf, finish) == {**finish, "uids": ["b"]}    # failure: a conflict, kept
    batch = buf.sample(1, "train", 1)
    assert batch.uids == ["a"] and status_left(buf, {**finish, "uids": ["a"]}) is None
    buf.release(batch)
    assert status_left(buf, {**finish, "uids": ["a"]}) is None      # released: gone past it


def test_a_retried_release_of_a_batch_no_longer_held_is_a_no_op():
    buf = ReplayBuffer.async_()
    _registered(buf, ["a"])
    buf.put(group_rows("a", 1))
    buf.update_status(partition="train", uids=["a"], status="finished")
    batch = buf.sample(1, "train", 1)
    assert release_left(buf, batch.batch_id)
    buf.release(batch)
    assert not release_left(buf, batch.batch_id)
