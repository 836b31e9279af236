"""Ingest rejects every bad-input class with a typed error naming column and row, and a
rejected call changes nothing: not the live buffer, not the lake (all-or-nothing per call)."""
from __future__ import annotations

import math
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest

from pipeline import IngestError, ReplayBuffer, UnknownGroupError
from pipeline.lake.writer import read_table
from schemas import TRAJECTORIES
from tests.support.lake import add_group, lake_counts, traj


@pytest.fixture
def seeded(buf: ReplayBuffer) -> ReplayBuffer:
    """A buffer holding one group in every state a bad input could touch:

    - ``gone``: finished, then sampled (removed, batch not released)
    - ``freed``: finished, sampled and released
    - ``done``: finished (2 trajectories), still sampleable
    - ``open``: running, n=2, session 0 already in
    - ``fresh``: pending, no trajectory yet
    """
    add_group(buf, "gone", 0, [1.0])
    add_group(buf, "freed", 0, [1.0])
    buf.sample(1, "train", 1)                      # takes `gone`
    buf.release(buf.sample(1, "train", 1))         # takes and releases `freed`
    add_group(buf, "done", 2, [0.0, 1.0])
    buf.register(partition="train", uids=["open"], global_steps=2, n=2)
    buf.put([traj("open", 0, min_gs=1, max_gs=1)])
    buf.update_status(partition="train", uids=["open"], status="running")
    buf.register(partition="train", uids=["fresh"], global_steps=3)
    return buf


def state(buf: ReplayBuffer) -> dict:
    """Everything a rejected call must leave alone: live counts, sampleable, and the lake."""
    lake = Path(buf.lake_dir)
    return {
        "partitions": buf.partitions(),
        "counts": {p: buf.counts(p) for p in buf.partitions()},
        "sampleable": {p: buf.get_sampleable_count(4, p) for p in buf.partitions()},
        "lake": lake_counts(lake),
        "files": sorted(str(p.relative_to(lake.parent)) for p in lake.parent.rglob("*")),
    }


def where(column: str, rows: tuple[int, ...] | None) -> str:
    """How an error message names a column and its rows (schemas.conform.Problem)."""
    if not rows:
        return f"column '{column}'"
    word = "row" if len(rows) == 1 else "rows"
    return f"column '{column}', {word} {', '.join(map(str, rows))}:"


def rejected(buf: ReplayBuffer, call, column: str, rows: tuple[int, ...] | None = None, *,
             error: type[IngestError] = IngestError) -> IngestError:
    """Run ``call``; assert it raises exactly ``error`` (a ValueError) naming ``column`` (and
    ``rows``), and that neither the buffer nor the lake changed."""
    before = state(buf)
    with pytest.raises(IngestError) as info:
        call()
    exc = info.value
    assert type(exc) is error
    assert isinstance(exc, ValueError)
    assert "nothing was accepted" in str(exc)
    assert where(column, rows) in str(exc), str(exc)
    if rows is not None:
        assert any(p.column == column and p.rows == rows for p in exc.problems), exc.problems
    assert state(buf) == before
    return exc


# --- status ------------------------------------------------------------------------------------

@pytest.mark.parametrize("status", ["done", "FINISHED", "sampled", ""])
def test_unknown_status_is_rejected_naming_status_and_row(seeded, status):
    rejected(seeded, lambda: seeded.update_status(
        {"partition": ["train", "train"], "uid": ["fresh", "open"],
         "status": ["running", status]}), "status", (1,))


@pytest.mark.parametrize(("uid", "now", "to"), [
    ("open", "running", "pending"),
    ("fresh", "pending", "pending"),
    ("done", "finished", "running"),
    ("done", "finished", "failure"),
    ("done", "finished", "finished"),
])
def test_status_never_moves_backward_or_leaves_a_terminal_state(seeded, uid, now, to):
    exc = rejected(seeded, lambda: seeded.update_status(partition="train", uids=[uid], status=to),
                   "status", (0,))
    assert f"is {now}" in str(exc)


def test_backward_step_inside_one_call_is_rejected_whole(seeded):
    rejected(seeded, lambda: seeded.update_status(
        {"partition": ["train"] * 2, "uid": ["fresh", "fresh"], "status": ["running", "pending"]}),
        "status", (1,))


