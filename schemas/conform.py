"""Strict conform/validate: turn producer input into a table of an exact schema, or list every problem.

Accepted inputs: a pyarrow Table or RecordBatch, a polars DataFrame, a list of dicts, or a dict of
columns. Columns are matched by name; unknown columns are problems (a typo must not be silently
dropped). Lossless casts are applied (int64 -> int32 when every value fits, large_string -> string,
a struct of floats -> map, int -> float); anything else is a problem naming the column and rows.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from schemas.conform_fast import already_conformed, plain_python

MAX_ROWS_SHOWN = 5


@dataclass(frozen=True)
class Problem:
    """One reason an input is rejected: the column, the offending rows (0-based), what is wrong,
    and its kind (`invalid`, or `unknown_group` for rows naming a group that is not in flight),
    from which the error type is chosen."""

    column: str
    rows: tuple[int, ...]
    message: str
    kind: str = "invalid"

    def __str__(self) -> str:
        if not self.rows:
            return f"column '{self.column}': {self.message}"
        shown = ", ".join(str(r) for r in self.rows[:MAX_ROWS_SHOWN])
        more = f" (+{len(self.rows) - MAX_ROWS_SHOWN} more)" if len(self.rows) > MAX_ROWS_SHOWN else ""
        word = "row" if len(self.rows) == 1 else "rows"
        return f"column '{self.column}', {word} {shown}{more}: {self.message}"


def rows_where(mask: pa.Array | pa.ChunkedArray) -> tuple[int, ...]:
    """0-based row numbers where a boolean array is true (nulls count as false)."""
    mask = pc.fill_null(mask, False)
    return tuple(pc.indices_nonzero(mask).to_pylist())


def _to_columns(data: Any) -> tuple[dict[str, Any], int]:
    """Columns by name (pyarrow arrays, or python lists pyarrow could not type alone) and row count."""
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    if type(data).__module__.startswith("polars"):
        data = data.to_arrow()
    if isinstance(data, pa.Table):
        return {name: data.column(name) for name in data.column_names}, data.num_rows
    if isinstance(data, Mapping):
        scalar = [k for k, v in data.items()
                  if isinstance(v, (str, bytes)) or not hasattr(v, "__len__")]
        if scalar:
            raise TypeError(
                f"a dict is read as columns (each key maps to a list of values), but "
                f"{scalar[0]!r} holds the single value {data[scalar[0]]!r}: to send one row, wrap "
                "it in a list ([row])")
        cols = {k: _column_from_values(list(v)) for k, v in data.items()}
        lengths = {len(v) for v in cols.values()}
        if len(lengths) > 1:
            raise TypeError(f"columns have different lengths: {sorted(lengths)}")
        return cols, lengths.pop() if lengths else 0
    if isinstance(data, (list, tuple)):
        if not all(isinstance(r, Mapping) for r in data):
            raise TypeError("expected a list of dicts (one per row)")
        names: dict[str, None] = {}
        for r in data:
            names.update(dict.fromkeys(r))
        return {k: _column_from_values([r.get(k) for r in data]) for k in names}, len(data)
    raise TypeError(
        f"cannot ingest {type(data).__name__}: pass a pyarrow Table/RecordBatch, a polars "
        "DataFrame, a list of dicts or a dict of columns")


def _python_values(data: Any, name: str) -> Callable[[], list] | None:
    """For python input (dict of columns, list of dicts): the column's original values, lazily."""
    if isinstance(data, Mapping):
        return lambda: list(data[name])
    if isinstance(data, (list, tuple)):
        return lambda: [r.get(name) for r in data]
    return None


class _Unconvertible(list):
    """Python values pyarrow could not infer one type for; typed per field later."""


def _column_from_values(values: list) -> pa.Array | _Unconvertible:
    if any(isinstance(v, Mapping) for v in values):
        return _Unconvertible(values)  # dicts: infer against the target type (map), not a struct
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        return _Unconvertible(values)


def _typed_from_python(name: str, values: list, target: pa.DataType,
                       problems: list[Problem]) -> pa.Array | None:
    try:
        return pa.array(values, type=target)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        bad = []
        for i, v in enumerate(values):
            try:
                pa.array([v], type=target)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
                bad.append(i)
        problems.append(Problem(name, tuple(bad), f"values are not of type {target}"))
        return None


def _cast(name: str, col: pa.ChunkedArray | pa.Array, target: pa.DataType,
          problems: list[Problem], values: Callable[[], list] | None = None
          ) -> pa.ChunkedArray | pa.Array | None:
    if col.type == target:
        return col
    if pa.types.is_dictionary(col.type):    # a categorical column: its values, losslessly
        col = col.dictionary_decode()
        if col.type == target:
            return col
    src = col.type
    if pa.types.is_null(src):
        return pa.nulls(len(col), target)
    if pa.types.is_map(target) and pa.types.is_struct(src):
        return _struct_to_map(name, col, target, problems)
    extra = _extra_fields(src, target)
    if extra:
        problems.append(Problem(name, (), f"unknown field(s) {', '.join(extra)} inside its "
                                          f"values; expected {target}"))
        return None
    if not _castable(src, target):
        rows = _mistyped_rows(values(), target) if values is not None else ()
        problems.append(Problem(name, rows, f"has type {src}, expected {target}"))
        return None
    try:
        return pc.cast(col, target, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        bad = []
        arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        for i in range(len(arr)):
            try:
                pc.cast(arr.take([i]), target, safe=True)  # a slice of a list keeps all values
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                bad.append(i)
        problems.append(Problem(name, tuple(bad), f"cannot be cast losslessly to {target} ({exc})"))
        return None


def _kind(t: pa.DataType) -> str:
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "str"
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t) \
            or pa.types.is_fixed_size_list(t):
        return "list"
    if pa.types.is_struct(t):
        return "struct"
    if pa.types.is_map(t):
        return "map"
    if pa.types.is_timestamp(t):
        return "ts"
    return str(t)


