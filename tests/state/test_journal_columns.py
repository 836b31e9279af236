"""Rows given by column (the decision log's path) equal the same rows given as dicts, and a
parameter expression compiled with its values written in equals the declared one."""
from __future__ import annotations

import polars as pl
import pyarrow as pa
import pytest

from pipeline.decide import compile as declared
from pipeline.errors import InvariantError
from pipeline.state.journal import by_column
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