def test_a_uid_named_twice_in_one_call_is_told_apart_from_its_stored_status(seeded):
    """The second row was told the group "is running" while it was pending: row 0 of the same
    call was moving it there."""
    exc = rejected(seeded, lambda: seeded.update_status(
        partition="train", uids=["fresh", "fresh"], status="running"), "status", (1,))
    assert "group 'fresh' is pending, and row 0 of this call moves it to 'running'" in str(exc)


def test_finishing_a_group_with_missing_sessions_is_rejected(seeded):
    exc = rejected(seeded, lambda: seeded.update_status(partition="train", uids=["open"],
                                                        status="finished"), "status", (0,))
    assert "n=2" in str(exc)
    seeded.update_status(partition="train", uids=["open"], status="failure")  # failing is allowed
    assert seeded.counts("train")["failure"] == 1


@pytest.mark.parametrize(("uid", "why"), [("never-registered", "never registered"),
                                         ("gone", "already sampled"),
                                         ("freed", "already gone (trained and released")])
def test_status_for_an_unknown_or_removed_group_is_an_unknown_group_error(seeded, uid, why):
    exc = rejected(seeded, lambda: seeded.update_status(partition="train", uids=[uid],
                                                        status="running"),
                   "uid", (0,), error=UnknownGroupError)
    assert why in str(exc)


# --- steps -------------------------------------------------------------------------------------

def test_min_above_max_global_steps_is_rejected(seeded):
    rejected(seeded, lambda: seeded.put([traj("fresh", 0, min_gs=3, max_gs=2)]),
             "min_global_steps", (0,))


@pytest.mark.parametrize(("column", "row"), [
    ("min_global_steps", traj("fresh", 0, min_gs=-1, max_gs=0)),
    ("max_global_steps", traj("fresh", 0, min_gs=-2, max_gs=-1)),
])
def test_negative_weight_versions_are_rejected(seeded, column, row):
    rejected(seeded, lambda: seeded.put([traj("fresh", 1), row]), column, (1,))


def test_negative_dispatch_step_is_rejected(seeded):
    rejected(seeded, lambda: seeded.register(
        {"partition": ["train", "train"], "uid": ["x", "y"], "global_steps": [0, -1]}),
        "global_steps", (1,))


def test_registration_without_global_steps_column_is_rejected(seeded):
    exc = rejected(seeded, lambda: seeded.register([{"partition": "train", "uid": "x"}]),
                   "global_steps")
    assert "missing" in str(exc)


def test_registration_with_null_global_steps_is_rejected(seeded):
    rejected(seeded, lambda: seeded.register([
        {"partition": "train", "uid": "x", "global_steps": 1},
        {"partition": "train", "uid": "y", "global_steps": None}]), "global_steps", (1,))


@pytest.mark.parametrize("column", ["min_global_steps", "max_global_steps"])
def test_trajectory_without_versions_is_rejected(seeded, column):
    absent = traj("fresh", 0)
    del absent[column]
    rejected(seeded, lambda: seeded.put([absent]), column)
    rejected(seeded, lambda: seeded.put([traj("fresh", 0), traj("fresh", 1, **{column: None})]),
             column, (1,))


# --- identity ----------------------------------------------------------------------------------

def test_registration_without_uid_is_rejected(seeded):
    rejected(seeded, lambda: seeded.register([{"partition": "train", "global_steps": 1}]), "uid")
    rejected(seeded, lambda: seeded.register([
        {"partition": "train", "uid": "x", "global_steps": 1},
        {"partition": "train", "uid": None, "global_steps": 1}]), "uid", (1,))


@pytest.mark.parametrize("call", ["register", "put"])
def test_empty_uid_is_rejected(seeded, call):
    if call == "register":
        rejected(seeded, lambda: seeded.register(partition="train", uids=["x", ""],
                                                 global_steps=1), "uid", (1,))
    else:
        rejected(seeded, lambda: seeded.put([traj("fresh", 0), traj("", 1)]), "uid", (1,))


def test_trajectory_without_uid_is_rejected(seeded):
    rejected(seeded, lambda: seeded.put([traj("fresh", 0), traj(None, 1)]), "uid", (1,))


def test_duplicate_session_within_one_call_is_rejected(seeded):
    rejected(seeded, lambda: seeded.put([traj("fresh", 0), traj("fresh", 1), traj("fresh", 0)]),
             "session_id", (2,))


