"""The packed layout's path for batches without null lists (pipeline/to_torch/packed.py): the same
tensors as the naive path, and every other batch left to the general path with its errors."""
from __future__ import annotations

from unittest import mock

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.to_torch import packed as to_torch_packed
from pipeline.to_torch import rows as to_torch_rows
from pipeline.to_torch.convert import BatchFormatError, batch_to_torch
from tests.support.torch_reference import (
    assert_same_tensors,
    batch_table,
    drawn_shape,
    naive_to_torch,
    rechunk,
    row,
)
from tests.support.writer_paths import both_writers  # noqa: F401  (autouse: both writers)


@st.composite
def full_rows(draw: st.DrawFn, min_rows: int = 1, max_rows: int = 10) -> list[dict]:
    """Rows whose mask and log-probs are all present (empty prompts and responses included)."""
    rows = []
    for _ in range(draw(st.integers(min_rows, max_rows))):
        p, r = draw(st.integers(0, 6)), draw(st.integers(0, 6))
        ids = st.lists(st.integers(-2**31, 2**31 - 1), min_size=p, max_size=p)
        rows.append(row(draw(ids), draw(st.lists(st.integers(0, 2**31 - 1), min_size=r,
                                                 max_size=r)),
                        draw(st.lists(st.integers(0, 1), min_size=r, max_size=r)),
                        draw(st.lists(st.floats(-20, 0, width=32), min_size=r, max_size=r)),
                        reward=draw(st.floats(-1, 1)), gs=draw(st.integers(0, 9))))
    return rows


def _shifted(table: pa.Table, name: str, extra: int) -> pa.Table:
    """``name`` re-read as a slice of a longer column (its offsets no longer start at 0, unlike
    the response ids'), chunked like the table."""
    col = table.column(name).combine_chunks()
    padded = pa.concat_arrays([pa.array([[0] * extra], col.type), col])
    cuts = np.cumsum([0, *(len(c) for c in table.column(0).chunks)]).tolist()
    pieces = [padded.slice(1 + a, b - a) for a, b in zip(cuts, cuts[1:])]
    return table.set_column(table.column_names.index(name), name,
                            pa.chunked_array(pieces, col.type))


@st.composite
def full_tables(draw: st.DrawFn) -> pa.Table:
    rows = draw(full_rows())
    table = drawn_shape(draw, batch_table(rows), full_rows(0, 3),
                        st.lists(st.integers(1, len(rows) - 1), max_size=4)
                        if len(rows) > 1 else st.just([]))
    for name in draw(st.sets(st.sampled_from(["response_mask", "rollout_log_probs"]))):
        table = _shifted(table, name, draw(st.integers(1, 3)))
    return table


@given(table=full_tables())
def test_batches_without_null_lists_take_this_path_and_match_the_naive_one(table: pa.Table
                                                                           ) -> None:
    assert to_torch_packed.read(table) is not None
    with mock.patch.object(to_torch_rows, "ROW_COPY_MIN_TOKENS", 0):
        ours = batch_to_torch(table, layout="packed")
    assert_same_tensors(ours, naive_to_torch(table, "packed"))


def test_long_rows_of_a_sampled_shape_take_this_path() -> None:
    rng = np.random.default_rng(5)
    rows = [row(rng.integers(0, 150_000, int(rng.integers(100, 300))).tolist(),
                (resp := rng.integers(0, 150_000, int(rng.integers(300, 900))).tolist()),
                rng.integers(0, 2, len(resp)).tolist(), (-rng.random(len(resp))).tolist())
            for _ in range(40)]
    table = rechunk(batch_table(rows), list(range(16, 40, 16)))
    calls = []
    real = to_torch_packed.write
    with mock.patch.object(to_torch_packed, "write", lambda *a: calls.append(1) or real(*a)):
        ours = batch_to_torch(table, layout="packed")
    assert calls == [1]
    assert_same_tensors(ours, naive_to_torch(table, "packed"))


