"""The fast paths of ingest give exactly what the general paths give: the same conformed table or
the same problems, the same stamped lake rows, the same byte accounting and the same group
aggregates. (Speed is measured by `replaylake dev bench ingest`, never asserted here.)"""
from __future__ import annotations

from types import MappingProxyType
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from jobs.synthetic import trajectories
from pipeline import ReplayBuffer
from pipeline.decide import compile as declared
from pipeline.state.journal import Journal
from pipeline.state.payload import TrajectoryRows
from schemas import GROUPS_INPUT, LAKE_TABLES, STATUS_INPUT, TRAJECTORIES_INPUT, conform
from schemas.conform_fast import plain_lists, plain_python
from tests.support.lake import traj

GROUPS = {"partition": ["train"] * 3, "uid": ["a", "b", "c"], "global_steps": [1, 1, 2],
          "n": [None, 4, None]}


def general(data: dict, target: pa.Schema, defaults: dict | None = None):
    """conform through its general path (a read-only mapping is not a plain dict)."""
    return conform(MappingProxyType(data), target, defaults)


def same(a: tuple[pa.Table | None, list], b: tuple[pa.Table | None, list]) -> bool:
    if a[0] is None or b[0] is None:
        return a[0] is b[0] and [str(p) for p in a[1]] == [str(p) for p in b[1]]
    return a[0].equals(b[0], check_metadata=True) and a[1] == b[1]


@pytest.mark.parametrize(("data", "target"), [
    (GROUPS, GROUPS_INPUT),
    ({**GROUPS, "prompt_id": [7, None, 9]}, GROUPS_INPUT),
    ({k: v for k, v in GROUPS.items() if k != "n"}, GROUPS_INPUT),
    ({"partition": ["train", "val"], "uid": ["a", "b"], "status": ["finished", "failure"]},
     STATUS_INPUT),
])
def test_a_dict_of_plain_lists_conforms_to_the_table_the_general_path_builds(
        data: dict, target: pa.Schema) -> None:
    assert plain_python(data, target, None) is not None
    assert same(conform(data, target), general(data, target))
    # the lists registration and status updates read are the general path's table's values
    n, cols = plain_lists(data, target, None)
    table, _ = general(data, target)
    assert n == table.num_rows
    for f in target:
        col = table.column(f.name)
        assert cols[f.name] == (None if col.null_count == n else col.to_pylist()), f.name


@pytest.mark.parametrize("change", [
    {"global_steps": [1.0, 1, 2]},          # a float where an int belongs
    {"global_steps": [True, 1, 2]},         # a bool is not an int here
    {"global_steps": [1, None, 2]},         # null in a required column
    {"n": [2 ** 40, 1, 1]},                 # out of int32's range
    {"n": [None, 2 ** 31, None]},           # out of range beside nulls
    {"global_steps": [1, 2 ** 63, 2]},      # out of int64's range
    {"uid": ["a", 1, "c"]},                 # an int where a string belongs
    {"typo": [1, 2, 3]},                    # an unknown column
    {"uid": ["a", "b"]},                    # columns of different lengths
    {"partition": "train"},                 # a scalar, not a list
])
def test_inputs_the_fast_path_declines_get_the_general_paths_problems(change: dict) -> None:
    data = {**GROUPS, **change}
    assert plain_python(data, GROUPS_INPUT, None) is None
    assert plain_lists(data, GROUPS_INPUT, None) is None
    assert same(conform(data, GROUPS_INPUT), general(data, GROUPS_INPUT))


def test_a_missing_required_column_is_left_to_the_general_path() -> None:
    data = {k: v for k, v in GROUPS.items() if k != "global_steps"}
    assert plain_python(data, GROUPS_INPUT, None) is None
    table, problems = conform(data, GROUPS_INPUT)
    assert table is None and [p.column for p in problems] == ["global_steps"]


def test_defaults_fill_an_absent_column_as_the_general_path_does() -> None:
    rows = [traj("g", s) for s in range(2)]
    data = {k: [r[k] for r in rows] for k in rows[0] if k != "index"}
    defaults = {"index": 0, "is_padding": False, "versions_inferred": False}
    assert same(conform(data, TRAJECTORIES_INPUT, defaults),
                general(data, TRAJECTORIES_INPUT, defaults))


def _synthetic(n_groups: int, seed: int = 0, **kw: Any) -> pa.Table:
    rng = np.random.default_rng(seed)
    uids = [f"s{seed}_{i}" for i in range(n_groups)]
    return trajectories("train", uids, 4, version=0, rewards=rng.integers(0, 2, 4 * n_groups) * 1.0,
                        prompt_len=(2, 8), response_len=(1, 16), rng=rng, **kw)