def test_duplicate_session_against_the_buffer_is_rejected(seeded):
    exc = rejected(seeded, lambda: seeded.put([traj("open", 1), traj("open", 0)]),
                   "session_id", (1,))
    assert "already in the buffer" in str(exc)


def test_same_session_with_another_output_index_is_not_a_duplicate(seeded):
    assert seeded.put([traj("fresh", 0, index=0), traj("fresh", 0, index=1)]) == 2


def test_expected_session_count_below_one_is_rejected(seeded):
    rejected(seeded, lambda: seeded.register(partition="train", uids=["x"], global_steps=1, n=0),
             "n", (0,))


def test_registering_a_uid_twice_is_rejected(seeded):
    rejected(seeded, lambda: seeded.register(partition="train", uids=["x", "x"], global_steps=1),
             "uid", (1,))
    for uid in ("done", "gone", "freed"):   # live, sampled, released: never resurrected
        rejected(seeded, lambda u=uid: seeded.register(partition="train", uids=[u],
                                                       global_steps=1), "uid", (0,))


# --- types -------------------------------------------------------------------------------------

def test_string_in_an_int_column_is_rejected_naming_the_row(seeded):
    rejected(seeded, lambda: seeded.put([traj("fresh", 0), traj("fresh", "1")]),
             "session_id", (1,))


def test_string_column_where_ints_belong_is_rejected(seeded):
    table = pa.table({"partition": ["train"], "uid": ["x"], "global_steps": ["3"]})
    rejected(seeded, lambda: seeded.register(table), "global_steps")


def test_float_token_ids_are_rejected(seeded):
    table = pa.Table.from_pylist([traj("fresh", 0)]).set_column(
        7, "response_ids", pa.array([[3.0, 4.0]], pa.list_(pa.float64())))
    rejected(seeded, lambda: seeded.put(table), "response_ids")


def test_float_token_ids_in_python_rows_are_rejected_naming_the_row(seeded):
    rejected(seeded, lambda: seeded.put([traj("fresh", 0), traj("fresh", 1, response=[3.5, 4.0])]),
             "response_ids", (1,))


def test_string_reward_is_rejected_naming_the_row(seeded):
    rejected(seeded, lambda: seeded.put([traj("fresh", 0, reward="high")]), "reward", (0,))


def test_unknown_column_is_rejected_not_dropped(seeded):
    exc = rejected(seeded, lambda: seeded.put([traj("fresh", 0, rewrd=1.0)]), "rewrd")
    assert "unknown column" in str(exc)


def test_out_of_range_token_id_is_rejected_naming_only_its_row(seeded):
    rows = [traj("fresh", 0), traj("fresh", 1, response=[3, 2**31]), traj("fresh", 2)]
    table = pa.Table.from_pylist(rows)
    assert table.schema.field("response_ids").type == pa.list_(pa.int64())
    rejected(seeded, lambda: seeded.put(table), "response_ids", (1,))


def test_int64_token_ids_are_cast_losslessly_to_int32(seeded):
    table = pa.Table.from_pylist([traj("fresh", 0, prompt=[7, 2**31 - 1], response=[0, 5])])
    assert table.schema.field("prompt_ids").type == pa.list_(pa.int64())
    seeded.put(table)
    stored = read_table(seeded.lake_dir, "trajectories").filter(
        pa.compute.equal(pa.compute.field("uid"), "fresh"))
    assert stored.schema.field("prompt_ids").type == pa.list_(pa.int32())
    assert stored.column("prompt_ids").to_pylist() == [[7, 2**31 - 1]]


# --- rewards -----------------------------------------------------------------------------------

def test_nan_reward_is_rejected(seeded):
    rejected(seeded, lambda: seeded.put([traj("fresh", 0), traj("fresh", 1, reward=math.nan)]),
             "reward", (1,))


def test_nan_reward_beside_a_null_one_is_named_alone(seeded):
    rejected(seeded, lambda: seeded.put([traj("fresh", 0, reward=None),
                                         traj("fresh", 1, reward=math.nan)]),
             "reward", (1,))


