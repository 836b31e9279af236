"""What the actor takes out of a call sent again after a restart: the part the lost attempt
already did, and nothing else (in process: the functions the actor applies to its buffer)."""
from __future__ import annotations

import re

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
    rows = [{"partition": "train", "uid": "a", "global_steps": 1, "n": GROUP},
            {"partition": "train", "uid": "e", "global_steps": 1, "n": GROUP,
             "prompt_id": 5, "dataset": "math"}]
    left = register_left(buf, {"data": rows})["data"]               # every column of the rest
    assert left.to_pylist() == [rows[1]]


def test_a_retried_register_refuses_a_uid_another_producer_registered_otherwise():
    buf = ReplayBuffer.async_()
    landed = _registered(buf, ["a", "b"])
    for other in ({"n": GROUP + 1}, {"global_steps": 5}, {"prompt_ids": [1, 2]}):
        with pytest.raises(IngestError, match=r"'a' is already registered in partition 'train' "
                                              r"as global_steps=1, n=4; .* registers it as") as e:
            register_left(buf, {**landed, **other})
        assert [p.rows for p in e.value.problems] == [(0,), (1,)]   # both named, nothing kept
    assert buf.counts("train")["pending"] == 2


@pytest.mark.parametrize("form", ["polars", "arrow", "batch", "columns", "rows", "alias"])
def test_a_retry_reads_every_input_the_buffer_takes_and_lands_as_a_first_call(form):
    """Rows as any input `register` / `update_status` take (a polars or pyarrow table, a record
    batch, a dict of columns, rows, the shorthand with the `partition_id` alias), sent again
    after the lost attempt landed (a no-op) or not (all of it, as given)."""
    import polars as pl
    import pyarrow as pa

    def shaped(cols: dict) -> dict:
        if form == "alias":
            return {k: v[0] if k == "partition" else v for k, v in cols.items()
                    if k != "uid"} | {"partition_id": cols["partition"][0], "uids": cols["uid"]}
        data = {"polars": pl.DataFrame, "arrow": pa.table, "columns": dict,
                "batch": pa.RecordBatch.from_pydict,
                "rows": lambda c: [dict(zip(c, v)) for v in zip(*c.values())]}[form](cols)
        return {"data": data}

    buf = ReplayBuffer.async_()
    reg = shaped({"partition": ["train"] * 2, "uid": ["a", "b"], "global_steps": [1, 1],
                  "n": [GROUP, GROUP]} if form != "alias" else
                 {"partition": ["train"], "uid": ["a", "b"], "global_steps": 1, "n": GROUP})
    assert register_left(buf, reg) is reg                            # none landed: as given
    buf.register(**reg)
    assert register_left(buf, reg) is None                           # all landed: nothing
    run = shaped({"partition": ["train"] * 2, "uid": ["a", "b"], "status": ["running"] * 2}
                 if form != "alias" else {"partition": ["train"], "uid": ["a", "b"],
                                          "status": "running"})
    assert status_left(buf, run) is run
    buf.update_status(**run)
    assert status_left(buf, run) is None
    assert buf.counts("train")["running"] == 2


@pytest.mark.parametrize("call", [
    {"data": [{"partition_id": "train", "uid": "a", "global_steps": 1, "n": GROUP}]},
    {"data": "not rows"},
    {"partition": "train", "uids": "a", "global_steps": 1, "n": GROUP},
    {"partition": "train", "partition_id": "eval", "uids": ["a"], "global_steps": 1},
    {"data": [{"partition": "train", "uid": "a", "global_steps": 1}], "prompt_ids": [1]},
])
def test_a_retry_the_buffer_refuses_as_it_stands_is_refused_as_a_first_call(call):
    """A retry whose rows the buffer cannot read (a pandas frame, rows with `partition_id`, a
    lone uid string, disagreeing partitions, ...) goes to the buffer whole, which refuses it
    with the first attempt's very error."""
    buf = ReplayBuffer.async_()
    assert register_left(buf, call) is call
    with pytest.raises(Exception) as first:
        buf.register(**call)
    with pytest.raises(type(first.value), match="^" + re.escape(str(first.value)) + "$"):
        buf.register(**register_left(buf, call))


def test_a_retried_pandas_frame_is_refused_as_its_first_attempt_is():
    import pandas as pd

    # the `ray` extra installs pandas: no skip
    buf = ReplayBuffer.async_()
    frame = pd.DataFrame({"partition": ["train"], "uid": ["a"], "global_steps": [1], "n": [2]})
    assert register_left(buf, {"data": frame})["data"] is frame
    with pytest.raises(IngestError, match="cannot ingest DataFrame"):
        buf.register(**register_left(buf, {"data": frame}))


def test_a_retried_register_keeps_the_prompt_ids_and_datasets_of_the_groups_it_leaves_in():
    buf = ReplayBuffer.async_()
    buf.register(partition="train", uids=["a"], global_steps=1, n=GROUP, prompt_ids=[7],
                 dataset="x")                            # what the lost attempt registered
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