def test_templates_grow_for_longer_rows_and_stay_read_only() -> None:
    short = batch_table([row([1] * 5, [2] * 7, [1] * 7, [-1.0] * 7)])
    long = batch_table([row([3] * 9000, [4] * 5000, [0] * 5000, [-2.0] * 5000),
                        row([6], [7], [1], [-3.0])])
    for table in (short, long, short):
        with mock.patch.object(to_torch_rows, "ROW_COPY_MIN_TOKENS", 0):
            assert_same_tensors(batch_to_torch(table, layout="packed"),
                                naive_to_torch(table, "packed"))
    for kind, length in (("positions", 14_000), ("zeros8", 9000)):
        kept = to_torch_packed.template(kind, length)
        assert len(kept) >= length and not kept.flags.writeable
        assert not kept[:length].any() if kind != "positions" else \
            kept[:length].tolist() == list(range(length))


def _other_chunks(table: pa.Table) -> pa.Table:
    """The response mask cut into other chunks than the rest of the table."""
    col = table.column("response_mask").combine_chunks()
    return table.set_column(2, "response_mask", pa.chunked_array([col.slice(0, 1),
                                                                  col.slice(1)]))


def _large_list(table: pa.Table) -> pa.Table:
    return table.set_column(0, "prompt_ids", table.column(0).cast(pa.large_list(pa.int32())))


def _child_validity(table: pa.Table) -> pa.Table:
    """A null item outside the table's rows: the child carries a validity buffer."""
    whole = pa.array([[1, None], [1, 2], [3], [4, 5, 6]], pa.list_(pa.int32())).slice(1)
    return table.set_column(0, "prompt_ids", whole)


@pytest.mark.parametrize("change", [_other_chunks, _large_list, _child_validity])
def test_other_batches_go_to_the_general_path_with_the_same_tensors(change) -> None:
    table = change(rechunk(batch_table([row([1, 2], [3, 4], [1, 0], [-1.0, -2.0]),
                                        row([5], [6, 7, 8], [0, 1, 1], [-0.5, -1.5, -2.5]),
                                        row([9, 10, 11], [12], [1], [-3.0])]), [2]))
    assert to_torch_packed.read(table) is None
    with mock.patch.object(to_torch_rows, "ROW_COPY_MIN_TOKENS", 0):
        assert_same_tensors(batch_to_torch(table, layout="packed"),
                            naive_to_torch(table, "packed"))


def test_empty_chunks_are_skipped() -> None:
    table = batch_table([row([1, 2], [3, 4], [1, 0], [-1.0, -2.0]), row([5], [6], [1], [-0.5])])
    table = pa.concat_tables([table.slice(0, 0), table.slice(0, 1), table.slice(1, 0),
                              table.slice(1)])
    assert to_torch_packed.read(table) is not None
    with mock.patch.object(to_torch_rows, "ROW_COPY_MIN_TOKENS", 0):
        assert_same_tensors(batch_to_torch(table, layout="packed"),
                            naive_to_torch(table, "packed"))


def test_a_response_aligned_column_of_other_lengths_is_refused_as_before() -> None:
    table = batch_table([row([1], [2, 3], [1, 1], [-1.0, -2.0]), row([4], [5], [1], [-1.0])])
    bad = table.set_column(3, "rollout_log_probs",
                           pa.array([[-1.0], [-1.0, -2.0]], pa.list_(pa.float32())))
    assert to_torch_packed.read(bad) is None
    with mock.patch.object(to_torch_rows, "ROW_COPY_MIN_TOKENS", 0), \
            pytest.raises(BatchFormatError, match=r"'rollout_log_probs': length differs from "
                                                  r"response_ids in rows \[0, 1\]"):
        batch_to_torch(bad, layout="packed")


def test_a_null_reward_is_refused_after_this_path_read_the_lists() -> None:
    table = batch_table([row([1], [2], [1], [-1.0], reward=0.5), row([3], [4], [0], [-2.0])])
    bad = table.set_column(4, "reward", pa.array([None, 1.0], pa.float64()))
    assert to_torch_packed.read(bad) is not None
    with mock.patch.object(to_torch_rows, "ROW_COPY_MIN_TOKENS", 0), \
            pytest.raises(BatchFormatError, match=r"'reward' is null in rows \[0\]"):
        batch_to_torch(bad, layout="packed")
