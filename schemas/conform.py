"""Strict conform/validate: turn producer input into a table of an exact schema, or list every problem.

Accepted inputs: a pyarrow Table or RecordBatch, a polars DataFrame, a list of dicts, or a dict of
columns. Columns are matched by name; unknown columns are problems (a typo must not be silently
dropped). Lossless casts are applied (int64 -> int32 when every value fits, large_string -> string,
a struct of floats -> map, int -> float, a list_view -> list); anything else is a problem naming the
column and rows, including what pyarrow alone would take with a loss (schemas/conform_exact.py: a
bool as a number, a float as an integer, a number beyond float32's range, a map key twice).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from schemas.conform_exact import (
    hidden_bools,
    is_list_view,
    list_view_as_list,
    odd_message,
    odd_rows,
    odd_types,
    overflow_rows,
    repeated_keys,
    struct_duplicate_fields,
)
from schemas.conform_exact import value_kind as _kind
from schemas.conform_fast import already_conformed, plain_python

MAX_ROWS_SHOWN = 5
MAX_KEYS_SHOWN = 5      # repeated map keys named one by one, per column


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
    """Columns by name (pyarrow arrays, or the python values of python input) and row count."""
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
        cols = {k: _Python(v) for k, v in data.items()}
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
        return {k: _Python([r.get(k) for r in data]) for k in names}, len(data)
    raise TypeError(
        f"cannot ingest {type(data).__name__}: pass a pyarrow Table/RecordBatch, a polars "
        "DataFrame, a list of dicts or a dict of columns")


class _Python(list):
    """A column's python values (a dict of columns, a list of dicts), typed per field later."""


def _from_python(name: str, values: list, target: pa.DataType,
                 problems: list[Problem]) -> pa.Array | None:
    """A column of python values as ``target``: refused where a value's own kind is one the
    column must not take (a bool as a number, a float as an integer: pyarrow would convert them
    silently), else inferred and cast losslessly (dicts: typed against the target, a map)."""
    types = set(map(type, values))
    odd = odd_types(values, target, types=types)
    if odd:
        rows = odd_rows(values, target)
        problems.append(Problem(name, rows, odd_message(odd, target)))
        skip = set(rows)          # and what else the other rows hold: every problem at once
        values = [None if i in skip else v for i, v in enumerate(values)]
    if any(issubclass(t, Mapping) for t in types):
        col = _typed_from_python(name, values, target, problems)  # a map, not a struct
    else:
        try:
            col = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
            col = _typed_from_python(name, values, target, problems)
        else:
            col = _cast(name, col, target, problems, values)
    if col is not None and not odd:
        odd, rows = hidden_bools(values, col)
        if odd:
            problems.append(Problem(name, rows, odd_message(odd, target)))
    return None if odd else col


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
          problems: list[Problem], values: list | None = None
          ) -> pa.ChunkedArray | pa.Array | None:
    if col.type == target:
        return col
    if pa.types.is_dictionary(col.type):    # a categorical column: its values, losslessly
        col = col.dictionary_decode()
        if col.type == target:
            return col
    if is_list_view(col.type):             # Arrow's own cast would build an invalid list
        col = list_view_as_list(col)
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
        rows = _mistyped_rows(values, target) if values is not None else ()
        problems.append(Problem(name, rows, f"has type {src}, expected {target}"))
        return None
    try:
        out = pc.cast(col, target, safe=True)
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
    inf = overflow_rows(col, out)
    if inf:
        problems.append(Problem(name, inf, f"a number beyond float32's range (about +-3.4e38) "
                                           f"would become infinite in {target}: send values "
                                           "within it"))
        return None
    return out


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
    twice = struct_duplicate_fields(arr.type)
    if twice:
        problems.append(Problem(name, rows_where(arr.is_valid()), (
            f"struct field(s) {', '.join(map(repr, twice))} appear more than once: a {target} "
            "holds each key once; send one field per key")))
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
        problems = _repeated_key_problems(target, fast.columns)
        return (None, problems) if problems else (fast, [])
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
        elif isinstance(col, _Python):
            columns.append(_from_python(f.name, col, f.type, problems))
        else:
            if isinstance(col, pa.ChunkedArray):
                col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
            columns.append(_cast(f.name, col, f.type, problems))
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
    problems += _repeated_key_problems(target, columns)
    if problems:
        return None, problems
    arrays = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in columns]
    return pa.Table.from_arrays(arrays, schema=target), []


def _repeated_key_problems(target: pa.Schema, columns: list) -> list[Problem]:
    """A map holding a key twice in one row, in any map column: one problem per key (DuckDB
    cannot read such a map, a lookup sees one of its values, and a retry with the pairs in
    another order would differ). Costs the list lengths of each map column that is not all null,
    and when some row has two keys or more a dictionary encoding of the keys and a few numpy
    passes (~0.6 ms for 10,000 rows of 3 keys)."""
    out = []
    for i in _map_columns(target):
        f, col = target.field(i), columns[i]
        if isinstance(col, pa.ChunkedArray):
            col = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
        twice = list(repeated_keys(col).items())
        for key, rows in twice[:MAX_KEYS_SHOWN]:
            out.append(Problem(f.name, rows, f"key {key!r} appears more than once in the map: a "
                                             "map holds each key once; send one value per key"))
        if len(twice) > MAX_KEYS_SHOWN:
            rest = sorted({r for _, rows in twice[MAX_KEYS_SHOWN:] for r in rows})
            out.append(Problem(f.name, tuple(rest), f"{len(twice) - MAX_KEYS_SHOWN} more key(s) "
                                                    "appear more than once in a map"))
    return out


_MAPS: dict[int, tuple[pa.Schema, tuple[int, ...]]] = {}


def _map_columns(target: pa.Schema) -> tuple[int, ...]:
    """The positions of a schema's map columns (kept per schema: a put asks every time)."""
    known = _MAPS.get(id(target))
    if known is None or known[0] is not target:
        if len(_MAPS) > 64:
            _MAPS.clear()
        known = _MAPS[id(target)] = (target, tuple(
            i for i, t in enumerate(target.types) if pa.types.is_map(t)))
    return known[1]
