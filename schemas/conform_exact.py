"""What conform refuses, or converts by hand, because pyarrow alone would take it with a loss.

- Python values of a kind a column must not take, though pyarrow converts them without a word:
  a bool as a number (`[0.5, True]` infers double), a float as an integer (pyarrow infers int64
  for `[0, np.float16(1.5)]` and truncates; `pa.array([1.5], type=pa.int32())` gives 1).
- A float64 value beyond float32's range, which Arrow's safe cast to float32 makes infinite.
- A list_view column, which Arrow's cast to a list turns into an invalid array.
- A map holding a key twice (DuckDB cannot read such a map, and a map lookup sees one value only).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import chain
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# python value kinds a column kind refuses although pyarrow would convert them
_LOSSY = {"int": ("bool", "float"), "float": ("bool",)}
_PY_KINDS: dict[type, str] = {}


def value_kind(t: pa.DataType) -> str:
    """A column type's kind: int, float, str, bool, list, struct, map, ts, or the type itself
    (read by type id after the first time: conform asks a few dozen times a call)."""
    kind = _KINDS.get(t.id)
    if kind is None:
        kind = _value_kind(t)
        if kind in ("int", "float", "str", "bool", "list", "struct", "map", "ts"):
            _KINDS[t.id] = kind
    return kind


_KINDS: dict[int, str] = {}


def _value_kind(t: pa.DataType) -> str:
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "str"
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t) \
            or is_list_view(t):
        return "list"
    if pa.types.is_struct(t):
        return "struct"
    if pa.types.is_map(t):
        return "map"
    if pa.types.is_timestamp(t):
        return "ts"
    return str(t)


def is_list_view(t: pa.DataType) -> bool:
    return pa.types.is_list_view(t) or pa.types.is_large_list_view(t)


def _py_kind(t: type) -> str:
    """The kind of a python value's type: bool, int or float (numpy scalars too), else other."""
    kind = _PY_KINDS.get(t)
    if kind is None:
        kind = ("bool" if issubclass(t, (bool, np.bool_)) else
                "int" if issubclass(t, (int, np.integer)) else
                "float" if issubclass(t, (float, np.floating)) else "other")
        _PY_KINDS[t] = kind
    return kind


def _map_values(v: Any) -> Iterable:
    """The values of one python map: a dict's, or the second items of a list of pairs."""
    if isinstance(v, Mapping):
        return v.values()
    if type(v) in (list, tuple):
        return [p[1] for p in v if type(p) in (list, tuple) and len(p) == 2]
    return ()


def _not_only_ints(lists: list) -> list:
    """The python lists that may hold something else than python ints (or bools, which pyarrow
    refuses among ints itself): a list of python ints only has a python int for its sum, which
    tells a token list at C speed, about 4x faster than reading the type of every item."""
    try:
        return [v for v in lists if type(sum(v)) is not int]
    except (TypeError, ValueError, OverflowError):    # e.g. a None or a str among the items
        return lists


def odd_types(values: Iterable, target: pa.DataType, *, float_items: bool = False,
              types: set[type] | None = None) -> set[type]:
    """The python types among ``values`` (and the items, map values and struct fields inside
    them) whose values ``target`` must refuse although pyarrow would convert them. One pass of
    ``type()`` over the leaves, in C: a few nanoseconds a value. The float items of lists are
    read only with ``float_items`` (`hidden_bools` picks the rows that need it). ``types``: the
    types of ``values``, when the caller has them."""
    kind = value_kind(target)
    lossy = _LOSSY.get(kind)
    if lossy:
        return {t for t in (set(map(type, values)) if types is None else types)
                if _py_kind(t) in lossy}
    if kind == "list":
        item = target.value_type
        lists = [v for v in values if type(v) in (list, tuple)]
        if value_kind(item) == "int":
            lists = _not_only_ints(lists)
        elif value_kind(item) == "float" and not float_items:
            return set()
        return odd_types(chain.from_iterable(lists), item, float_items=float_items)
    if kind == "map":
        return odd_types(chain.from_iterable(map(_map_values, values)), target.item_type)
    if kind == "struct":
        dicts = [v for v in values if isinstance(v, Mapping)]
        return set().union(*(odd_types([d.get(f.name) for d in dicts], f.type) for f in target))
    return set()


def odd_rows(values: list, target: pa.DataType, rows: Iterable[int] | None = None
             ) -> tuple[int, ...]:
    """The rows (of ``rows``, else all) holding a value of an odd type (see `odd_types`)."""
    rows = range(len(values)) if rows is None else rows
    return tuple(i for i in rows if odd_types([values[i]], target, float_items=True))


def hidden_bools(values: list, col: pa.Array) -> tuple[set[type], tuple[int, ...]]:
    """Python bools among the float items of a list column (pyarrow infers double for
    `[-0.5, False]`): the bool types found and their rows. Only the rows whose converted items
    hold a 0.0 or a 1.0, what a bool becomes, have their items' types read; finding those is
    one numpy comparison over the items."""
    if value_kind(col.type) != "list" or value_kind(col.type.value_type) != "float":
        return set(), ()
    items = pc.list_flatten(col).to_numpy(zero_copy_only=False)
    marked = (items == 0) | (items == 1)
    if not marked.any():
        return set(), ()
    rows = np.unique(pc.list_parent_indices(col).to_numpy()[marked]).tolist()
    odd = odd_types([values[i] for i in rows], col.type, float_items=True)
    return odd, (odd_rows(values, col.type, rows) if odd else ())