def test_a_reward_not_known_is_stored_as_null(seeded):
    """A reward not sent (or sent as None: not scored yet) is null in the lake, never 0.0."""
    row = traj("fresh", 1)
    del row["reward"]
    assert seeded.put([traj("fresh", 0, reward=None), row]) == 2
    stored = read_table(seeded.lake_dir, "trajectories").filter(
        pa.compute.equal(pa.compute.field("uid"), "fresh"))
    assert stored.column("reward").to_pylist() == [None, None]


@pytest.mark.parametrize("bad", [-0.001, math.nan, math.inf])
def test_generation_seconds_must_be_finite_and_not_negative(seeded, bad):
    rejected(seeded, lambda: seeded.put([traj("fresh", 0, generation_s=0.5),
                                         traj("fresh", 1, generation_s=bad)]),
             "generation_s", (1,))


def test_generation_seconds_are_optional_and_stored_as_given(seeded):
    seeded.put([traj("fresh", 0, generation_s=0.0), traj("fresh", 1)])
    stored = read_table(seeded.lake_dir, "trajectories").filter(
        pa.compute.equal(pa.compute.field("uid"), "fresh"))
    assert stored.column("generation_s").to_pylist() == [0.0, None]


def test_nan_filter_metric_is_rejected_when_the_filter_needs_it(lake):
    with ReplayBuffer.async_(lake=lake, filter_groups_metric="acc",
                             refill_fn=lambda n: None) as buf:
        buf.register(partition="train", uids=["a"], global_steps=0)
        rejected(buf, lambda: buf.put([traj("a", 0, reward_info={"acc": 1.0}),
                                       traj("a", 1, reward_info={"acc": math.nan})]),
                 "reward_info", (1,))
        assert buf.put([traj("a", 0, reward_info={"acc": 1.0}),
                        traj("a", 1, reward_info={"acc": 0.0})]) == 2


def test_a_null_reward_is_refused_when_the_filter_reads_rewards(lake):
    with ReplayBuffer.async_(lake=lake, filter_groups_metric="reward",
                             refill_fn=lambda n: None) as buf:
        buf.register(partition="train", uids=["a"], global_steps=0)
        err = rejected(buf, lambda: buf.put([traj("a", 0, reward=1.0), traj("a", 1, reward=None)]),
                       "reward", (1,))
        assert "zero-variance filter on 'reward' needs one" in str(err)


def test_nan_in_an_unused_reward_metric_is_accepted(seeded):
    assert seeded.put([traj("fresh", 0, reward_info={"acc": math.nan})]) == 1


# --- groups ------------------------------------------------------------------------------------

@pytest.mark.parametrize("uid", ["never-registered", "done", "gone", "freed"])
def test_trajectory_for_an_unknown_terminal_or_removed_group_is_an_unknown_group_error(seeded, uid):
    rejected(seeded, lambda: seeded.put([traj(uid, 5)]), "uid", (0,), error=UnknownGroupError)


def test_trajectory_for_a_group_of_another_partition_is_unknown(seeded):
    seeded.register(partition="val", uids=["v"], global_steps=0)
    rejected(seeded, lambda: seeded.put([traj("fresh", 0, partition="val")]), "uid", (0,),
             error=UnknownGroupError)


def test_session_beyond_the_groups_n_is_rejected(seeded):
    rejected(seeded, lambda: seeded.put([traj("open", 2)]), "session_id", (0,))


# --- partitions --------------------------------------------------------------------------------

UNSAFE = ["", "../x", "a/b", ".", "..", "a b", "x\\y", "ü"]


@pytest.mark.parametrize("pid", UNSAFE)
def test_unsafe_partition_is_rejected_at_registration(seeded, pid):
    rejected(seeded, lambda: seeded.register(
        {"partition": ["train", pid], "uid": ["x", "y"], "global_steps": [1, 1]}),
        "partition", (1,))


@pytest.mark.parametrize("pid", UNSAFE)
def test_unsafe_partition_is_rejected_for_trajectories_and_status(seeded, pid):
    rejected(seeded, lambda: seeded.put([traj("fresh", 0, partition=pid)]), "partition", (0,))
    rejected(seeded, lambda: seeded.update_status(partition=pid, uids=["fresh"], status="running"),
             "partition", (0,))


@pytest.mark.parametrize("pid", UNSAFE)
def test_unsafe_partition_is_rejected_by_sample(seeded, pid):
    rejected(seeded, lambda: seeded.sample(4, pid, 1, timeout=0.01), "partition")