def _mistyped_rows(values: list, target: pa.DataType) -> tuple[int, ...]:
    """Python input: the rows whose own value has a kind ``target`` cannot take (e.g. 3.5 as a
    token id), so the error names them rather than only the column type pyarrow inferred."""
    bad = []
    for i, v in enumerate(values):
        try:
            ok = v is None or _castable(pa.array([v]).type, target)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
            ok = False
        if not ok:
            bad.append(i)
    return tuple(bad)


def _extra_fields(src: pa.DataType, dst: pa.DataType) -> list[str]:
    """Fields of a struct (or a list's struct items) that the target does not have: refused like
    an unknown column, rather than dropped by the cast."""
    a, b = _kind(src), _kind(dst)
    if a == "list" and b == "list":
        return _extra_fields(src.value_type, dst.value_type)
    if a == "struct" and b == "struct":
        names = {f.name for f in dst}
        return [f.name for f in src if f.name not in names]
    return []


def _castable(src: pa.DataType, dst: pa.DataType) -> bool:
    if pa.types.is_null(src):
        return True  # all-null values, e.g. the items of empty python lists: `[[]]` is list<null>
    a, b = _kind(src), _kind(dst)
    if a == "list" and b == "list":
        return _castable(src.value_type, dst.value_type)
    if a == "struct" and b == "struct":
        names = {f.name for f in src}
        return all(f.name in names and _castable(src.field(f.name).type, f.type) for f in dst)
    if a == "int" and b == "float":
        return True
    return a == b


def _struct_to_map(name: str, col, target: pa.DataType, problems: list[Problem]):
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not all(_kind(f.type) in ("int", "float") for f in arr.type):
        problems.append(Problem(name, (), f"struct fields must be numbers to become {target}"))
        return None
    rows = []
    for v in arr.to_pylist():
        rows.append(None if v is None else [(k, None if x is None else float(x))
                                            for k, x in v.items() if x is not None])
    return pa.array(rows, type=target)


def conform(data: Any, target: pa.Schema,
            defaults: Mapping[str, Any] | None = None) -> tuple[pa.Table | None, list[Problem]]:
    """Conform ``data`` to ``target``; returns ``(table, [])`` or ``(None, problems)``.

    ``defaults`` gives a value for a column that is absent, or null in some rows (e.g.
    ``is_padding=False``: a list of dicts may leave it out of some rows);
    nullable columns that are absent become all-null. Every problem found is reported, not just the
    first, so a producer can fix its whole batch at once.
    """
    fast = already_conformed(data, target, defaults)
    if fast is None:
        fast = plain_python(data, target, defaults)
    if fast is not None:
        return fast, []
    defaults = dict(defaults or {})
    problems: list[Problem] = []
    try:
        given, n = _to_columns(data)
    except TypeError as exc:
        return None, [Problem("*", (), str(exc))]
    if n == 0 and not given:
        return target.empty_table(), []   # `[]` or `{}`: no rows, so nothing can be missing
    known = set(target.names)
    for c in given:
        if c not in known:
            problems.append(Problem(c, (), f"unknown column; expected only {sorted(known)}"))
    columns: list = []
    for f in target:
        col = given.get(f.name)
        if col is None:
            columns.append(None)
        elif isinstance(col, _Unconvertible):
            columns.append(_typed_from_python(f.name, list(col), f.type, problems))
        else:
            if isinstance(col, pa.ChunkedArray):
                col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
            columns.append(_cast(f.name, col, f.type, problems, _python_values(data, f.name)))
    for i, f in enumerate(target):
        if f.name in given:
            continue
        if f.name in defaults:
            columns[i] = pa.array([defaults[f.name]] * n, type=f.type)
        elif f.nullable:
            columns[i] = pa.nulls(n, f.type)
        else:
            problems.append(Problem(f.name, (), "required column is missing"))
    if problems:
        return None, problems
    for i, f in enumerate(target):
        col = columns[i]
        if f.name in defaults and col.null_count:   # a row that left out a defaulted column
            col = columns[i] = pc.fill_null(col, pa.scalar(defaults[f.name], f.type))
        if not f.nullable and col.null_count:
            problems.append(Problem(f.name, rows_where(pc.is_null(col)), "must not be null"))
    if problems:
        return None, problems
    arrays = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in columns]
    return pa.Table.from_arrays(arrays, schema=target), []