def odd_message(odd: set[type], target: pa.DataType) -> str:
    """Why values of the types ``odd`` are refused in a column of type ``target``."""
    names = ", ".join(sorted(t.__name__ if t.__module__ == "builtins" else
                             f"{t.__module__}.{t.__name__}" for t in odd))
    kinds = {_py_kind(t) for t in odd}
    why = []
    if "bool" in kinds:
        why.append("a bool (True/False) is not taken as a number: send the number it stands for")
    if "float" in kinds:
        why.append("a float is never taken as an integer, not even a whole one (it would be "
                   "truncated): send ints")
    return f"holds {names} value(s) where {target} belongs: {'; '.join(why)}"


def list_view_as_list(arr: pa.Array) -> pa.Array:
    """A list_view array as the large_list of the same values, row by row (Arrow's own cast to a
    list builds an invalid array; views may overlap or come in any order)."""
    lengths = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False)
    offsets = np.zeros(len(arr) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    mask = pc.is_null(arr) if arr.null_count else None
    return pa.LargeListArray.from_arrays(pa.array(offsets), pc.list_flatten(arr), mask=mask)


def _infinities_per_row(arr: pa.Array) -> np.ndarray:
    if value_kind(arr.type) != "list":
        return pc.fill_null(pc.is_inf(arr), False).to_numpy(zero_copy_only=False).astype(np.int64)
    inf = pc.fill_null(pc.is_inf(pc.list_flatten(arr)), False).to_numpy(zero_copy_only=False)
    parents = pc.list_parent_indices(arr).to_numpy()
    return np.bincount(parents[inf], minlength=len(arr))


def overflow_rows(src: pa.Array, out: pa.Array) -> tuple[int, ...]:
    """Rows where the cast of ``src`` to float32 (or a list of it), ``out``, made a finite
    number infinite: beyond float32's range (about ±3.4e38), which a safe cast does not refuse.
    One numpy pass over the cast values unless one is infinite."""
    nested = value_kind(out.type) == "list"
    if not pa.types.is_float32(out.type.value_type if nested else out.type):
        return ()
    items = (pc.list_flatten(out) if nested else out).to_numpy(zero_copy_only=False)
    if not np.isinf(items).any():
        return ()
    return tuple(np.flatnonzero(_infinities_per_row(out) > _infinities_per_row(src)).tolist())


def struct_duplicate_fields(t: pa.DataType) -> list[str]:
    """Field names a struct type has more than once (it would become a map holding a key
    twice)."""
    names = [f.name for f in t]
    return sorted({n for n in names if names.count(n) > 1})


def _some_key_twice(keys: pa.Array, lengths: np.ndarray) -> bool:
    """Whether a row holds a key twice: ``keys`` are the rows' keys one row after the other,
    ``lengths`` how many each row has. With at most 64 distinct keys (reward metrics), each
    row's keys as the bits of a number: a row has a key twice when its bits are fewer than its
    keys; else one hash count of (row, key) codes."""
    codes = pc.dictionary_encode(keys)
    index = codes.indices.to_numpy()
    if len(codes.dictionary) <= 64:
        bits = np.left_shift(np.uint64(1), index.astype(np.uint64))
        filled = lengths[lengths > 0]
        ors = np.bitwise_or.reduceat(bits, np.cumsum(filled) - filled)
        return bool((np.bitwise_count(ors) != filled).any())
    rows = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    pair = rows * len(codes.dictionary) + index
    return pc.count_distinct(pa.array(pair)).as_py() != len(pair)


def repeated_keys(col: pa.Array) -> dict[str, tuple[int, ...]]:
    """The keys a map column holds twice or more within one row, each with those rows. On a
    column without such a row it costs the list lengths and, when some row has two keys or more,
    a dictionary encoding of the keys and a few numpy passes (`_some_key_twice`)."""
    if col.null_count == len(col):
        return {}
    t = col.type
    entries = col.cast(pa.list_(pa.struct([t.key_field, t.item_field])))
    lengths = pc.fill_null(pc.list_value_length(entries), 0).to_numpy(zero_copy_only=False)
    keys = pc.list_flatten(entries).field(0)
    if lengths.max() < 2 or not _some_key_twice(keys, lengths):
        return {}
    rows = pc.list_parent_indices(entries)
    counts = pa.table({"row": rows, "key": keys}).group_by(["row", "key"]).aggregate(
        [([], "count_all")])
    counts = counts.filter(pc.greater(counts["count_all"], 1)).sort_by([("key", "ascending"),
                                                                       ("row", "ascending")])
    out: dict[str, list[int]] = {}
    for row, key in zip(counts["row"].to_pylist(), counts["key"].to_pylist()):
        out.setdefault(key, []).append(row)
    return {k: tuple(v) for k, v in out.items()}