def test_a_partition_id_longer_than_a_directory_name_allows_is_rejected(seeded):
    """Refused at the call (naming the limit), in memory and on disk alike, not by the file
    system when the lake first writes it."""
    rejected(seeded, lambda: seeded.register(partition="p" * 201, uids=["x"], global_steps=1),
             "partition", (0,))
    assert seeded.register(partition="p" * 200, uids=["x"], global_steps=1) is None


def test_a_dictionary_encoded_string_column_is_taken_as_its_values(seeded):
    """A polars Categorical (an Arrow dictionary) uid or partition is the same strings."""
    rows = [traj("fresh", 0), traj("fresh", 1, reward=1.0)]
    frame = pl.DataFrame(rows).with_columns(pl.col("uid").cast(pl.Categorical),
                                            pl.col("partition").cast(pl.Categorical))
    assert seeded.put(frame) == 2
    assert seeded.lookup("train", "fresh").keys == {(0, 0), (1, 0)}


def test_an_unknown_field_inside_a_version_span_is_rejected_not_dropped(seeded):
    spans = [{"version": 0, "n_tokens": 2, "weight": 1}]
    exc = rejected(seeded, lambda: seeded.put([traj("fresh", 0, version_spans=spans)]),
                   "version_spans")
    assert "unknown field(s) weight" in str(exc)


@pytest.mark.parametrize("pid", ["val", "eval-2.b_c", "A9", "x.y"])
def test_safe_partition_ids_are_accepted(buf, pid):
    buf.register(partition=pid, uids=["p"], global_steps=1)
    assert buf.put([traj("p", 0, partition=pid)]) == 1
    assert (Path(buf.lake_dir) / "trajectories" / f"partition={pid}").is_dir()


# --- payload consistency -----------------------------------------------------------------------

def test_version_spans_that_do_not_add_up_are_rejected(seeded):
    spans = [{"version": 0, "n_tokens": 1}]             # response has 2 tokens
    rejected(seeded, lambda: seeded.put([traj("fresh", 0, version_spans=spans)]),
             "version_spans", (0,))


def test_version_span_outside_the_rows_versions_is_rejected(seeded):
    spans = [{"version": 0, "n_tokens": 1}, {"version": 3, "n_tokens": 1}]
    rejected(seeded, lambda: seeded.put([traj("fresh", 0, max_gs=2, version_spans=spans)]),
             "version_spans", (0,))


def test_version_spans_that_add_up_are_accepted(seeded):
    spans = [{"version": 0, "n_tokens": 1}, {"version": 1, "n_tokens": 1}]
    assert seeded.put([traj("fresh", 0, max_gs=1, version_spans=spans)]) == 1


@pytest.mark.parametrize("column, items", [
    ("prompt_ids", [1, None]), ("response_ids", [3, None]), ("response_mask", [1, None]),
    ("rollout_log_probs", [-0.5, None]),
])
def test_a_null_item_inside_a_token_list_is_rejected_naming_its_row(seeded, column, items):
    """It would reach the trainer's tensors (and fail a whole batch at conversion, after the
    batch was taken): refused at put, naming the column and the row."""
    exc = rejected(seeded, lambda: seeded.put([traj("fresh", 0), traj("fresh", 1, **{column: items})]),
                   column, (1,))
    assert "null item" in str(exc)


@pytest.mark.parametrize("column, items, why", [
    ("prompt_ids", [-1, 2], ">= 0"), ("response_ids", [3, -5], ">= 0"),
    ("response_mask", [1, 2], "0 or 1"), ("response_mask", [-1, 1], "0 or 1"),
    ("rollout_log_probs", [-0.5, 5.0], "<= 0"), ("rollout_log_probs", [math.nan, -1.0], "<= 0"),
])
def test_token_items_out_of_range_are_rejected_naming_the_row(seeded, column, items, why):
    exc = rejected(seeded, lambda: seeded.put([traj("fresh", 0), traj("fresh", 1, **{column: items})]),
                   column, (1,))
    assert why in str(exc)


def test_token_items_at_their_bounds_are_accepted(seeded):
    """Token id 0, masks 0 and 1, a log-probability of exactly 0 and of -inf are all valid."""
    assert seeded.put([traj("fresh", 0, prompt=(0, 0), response=(0, 7), response_mask=[0, 1],
                            rollout_log_probs=[0.0, -math.inf])]) == 1