def test_stamped_rows_are_the_lake_schema_whichever_path_builds_them() -> None:
    table = conform(_synthetic(2), TRAJECTORIES_INPUT)[0]
    rows = table.set_column(table.schema.get_field_index("n_response_tokens"),
                            LAKE_TABLES["trajectories"].field("n_response_tokens"),
                            [pa.array(np.arange(table.num_rows, dtype=np.int64))])
    fast = Journal(None, 10).record("trajectories", rows)
    shuffled = rows.select(list(reversed(rows.column_names)))   # not in order: assembled by name
    slow = Journal(None, 10).record("trajectories", shuffled)
    assert fast.schema.equals(LAKE_TABLES["trajectories"], check_metadata=True)
    assert fast.drop_columns(["ts"]).equals(slow.drop_columns(["ts"]), check_metadata=True)
    assert fast.column("seq").to_pylist() == list(range(10, 10 + rows.num_rows))


def test_live_bytes_count_the_chunks_held_even_those_never_measured_before_release() -> None:
    rows = TrajectoryRows()
    chunks = [_synthetic(1, seed) for seed in range(4)]
    ids = [list(rows.append(c)) for c in chunks]
    rows.drop(ids[0])                                   # freed before anyone asked
    assert rows.held_bytes == sum(c.nbytes for c in chunks[1:])
    rows.drop(ids[1][:2])                               # part of a chunk: still held whole
    assert rows.held_bytes == sum(c.nbytes for c in chunks[1:])
    rows.drop(ids[1][2:])
    extra = _synthetic(1, 9)
    rows.append(extra)
    assert rows.held_bytes == sum(c.nbytes for c in chunks[2:]) + extra.nbytes


@pytest.mark.parametrize("metric", [None, "reward", "acc"])
def test_group_aggregates_gathered_at_poll_time_match_the_declared_query_over_the_rows(
        metric: str | None) -> None:
    # no poll runs here, so the refill policy a filter metric needs is never called
    buf = ReplayBuffer.async_(filter_groups_metric=metric, refill_fn=lambda *a: None) \
        if metric else ReplayBuffer.async_()
    sent = []
    for seed in range(3):                               # several chunks, groups spread over them
        t = _synthetic(3, seed)
        info = pa.array([[("acc", float(i % 3))] if i % 5 else [] for i in range(t.num_rows)],
                        TRAJECTORIES_INPUT.field("reward_info").type)
        t = t.set_column(t.schema.get_field_index("reward_info"), "reward_info", info)
        uids = sorted(set(t.column("uid").to_pylist()))
        buf.register(partition="train", uids=uids, global_steps=0)
        half = t.num_rows // 2
        buf.put(t.slice(0, half))
        buf.put(t.slice(half))
        buf.update_status(partition="train", uids=uids, status="finished")
        sent.append(t)
    live = pl.from_arrow(buf.candidates("train")).sort("uid")
    rows = pa.concat_tables(sent)
    values = {None: pa.nulls(rows.num_rows, pa.float64()), "reward": rows.column("reward"),
              "acc": pa.array([dict(m).get("acc") for m in rows.column("reward_info").to_pylist()],
                              pa.float64())}[metric]
    meta = pl.from_arrow(pa.table({
        "partition": rows.column("partition"), "uid": rows.column("uid"), "metric": values,
        "n_response_tokens": pa.array(
            [len(r) for r in rows.column("response_ids").to_pylist()], pa.int64()),
        "min_global_steps": rows.column("min_global_steps"),
        "max_global_steps": rows.column("max_global_steps")}))
    items = declared.compiled_items("group_aggregates")
    want = meta.group_by("partition", "uid").agg(e.alias(k) for k, e in items.items()).sort("uid")
    assert live.select(want.columns).equals(want)
    buf.close()


def test_a_group_records_rows_and_keys_alike_whether_they_arrive_in_order_or_not() -> None:
    from pipeline.state.partition import Group
    order = [(10, 0, 0), (11, 1, 0), (12, 2, 0), (40, 3, 0), (13, 3, 1)] + \
        [(100 + k, k, 5) for k in range(40)]                 # past the tuple size: a set
    g = Group("u", 0, None)
    for row, s, x in order:
        g.add(row, s, x)
    assert list(g.rows) == [r for r, _, _ in order]
    assert set(g.keys) == {(s, x) for _, s, x in order} and len(g.keys) == len(order)
    assert g.sessions == {s for _, s, _ in order}
    assert all((s, x) in g.keys for _, s, x in order)
    contiguous = Group("v", 0, 4)
    for row in range(7, 11):
        contiguous.add(row, row - 7, 0)
    assert contiguous.rows == range(7, 11) and sorted(contiguous.keys) == [(s, 0) for s in range(4)]


def test_the_oldest_in_flight_step_survives_settled_groups_leaving_the_heap() -> None:
    from pipeline.state.partition import PartitionState
    part = PartitionState("train", None)
    for i in range(3000):
        part.apply_registered(f"g{i}", i // 500, None)
    for i in range(2900):                          # settle the oldest: the heap is rebuilt
        part.apply_status(f"g{i}", "failure", i)
    assert part.oldest_inflight() == 2900 // 500
    part.apply_reissued("g2950", 9)                # a re-issued group moves to its new step
    for i in range(2900, 3000):
        if i != 2950:
            part.apply_status(f"g{i}", "finished", i)
    assert part.oldest_inflight() == 9
    part.apply_status("g2950", "finished", 3000)
    assert part.oldest_inflight() is None
