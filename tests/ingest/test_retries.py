"""Idempotent retries: a put sent again after its reply was lost is a no-op that says so, a
different row under a stored key is still refused (naming the key, nothing of the call kept), a
retry after a restart (rows restored from the lake) is a no-op too, and a call mixing new and
identical rows stores the new ones. Comparing happens only on a key collision."""
from __future__ import annotations

import math
import signal
import subprocess
import sys

import pyarrow as pa
import pytest

from pipeline import IngestError, PutResult, ReplayBuffer
from pipeline.ingest import validate_trajectories
from pipeline.lake.writer import read_table
from tests.support.lake import ROOT, lake_history, python_env, traj, write_script


def rows(uid: str, sessions, **kw) -> list[dict]:
    return [traj(uid, s, min_gs=1, max_gs=2, reward=float(s), response=(5, 6, s), **kw)
            for s in sessions]


def open_group(buf: ReplayBuffer, uid: str, n: int = 3) -> None:
    buf.register(partition="train", uids=[uid], global_steps=2, n=n)
    buf.update_status(partition="train", uids=[uid], status="running")


def snapshot(buf: ReplayBuffer) -> dict:
    return {"lake": lake_history(buf.lake_dir), "counts": buf.counts("train"),
            "keys": buf.lookup("train", "g").keys}


def test_an_identical_retry_is_a_no_op_that_says_so(buf):
    open_group(buf, "g")
    first = buf.put(rows("g", (0, 1)))
    assert (first, first.already_stored) == (2, 0) and isinstance(first, PutResult)
    before = snapshot(buf)
    again = buf.put(rows("g", (0, 1)))
    assert (again, again.already_stored) == (0, 2)
    assert repr(again) == "PutResult(stored=0, already_stored=2)"
    assert snapshot(buf) == before                       # memory and lake unchanged
    buf.put(rows("g", (2,)))
    buf.update_status(partition="train", uids=["g"], status="finished")
    batch = buf.sample(3, "train", 1)
    assert batch.table["session_id"].to_pylist() == [0, 1, 2]    # each key once


@pytest.mark.parametrize("change", [{"reward": 9.0}, {"response": (5, 6, 7)},
                                    {"max_gs": 3}, {"index": 0, "is_padding": True}])
def test_a_different_row_under_a_stored_key_is_refused_naming_it(buf, change):
    open_group(buf, "g")
    buf.put(rows("g", (0, 1)))
    before = snapshot(buf)
    changed = dict(rows("g", (1,))[0])
    if "response" in change:
        changed["response_ids"] = list(change["response"])
    elif "max_gs" in change:
        changed["max_global_steps"] = change["max_gs"]
    else:
        changed.update(change)
    column = {"reward": "reward", "response": "response_ids", "max_gs": "max_global_steps",
              "index": "is_padding"}[next(iter(change))]
    with pytest.raises(IngestError) as err:
        buf.put(rows("g", (0,)) + [changed])            # row 0 identical, row 1 not
    (problem,) = err.value.problems
    assert problem.rows == (1,) and "already in the buffer" in problem.message
    assert f"('g', 1, 0) differs in {column}" in problem.message
    assert snapshot(buf) == before                       # nothing of the call accepted
    buf.put(rows("g", (2,)))
    buf.update_status(partition="train", uids=["g"], status="finished")
    stored = buf.sample(3, "train", 1).table
    assert stored["reward"].to_pylist() == [0.0, 1.0, 2.0]       # the first row kept


def test_a_retry_of_a_length_sent_without_tokens_compares_the_length(buf):
    """A row sent as a count without its tokens is the same row when sent again so; another
    count under its key is a different row (named by the column that differs)."""
    open_group(buf, "g")
    sent = [traj("g", 0, response=(), n_response_tokens=7)]
    assert buf.put(sent) == 1
    again = buf.put(sent)
    assert (again, again.already_stored) == (0, 1)
    with pytest.raises(IngestError, match=r"\('g', 0, 0\) differs in n_response_tokens"):
        buf.put([traj("g", 0, response=(), n_response_tokens=8)])


def test_a_partly_repeated_call_stores_its_new_rows_once(buf):
    open_group(buf, "g")
    buf.put(rows("g", (0,)))
    got = buf.put(rows("g", (0, 1, 2)))
    assert (got, got.already_stored) == (2, 1)
    stored = read_table(buf.lake_dir, "trajectories")
    assert sorted(stored["session_id"].to_pylist()) == [0, 1, 2]
    # one new row and one conflicting row: the whole call is refused, the new row too
    open_group(buf, "h")
    buf.put(rows("h", (0,)))
    before = lake_history(buf.lake_dir)
    with pytest.raises(IngestError, match=r"\('h', 0, 0\) differs in reward"):
        buf.put(rows("h", (1,)) + [traj("h", 0, min_gs=1, max_gs=2, reward=5.0,
                                        response=(5, 6, 0))])
    assert lake_history(buf.lake_dir) == before and buf.lookup("train", "h").sessions == {0}