@pytest.mark.parametrize("spans", [
    [None], [{"version": 0, "n_tokens": 2}, None], [{"version": None, "n_tokens": 2}],
])
def test_a_null_version_span_is_rejected_naming_its_row(seeded, spans):
    rejected(seeded, lambda: seeded.put([traj("fresh", 0), traj("fresh", 1, version_spans=spans)]),
             "version_spans", (1,))


def test_response_mask_of_the_wrong_length_is_rejected(seeded):
    rejected(seeded, lambda: seeded.put([traj("fresh", 0, response_mask=[1])]),
             "response_mask", (0,))


# --- a response length sent without its tokens -------------------------------------------------

def test_a_response_length_sent_without_its_tokens_is_stored(seeded):
    """A producer that keeps the tokens elsewhere sends their count: the lake stores it, and a
    row that sends its tokens (count null, or equal) stores their length."""
    assert seeded.put([traj("fresh", 0, response=(), n_response_tokens=7),
                       traj("fresh", 1, response=(5, 6, 7), n_response_tokens=3),
                       traj("fresh", 2, response=(5, 6)),
                       traj("fresh", 3, response=(), n_response_tokens=0)]) == 4
    rows = read_table(Path(seeded.lake_dir), "trajectories").to_pylist()
    got = sorted((r["session_id"], r["n_response_tokens"], len(r["response_ids"]))
                 for r in rows if r["uid"] == "fresh")
    assert got == [(0, 7, 0), (1, 3, 3), (2, 2, 2), (3, 0, 0)]


@pytest.mark.parametrize("row, why", [
    ({"response": (), "n_response_tokens": -1}, ">= 0"),
    ({"response": (5, 6), "n_response_tokens": 3}, "differs from the length of response_ids"),
    ({"response": (5, 6), "n_response_tokens": 1}, "differs from the length of response_ids"),
])
def test_a_response_length_that_cannot_be_is_rejected_naming_the_row(seeded, row, why):
    exc = rejected(seeded, lambda: seeded.put([traj("fresh", 0), traj("fresh", 1, **row)]),
                   "n_response_tokens", (1,))
    assert why in str(exc)


def test_version_spans_add_up_to_the_length_sent_and_masks_to_the_tokens_sent(seeded):
    """Spans count the response's tokens (the length sent, without them); a per-token column
    must match the tokens it rides with."""
    spans = [{"version": 0, "n_tokens": 4}]
    assert seeded.put([traj("fresh", 0, response=(), n_response_tokens=4,
                            version_spans=spans)]) == 1
    rejected(seeded, lambda: seeded.put([traj("fresh", 1, response=(), n_response_tokens=5,
                                              version_spans=spans)]), "version_spans", (0,))
    rejected(seeded, lambda: seeded.put([traj("fresh", 1, response=(), n_response_tokens=2,
                                              response_mask=[1, 1])]), "response_mask", (0,))


# --- all or nothing ----------------------------------------------------------------------------

def test_one_bad_row_rejects_the_whole_batch_and_stores_none_of_it(seeded):
    good = [traj("fresh", s, reward=float(s)) for s in range(4)]
    batch = good[:2] + [traj("fresh", 9, min_gs=5, max_gs=1)] + good[2:]
    rejected(seeded, lambda: seeded.put(batch), "min_global_steps", (2,))
    assert "fresh" not in read_table(seeded.lake_dir, "trajectories").column("uid").to_pylist()
    assert seeded.put(good) == 4            # none of the good rows was kept: no duplicates now


def test_every_problem_of_a_batch_is_reported_at_once(seeded):
    batch = [traj("fresh", 0, reward=math.nan), traj("fresh", 1), traj("fresh", 2, min_gs=-1)]
    exc = rejected(seeded, lambda: seeded.put(batch), "reward", (0,))
    assert where("min_global_steps", (2,)) in str(exc)


def test_known_and_unknown_groups_in_one_call_reject_the_known_ones_too(seeded):
    exc = rejected(seeded, lambda: seeded.put([traj("fresh", 0), traj("nope", 0)]),
                   "uid", (1,), error=UnknownGroupError)
    assert len(exc.problems) == 1


