"""Input that pyarrow alone would take with a loss is refused with an IngestError naming its column
and row: a map holding a key twice, a float (numpy's too) in an integer column, a bool where a
number belongs, a number beyond float32's range; nothing of the refused call is stored, in memory,
in the lake or after a reopen. A list_view column is taken as the list it holds."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipeline import IngestError, ReplayBuffer
from pipeline.lake.writer import read_table
from schemas import TRAJECTORIES_INPUT, conform
from tests.ingest.test_ingest import rejected
from tests.support.lake import traj

MAP = pa.map_(pa.string(), pa.float64())


def open_group(buf: ReplayBuffer, uid: str = "g") -> None:
    """Group ``uid``, running, with session 0 stored: what a refused call must leave as it is."""
    buf.register(partition="train", uids=[uid], global_steps=1, n=4)
    buf.put([traj(uid, 0)])
    buf.update_status(partition="train", uids=[uid], status="running")


def refused(buf: ReplayBuffer, data, column: str, rows: tuple[int, ...]) -> IngestError:
    """`rejected` for a put of ``data`` into group g (see `open_group`), then the lake reopened
    holds group g as it was before the put: running, with the same sessions."""
    keys = buf.lookup("train", "g").keys
    exc = rejected(buf, lambda: buf.put(data), column, rows)
    buf.close()
    with ReplayBuffer.sync(lake=buf.lake_dir) as again:
        assert again.counts("train")["running"] == 1
        assert again.lookup("train", "g").keys == keys
    return exc


def table(rows: list[dict], **columns: pa.Array) -> pa.Table:
    """Rows as an Arrow table of exactly the input schema (the fast path), columns replaced."""
    t, problems = conform(rows, TRAJECTORIES_INPUT, {"index": 0, "is_padding": False,
                                                     "versions_inferred": False})
    assert not problems, problems
    for name, col in columns.items():
        t = t.set_column(t.schema.get_field_index(name), name, col)
    return t


# --- a map holding a key twice -----------------------------------------------------------------

@pytest.mark.parametrize("form", ["pairs", "arrow", "arrow_struct"])
def test_a_map_holding_a_key_twice_is_refused_naming_column_row_and_key(buf, form):
    open_group(buf)
    twice = [("acc", 1.0), ("acc", 0.0)]
    rows = [traj("g", 1, reward_info={"acc": 1.0}), traj("g", 2, reward_info=twice)]
    data = {
        "pairs": lambda: rows,
        "arrow": lambda: table([traj("g", 1), traj("g", 2)],
                               reward_info=pa.array([[("acc", 1.0)], twice], MAP)),
        "arrow_struct": lambda: pa.Table.from_pylist([traj("g", 1), traj("g", 2)]).append_column(
            "reward_info", pa.StructArray.from_arrays(
                [pa.array([1.0, 1.0]), pa.array([None, 0.0])], names=["acc", "acc"])),
    }[form]()
    rows_named = (0, 1) if form == "arrow_struct" else (1,)   # a struct's fields are every row's
    exc = refused(buf, data, "reward_info", rows_named)
    assert "'acc'" in str(exc) and "more than once" in str(exc)


def test_a_map_key_twice_is_refused_under_a_filter_on_that_metric(lake):
    with ReplayBuffer.async_(lake=lake, filter_groups_metric="acc", refill_fn=lambda n: None) as buf:
        open_group(buf)
        exc = rejected(buf, lambda: buf.put([traj("g", 1, reward_info=[("acc", 1.0),
                                                                      ("acc", 0.0)])]),
                       "reward_info", (0,))
        assert "key 'acc'" in str(exc)
        assert buf.put([traj("g", 1, reward_info=[("acc", 1.0), ("fmt", 1.0)])]) == 1


def test_every_map_column_of_a_schema_is_checked_and_each_key_named():
    schema = pa.schema([pa.field("a", MAP), pa.field("b", MAP)])
    data = {"a": [[("x", 1.0)], [("x", 1.0), ("y", 2.0), ("x", 3.0)]],
            "b": [[("y", 1.0), ("y", 2.0), ("z", 1.0), ("z", 1.0)], None]}
    out, problems = conform(data, schema)
    assert out is None
    assert [(p.column, p.rows, p.message.split(" appears")[0]) for p in problems] == [
        ("a", (1,), "key 'x'"), ("b", (0,), "key 'y'"), ("b", (0,), "key 'z'")]


# --- a float in an integer column --------------------------------------------------------------

@pytest.mark.parametrize("value", [np.float16(1.5), np.float16(2.0), np.longdouble(1.5),
                                   np.float32(1.5), np.bool_(True)])
def test_a_numpy_float_or_bool_in_an_integer_column_is_refused_not_truncated(buf, value):
    open_group(buf)
    exc = refused(buf, [traj("g", 3), traj("g", value, min_gs=value, max_gs=3)],
                  "session_id", (1,))        # truncated, it would have been session 1 or 2
    assert any(p.column == "min_global_steps" and p.rows == (1,) for p in exc.problems)


def test_a_numpy_float_among_numpy_ints_is_refused_not_truncated(buf):
    open_group(buf)        # pyarrow cannot infer one type for them: typed against int32 instead
    rows = [traj("g", np.int64(1)), traj("g", np.float16(2.5))]
    refused(buf, {k: [r[k] for r in rows] for k in rows[0]}, "session_id", (1,))


def test_a_numpy_float_inside_a_token_list_is_refused_not_truncated(buf):
    open_group(buf)
    refused(buf, [traj("g", 1), traj("g", 2, prompt=[1, np.float16(2.5)])], "prompt_ids", (1,))


# --- a bool where a number belongs -------------------------------------------------------------

@pytest.mark.parametrize("column, bad", [
    ("reward", {"reward": True}),
    ("generation_s", {"generation_s": True}),
    ("reward_info", {"reward_info": {"acc": True}}),
    ("reward_info", {"reward_info": [("acc", False)]}),
    ("rollout_log_probs", {"rollout_log_probs": [-0.5, False]}),
])
def test_a_bool_is_not_taken_as_a_number(buf, column, bad):
    open_group(buf)
    good = {"reward": 0.5, "generation_s": 0.5, "reward_info": {"acc": 1.0},
            "rollout_log_probs": [-0.5, -0.1]}
    exc = refused(buf, [traj("g", 1, **good), traj("g", 2, **{**good, **bad})], column, (1,))
    assert "a bool (True/False) is not taken as a number" in str(exc)


def test_a_bool_reward_column_is_refused_as_a_bool_ints_are_not(buf):
    open_group(buf)
    assert buf.put([traj("g", 1, reward=1), traj("g", 2, reward=np.int64(0))]) == 2
    refused(buf, table([traj("g", 3)]).set_column(6, "reward", pa.array([True])), "reward", ())


# --- a number beyond float32's range -----------------------------------------------------------

@pytest.mark.parametrize("form", ["python", "arrow"])
def test_a_log_prob_beyond_float32_range_is_refused_not_made_infinite(buf, form):
    open_group(buf)
    rows = [traj("g", 1, rollout_log_probs=[-0.5, -0.1]),
            traj("g", 2, rollout_log_probs=[-1e300, -0.1])]
    data = rows if form == "python" else pa.Table.from_pylist(rows)
    exc = refused(buf, data, "rollout_log_probs", (1,))
    assert "float32" in str(exc)


def test_an_infinite_log_prob_stays_accepted(buf):
    open_group(buf)
    assert buf.put([traj("g", 1, rollout_log_probs=[-math.inf, -0.5])]) == 1


# --- a list_view column ------------------------------------------------------------------------

def stored(lake: Path) -> list[dict]:
    return read_table(lake, "trajectories").drop_columns(["seq", "ts"]).to_pylist()


@pytest.mark.parametrize("view", [pa.list_view, pa.large_list_view])
def test_a_list_view_column_is_stored_as_the_same_list(tmp_path, view):
    rows = [traj("g", 0, prompt=[1, 2], response=[3, 4, 5]), traj("g", 1, prompt=[], response=[6])]
    # views in another order than their rows, over values that hold more than they show
    build = pa.ListViewArray if view is pa.list_view else pa.LargeListViewArray
    prompt = build.from_arrays([3, 0], [2, 0], pa.array([9, 9, 9, 1, 2], pa.int64()))
    response = pa.array([[3, 4, 5], [6]], view(pa.int32()))
    lakes = []
    for name, data in (("list", rows),
                       ("view", table(rows, prompt_ids=prompt, response_ids=response))):
        lakes.append(tmp_path / name)
        with ReplayBuffer.sync(lake=lakes[-1]) as buf:
            buf.register(partition="train", uids=["g"], global_steps=1)
            assert buf.put(data) == 2
    assert stored(lakes[1]) == stored(lakes[0])
    assert [r["prompt_ids"] for r in stored(lakes[1])] == [[1, 2], []]
