"""Columns of one repeated value, made once and remembered.

A poll and a batch repeat the same values at the same row counts call after call: the decision
rows' partition, kind and poll, a batch's step and `times_sampled`, a status every group shares,
the rule frame's parameters and step. An Arrow array is immutable, so one array can serve them
all, and building it is an Arrow call that costs more inside a `sample` (between other work, its
code out of the caches) than such a column is worth.

What is remembered is bounded: columns of at most `MAX_ROWS` rows (a larger one is built each
time), at most `MAX_ENTRIES` of them (all forgotten when full: a value that never repeats, such
as a call id, ages out). They are allocated by the system allocator, apart from Arrow's default
pool that holds the payload, so that the pool's bytes after every batch is released are the
payload's alone (what `replaylake dev bench memory` reports), and they never pin an arena of it.
"""
from __future__ import annotations

import math
from typing import Any

import pyarrow as pa

MAX_ROWS = 1024
MAX_ENTRIES = 256
_POOL = pa.system_memory_pool()
_STRING = pa.string()
_made: dict[tuple, pa.Array] = {}


def constant(value: Any, n: int, typ: pa.DataType | None = None) -> pa.Array:
    """``n`` rows of ``value`` (None: null) of type ``typ``, or of the type Arrow infers for the
    value when ``typ`` is None (a Python int is int64, a str a string). The value's Python type
    is part of the key: True and 1 are equal keys but not equal columns; so is a float's sign:
    0.0 and -0.0 are equal too."""
    if n > MAX_ROWS:
        return _make(value, n, typ, None)
    key = (typ, type(value), value, n, math.copysign(1.0, value)) if type(value) is float else \
        (typ, type(value), value, n)
    try:
        got = _made.get(key)
    except TypeError:                      # a value that cannot be a key
        return _make(value, n, typ, None)
    if got is None:
        if len(_made) >= MAX_ENTRIES:
            _made.clear()
        got = _made[key] = _make(value, n, typ, _POOL)
    return got


def empty_lists(n: int, value_type: pa.DataType) -> pa.Array:
    """``n`` empty lists of ``value_type`` (token columns sent without their tokens); their
    offsets are a remembered column."""
    return pa.ListArray.from_arrays(constant(0, n + 1, pa.int32()), pa.array([], value_type))


def _make(value: Any, n: int, typ: pa.DataType | None, pool: pa.MemoryPool | None) -> pa.Array:
    if value is None:
        return pa.nulls(n, typ or pa.null(), memory_pool=pool)
    if typ is None or typ == _STRING:     # a string from a list: cheaper than repeating it
        return pa.array([value] * n, typ, memory_pool=pool)
    return pa.repeat(pa.scalar(value, typ), n, memory_pool=pool)