def test_one_bad_registration_rejects_all_of_them(seeded):
    rejected(seeded, lambda: seeded.register(
        {"partition": ["train"] * 3, "uid": ["x", "y", "z"], "global_steps": [1, -1, 1]}),
        "global_steps", (1,))
    seeded.register(partition="train", uids=["x", "y", "z"], global_steps=1)
    assert seeded.counts("train")["pending"] == 4


def test_one_bad_status_rejects_all_of_them(seeded):
    rejected(seeded, lambda: seeded.update_status(
        {"partition": ["train"] * 2, "uid": ["fresh", "done"], "status": ["running"] * 2}),
        "status", (1,))
    assert seeded.counts("train")["pending"] == 1


def test_a_rejected_call_loses_nothing_already_accepted(seeded):
    with pytest.raises(IngestError):
        seeded.put([traj("open", 1), traj("open", 1)])
    seeded.put([traj("open", 1, min_gs=1, max_gs=1)])
    seeded.update_status(partition="train", uids=["open"], status="finished")
    batch = seeded.sample(4, "train", 2)
    assert batch.uids == ["done", "open"]
    assert [(r["uid"], r["session_id"]) for r in batch.table.select(["uid", "session_id"])
            .to_pylist()] == [("done", 0), ("done", 1), ("open", 0), ("open", 1)]


# --- accepted forms ----------------------------------------------------------------------------

ROWS = [traj("g", 0, reward=0.5, response=[3, 4, 5]), traj("g", 1, reward=1.0, response=[6])]


@pytest.mark.parametrize("form", ["table", "record_batch", "polars", "dicts", "columns"])
def test_every_input_form_stores_the_same_rows(buf, form):
    data = {
        "table": lambda: pa.Table.from_pylist(ROWS),
        "record_batch": lambda: pa.RecordBatch.from_pylist(ROWS),
        "polars": lambda: pl.DataFrame(ROWS),
        "dicts": lambda: ROWS,
        "columns": lambda: {k: [r[k] for r in ROWS] for k in ROWS[0]},
    }[form]()
    buf.register(partition="train", uids=["g"], global_steps=1)
    assert buf.put(data) == 2
    stored = read_table(buf.lake_dir, "trajectories")
    assert stored.schema == TRAJECTORIES
    assert stored.select(["uid", "session_id", "index", "reward", "response_ids", "is_padding"]) \
        .to_pylist() == [
            {"uid": "g", "session_id": 0, "index": 0, "reward": 0.5, "response_ids": [3, 4, 5],
             "is_padding": False},
            {"uid": "g", "session_id": 1, "index": 0, "reward": 1.0, "response_ids": [6],
             "is_padding": False}]


@pytest.mark.parametrize("form", ["table", "polars", "dicts"])
def test_registration_accepts_every_input_form(buf, form):
    rows = [{"partition": "train", "uid": "a", "global_steps": 0, "n": 2},
            {"partition": "train", "uid": "b", "global_steps": 1, "n": None}]
    data = {"table": pa.Table.from_pylist, "polars": pl.DataFrame, "dicts": list}[form](rows)
    buf.register(data)
    assert buf.counts("train")["pending"] == 2


def test_empty_token_lists_are_accepted(buf):
    buf.register(partition="train", uids=["e"], global_steps=0)
    assert buf.put([traj("e", 0, prompt=[], response=[])]) == 1


def test_input_that_is_not_a_table_is_rejected(buf):
    with pytest.raises(IngestError, match="cannot ingest"):
        buf.put("not rows")


@pytest.mark.parametrize("empty", [[], {}])
def test_an_empty_batch_is_accepted_as_nothing(seeded, empty):
    before = state(seeded)
    assert seeded.put(empty) == 0
    seeded.register(empty)
    seeded.update_status(empty)
    assert state(seeded) == before


def test_one_call_may_carry_several_partitions(buf):
    buf.register({"partition": ["train", "val"], "uid": ["a", "a"], "global_steps": [1, 1]})
    assert buf.put([traj("a", 0), traj("a", 0, partition="val", reward=0.5)]) == 2
    buf.update_status({"partition": ["val", "train"], "uid": ["a", "a"],
                       "status": ["finished", "finished"]})
    assert buf.sample(1, "val", 1).table["reward"].to_pylist() == [0.5]
    assert buf.sample(1, "train", 1).table["reward"].to_pylist() == [0.0]
