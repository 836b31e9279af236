"""Remembered constant columns: right values and types, bounded, and outside the payload's pool."""
from __future__ import annotations

import math

import pyarrow as pa

from pipeline.state import constants
from pipeline.state.constants import MAX_ROWS, constant


def test_a_constant_has_its_value_and_type_and_is_made_once():
    a = constant(7, 5, pa.int64())
    assert a.equals(pa.array([7] * 5, pa.int64()))
    assert constant(7, 5, pa.int64()) is a
    assert constant("train", 3, pa.string()).to_pylist() == ["train"] * 3
    assert constant(None, 4, pa.int64()).equals(pa.nulls(4, pa.int64()))
    # True and 1 are equal keys; the columns are not
    assert constant(True, 2).type == pa.bool_() and constant(1, 2).type == pa.int64()


def test_zero_and_negative_zero_are_different_columns():
    neg = constant(-0.0, 3, pa.float64())
    pos = constant(0.0, 3, pa.float64())
    assert [math.copysign(1.0, v) for v in neg.to_pylist()] == [-1.0] * 3
    assert [math.copysign(1.0, v) for v in pos.to_pylist()] == [1.0] * 3
    assert constant(-0.0, 3, pa.float64()) is neg


def test_large_columns_are_not_remembered_and_none_is_in_the_default_pool():
    big = constant(3, MAX_ROWS + 1, pa.int64())
    assert big.to_pylist() == [3] * (MAX_ROWS + 1)
    assert constant(3, MAX_ROWS + 1, pa.int64()) is not big
    before = pa.total_allocated_bytes()
    kept = [constant(k, 512, pa.int64()) for k in range(1000, 1010)]
    assert pa.total_allocated_bytes() == before     # the system allocator's, not the pool's
    assert all(len(a) == 512 for a in kept)


def test_the_memory_is_bounded_by_its_entries():
    constants._made.clear()
    for k in range(constants.MAX_ENTRIES + 10):
        constant(k, 8, pa.int64())
    assert len(constants._made) <= constants.MAX_ENTRIES
