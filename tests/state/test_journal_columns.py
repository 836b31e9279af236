"""Rows given by column (the decision log's path) equal the same rows given as dicts, memory
applies them as the lake would read them back, and a parameter expression compiled with its
values written in equals the declared one."""
from __future__ import annotations

import polars as pl
import pyarrow as pa
import pytest

from pipeline.decide import compile as declared
from pipeline.errors import InvariantError
from pipeline.state.journal import Columns, Journal, by_column, column_values, value_at
from sql.loader import SqlError


def test_by_column_equals_the_same_rows_built_from_dicts() -> None:
    got = by_column("decisions", 3, {
        "partition": "train", "step": 7, "call_id": 2, "poll": 1, "kind": "evict",
        "uid": ["a", "b", "c"], "reason": ["stale", "failure", "stale"],
        "group_span": [5, 6, 7], "value": [None, 1.0, None], "count": 1})
    rows = [{"partition": "train", "step": 7, "call_id": 2, "poll": 1, "kind": "evict",
             "uid": u, "reason": r, "group_span": s, "value": v, "count": 1}
            for u, r, s, v in zip("abc", ["stale", "failure", "stale"], [5, 6, 7],
                                  [None, 1.0, None])]
    expected = pa.Table.from_pylist(rows, schema=got.schema)
    assert got.equals(expected)
    assert got.column("batch_id").null_count == 3          # not named: null
    assert got.column("replaces").null_count == 3
    assert got.schema.field("step").type == pa.int64()
    assert got.schema.field("poll").type == pa.int32()


def test_by_column_rejects_an_unknown_column_and_a_wrong_length() -> None:
    with pytest.raises(InvariantError, match="no column"):
        by_column("decisions", 1, {"uidd": ["a"]})
    with pytest.raises(InvariantError, match="2 values for 3 rows"):
        by_column("decisions", 3, {"uid": ["a", "b"]})


def _evictions() -> Columns:
    return Columns("decisions", 3, {
        "partition": "train", "step": 7, "call_id": 2, "poll": 1, "kind": "evict",
        "uid": ["a", "b", "c"], "reason": ["stale", "failure", "stale"],
        "group_span": [5, 6, 7], "value": [None, 1.0, None], "count": 1})


def test_columns_read_as_the_arrow_rows_they_make() -> None:
    """Every column, every value and every slice of `Columns` reads as the same of its Arrow
    rows (what memory applies live equals what a restore applies from the lake)."""
    cols = _evictions()
    table = cols.arrow()
    for name in table.column_names:
        assert column_values(cols, name) == column_values(table, name), name
        for i in range(3):
            assert value_at(cols, name, i) == value_at(table, name, i), (name, i)
    part = cols.slice(1, 5)
    assert part.num_rows == 2 and part.arrow().equals(table.slice(1, 5))
    both = Columns.concat([cols, Columns("decisions", 1, {
        "partition": "train", "step": 8, "call_id": 3, "poll": 0, "kind": "refill",
        "count": 2, "replaces": [["a", "b"]]})])
    assert both.arrow().equals(pa.concat_tables([table, both.slice(3, 1).arrow()]))
    assert column_values(both, "replaces") == [None, None, None, ["a", "b"]]


def test_columns_are_checked_when_made() -> None:
    with pytest.raises(InvariantError, match="no column"):
        Columns("decisions", 1, {"uidd": ["a"]})
    with pytest.raises(InvariantError, match="2 values for 3 rows"):
        Columns("decisions", 3, {"uid": ["a", "b"]})


def test_recorded_columns_take_their_seq_numbers_and_reach_the_lake_whole(tmp_path) -> None:
    """Without a lake the rows only take their seq numbers; with one they are written as the
    Arrow rows they make, stamped with those very numbers."""
    from pipeline.lake import LakeWriter, read_table
    alone = Journal(None, next_seq=10)
    got = alone.record_columns(_evictions())
    assert column_values(got, "seq") == [10, 11, 12] and alone.next_seq == 13
    writer = LakeWriter(tmp_path / "lake")
    try:
        lake = Journal(writer, next_seq=5)
        got = lake.record_columns(_evictions())
    finally:
        writer.close()
    assert column_values(got, "seq") == [5, 6, 7] and lake.next_seq == 8
    back = read_table(tmp_path / "lake", "decisions")
    assert back.column("seq").to_pylist() == [5, 6, 7]
    made = _evictions().arrow()
    assert back.select(made.column_names).to_pylist() == made.to_pylist()


@pytest.mark.parametrize("text,params,expected", [
    ("$step - $threshold + 1", {"step": 100, "threshold": 4}, 97),
    ("$step - $threshold + 1", {"step": 0, "threshold": 0}, 1),
    ("$x * 2.5", {"x": 2.0}, 5.0),
    ("case when $flag then 1 else 0 end", {"flag": True}, 1),
    ("case when $flag then 1 else 0 end", {"flag": False}, 0),
    ("$name = 'it''s'", {"name": "it's"}, True),
    ("$missing is null", {"missing": None}, True),
])
def test_bound_evaluation_equals_the_parameter_columns_way(text: str, params: dict,
                                                          expected: object) -> None:
    got = declared.evaluate_bound(text, params)
    frame = pl.DataFrame([pl.Series(declared.param_column(k), [v]) for k, v in params.items()])
    assert got == expected
    if None not in params.values():    # a null-only column has no type to compute with
        assert frame.select(declared.to_polars(text)).item() == got


def test_bound_evaluation_names_a_value_it_cannot_write() -> None:
    with pytest.raises(SqlError, match=r"parameter value \[1\]"):
        declared.evaluate_bound("$x + 1", {"x": [1]})