def test_a_retry_into_a_group_that_turned_terminal_meanwhile(buf):
    """Another producer finished (or the trainer sampled) the group before the retry came: its
    rows are still in memory, so an identical retry is a no-op; once released, the group takes
    nothing, a retry included."""
    open_group(buf, "g", n=2)
    buf.put(rows("g", (0, 1)))
    buf.update_status(partition="train", uids=["g"], status="finished")
    assert buf.put(rows("g", (1,))).already_stored == 1
    with pytest.raises(IngestError, match="not accepting"):
        buf.put(rows("g", (1, 2)))                      # a new row: the group is terminal
    batch = buf.sample(3, "train", 1)
    assert buf.put(rows("g", (0, 1))).already_stored == 2     # selected, not yet released
    buf.release(batch)
    with pytest.raises(IngestError, match="not accepting"):
        buf.put(rows("g", (0,)))


def test_a_retry_with_a_nan_reward_metric_is_identical(buf):
    """NaN equals NaN in the comparison (a named reward metric other than the filter's may be
    NaN), and a map is the same map whatever the order of its pairs."""
    open_group(buf, "g")
    buf.put(rows("g", (0,), reward_info={"x": 1.0, "y": math.nan}))
    assert buf.put(rows("g", (0,), reward_info={"x": 1.0, "y": math.nan})).already_stored == 1
    assert buf.put(rows("g", (0,), reward_info={"y": math.nan, "x": 1.0})).already_stored == 1
    with pytest.raises(IngestError, match="differs in reward_info"):
        buf.put(rows("g", (0,), reward_info={"x": 1.0, "y": 0.5}))


def test_within_one_call_a_key_twice_is_still_refused(buf):
    open_group(buf, "g")
    buf.put(rows("g", (0,)))
    with pytest.raises(IngestError, match="within this call"):
        buf.put(rows("g", (0, 0)))


def test_only_a_key_collision_reads_the_stored_rows(buf):
    """The usual put (new groups, or new sessions of a group that has some) never asks for the
    stored rows; a colliding one does."""
    asked: list[tuple[str, str]] = []

    def stored(partition: str, uid: str) -> pa.Table:
        asked.append((partition, uid))
        return buf._state.stored_rows(partition, uid)

    open_group(buf, "g")
    state = buf._state
    for sessions in ((0,), (1, 2)):
        table, repeated = validate_trajectories(rows("g", sessions), state.lookup, None, stored)
        assert (table.num_rows, repeated, asked) == (len(sessions), 0, [])
        buf.put(rows("g", sessions))
    table, repeated = validate_trajectories(rows("g", (1,)), state.lookup, None, stored)
    assert (table.num_rows, repeated, asked) == (0, 1, [("train", "g")])


DIES_AFTER_PUT = """
    import os, signal, sys
    from pipeline import ReplayBuffer
    from tests.ingest.test_retries import open_group, rows

    buf = ReplayBuffer.sync(lake=sys.argv[1])
    open_group(buf, "g")
    buf.put(rows("g", (0, 1)))
    os.kill(os.getpid(), signal.SIGKILL)      # dies before the producer sees the reply
"""


def test_a_retry_after_a_restart_is_a_no_op(tmp_path):
    script, lake = write_script(tmp_path, "dies.py", DIES_AFTER_PUT), tmp_path / "lake"
    proc = subprocess.run([sys.executable, str(script), str(lake)], cwd=ROOT,
                          capture_output=True, text=True, env=python_env(), timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    with ReplayBuffer.sync(lake=lake) as buf:
        before = lake_history(lake)
        got = buf.put(rows("g", (0, 1)))                # the producer's retry
        assert (got, got.already_stored) == (0, 2)
        assert lake_history(lake) == before
        with pytest.raises(IngestError, match=r"\('g', 0, 0\) differs in reward"):
            buf.put(rows("g", (1,)) + [traj("g", 0, min_gs=1, max_gs=2, reward=4.0,
                                            response=(5, 6, 0))])
        assert buf.put(rows("g", (1, 2))) == 1
        buf.update_status(partition="train", uids=["g"], status="finished")
        assert buf.sample(3, "train", 1).table["session_id"].to_pylist() == [0, 1, 2]
