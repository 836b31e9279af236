"""Stamps rows with arrival sequence numbers and time, and writes them to the lake (if any).

Rows come as an Arrow table, as a few Python dicts (`Journal.record_rows`), or as `Columns`: a
poll writes its decisions as a few dozen rows that share most of their values (partition, step,
call, poll, kind, batch), held as one Python list per varying column and one value per shared one.
Those become Arrow (`by_column`: one array per varying column, a remembered constant per shared
one) only when a lake writes them; memory applies the Python values as they are, so a buffer
without a lake never builds them, and one with a lake never reads them back out of Arrow.
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.errors import InvariantError
from pipeline.lake import LakeWriter
from pipeline.state.constants import constant
from schemas import LAKE_TABLES

_HISTORY_ONLY = ("metrics",)


def _stamp(rows: pa.Table, table: str, seq: pa.Array, now: pa.Array) -> pa.Table:
    """``rows`` with their seq and ts columns, as a table of the lake table's schema.

    Rows that already have the schema's fields in order (what validation hands a `put`) get the
    two columns appended and the schema's field docs re-attached through record batches: no
    per-column lookup or validation, which were a fifth of a small `put`. Rows whose columns are
    in order take them all at once (no lookup by name per column); anything else is
    assembled column by column, by name."""
    schema, head = LAKE_TABLES[table], _HEADS[table]
    if head is not None and rows.schema.equals(head):
        body = rows.append_column(schema.field("seq"), seq).append_column(schema.field("ts"), now)
        return pa.Table.from_batches(body.to_batches(), schema=schema)
    if head is not None and rows.schema.names == head.names:   # e.g. nullable where required
        return pa.Table.from_arrays(rows.columns + [seq, now], schema=schema)
    have = set(rows.column_names)
    return pa.Table.from_arrays(
        [seq if f.name == "seq" else now if f.name == "ts" else rows.column(f.name)
         if f.name in have else _absent(f, rows.num_rows) for f in schema], schema=schema)


def _stamped(table: str, rows: pa.Table, first: int, now_us: int) -> pa.Table:
    """``rows`` with seqs ``first``.. and the time ``now_us`` (int64 from numpy, then viewed as
    the timestamp type: no conversion)."""
    n = rows.num_rows
    now = pa.array(np.full(n, now_us, dtype=np.int64)).view(LAKE_TABLES[table].field("ts").type)
    return _stamp(rows, table, pa.array(np.arange(first, first + n, dtype=np.int64)), now)


def _absent(f: pa.Field, n: int) -> pa.Array:
    """A column the rows do not carry: null when the lake table allows it (an optional field)."""
    if not f.nullable:
        raise InvariantError(f"rows for the lake lack the required column {f.name!r}")
    return pa.nulls(n, f.type)


def _unstamped(schema: pa.Schema) -> pa.Schema | None:
    """The schema without its trailing seq and ts fields (None when they are not last)."""
    return pa.schema(list(schema)[:-2]) if schema.names[-2:] == ["seq", "ts"] else None


_HEADS = {name: _unstamped(schema) for name, schema in LAKE_TABLES.items()}
_COLUMNS = {name: [(f.name, f.type) for f in schema if f.name not in ("seq", "ts")]
            for name, schema in LAKE_TABLES.items()}
_NAMES = {name: frozenset(c for c, _ in cols) for name, cols in _COLUMNS.items()}


class Journal:
    """The single source of `seq`: every accepted row and decision gets the next number."""

    def __init__(self, lake: LakeWriter | None, next_seq: int = 0):
        self.lake = lake
        self.next_seq = next_seq

    def record(self, table: str, rows: pa.Table) -> pa.Table:
        """Stamp ``rows`` (the lake schema minus seq/ts), write them durably, return them stamped.

        A failed write raises and changes nothing in memory; its seq numbers are burnt, so rows a
        failed write may have left on disk can never be mistaken for later ones."""
        stamped = _stamped(table, rows, self.next_seq, int(time.time() * 1e6))
        self._write([(table, stamped)])
        return stamped

    def record_many(self, items: list[tuple[str, pa.Table | Columns | list[dict]]]
                    ) -> list[pa.Table | Columns | None]:
        """`record` for one call's rows of several tables, stamped in the order given and
        written as one (`LakeWriter.append_many`: all or none); each returned as `record`,
        `record_columns` or `record_rows` returns it. A failed write burns every seq."""
        if self.lake is None or len(items) == 1:
            return [self._record_one(t, r) for t, r in items]
        for table, rows in items:
            if isinstance(rows, Columns) and rows.table != table:
                raise InvariantError(f"rows of table {rows.table!r} committed to {table!r}")
        at, now_us = self.next_seq, int(time.time() * 1e6)
        out: list[pa.Table | Columns] = []
        written: list[tuple[str, pa.Table]] = []
        for table, rows in items:
            arrow = rows.arrow() if isinstance(rows, Columns) else \
                self._arrow_rows(table, rows) if isinstance(rows, list) else rows
            stamped = _stamped(table, arrow, at, now_us)
            written.append((table, stamped))
            out.append(rows.with_values(seq=list(range(at, at + arrow.num_rows)))
                       if isinstance(rows, Columns) else stamped)
            at += arrow.num_rows
        self._write(written)
        return out

    def _write(self, stamped: list[tuple[str, pa.Table]]) -> None:
        """Write stamped rows (seqs from `next_seq` on) as one, when there is a lake; the seqs are
        taken either way, and burnt when the write fails."""
        n = sum(t.num_rows for _, t in stamped)
        try:
            if self.lake is not None:
                self.lake.append_many(stamped)
        except BaseException:
            self._burn(self.next_seq, self.next_seq + n - 1)
            raise
        finally:
            self.next_seq += n   # even when the write failed: a seq number is never reused

    def _record_one(self, table: str, rows: pa.Table | Columns | list[dict]
                    ) -> pa.Table | Columns | None:
        if isinstance(rows, pa.Table):
            return self.record(table, rows)
        if isinstance(rows, Columns):
            if rows.table != table:
                raise InvariantError(f"rows of table {rows.table!r} committed to {table!r}")
            return self.record_columns(rows)
        return self.record_rows(table, rows)

    def _burn(self, first: int, last: int) -> None:
        """Log a failed write's seqs as never to be written (readers then do not wait for them);
        best effort: the log may fail as the write did, and a restart logs what it finds torn."""
        try:
            self.lake.record_burnt(first, last)
        except Exception:     # noqa: BLE001 - the write's own error is the one to raise
            pass

    def record_columns(self, rows: Columns) -> Columns:
        """`record` for `Columns`: stamped with their seq numbers (and, in the lake, the time),
        written as Arrow when there is a lake; returned as Columns, for memory to apply."""
        n = rows.num_rows
        first = self.next_seq
        if self.lake is not None:
            self.record(rows.table, rows.arrow())
        else:
            self.next_seq += n
        return rows.with_values(seq=list(range(first, first + n)))

    def record_rows(self, table: str, rows: list[dict]) -> pa.Table | None:
        """`record` for a few python rows (decisions, metrics, events). Without a lake, history
        rows (metrics) only take their seq numbers: nothing in memory reads them."""
        if self.lake is None and table in _HISTORY_ONLY:
            self.next_seq += len(rows)
            return None
        return self.record(table, self._arrow_rows(table, rows))

    @staticmethod
    def _arrow_rows(table: str, rows: list[dict]) -> pa.Table:
        # names and types read once per table: `Field.name` is a property that builds a new str
        # on every call, which adds up when read inside the per-row loop
        return pa.table({name: pa.array([r.get(name) for r in rows], type=typ)
                         for name, typ in _COLUMNS[table]})


class Columns:
    """``n`` rows of lake table ``table`` as Python values: each column a list of one value per
    row, or one value (None: null) that every row shares. A column not named is null. Checked
    when made (an unknown column, a list of the wrong length), as `by_column` checks them."""

    __slots__ = ("table", "num_rows", "values")

    def __init__(self, table: str, n: int, values: Mapping[str, Any]):
        _check(table, n, values)
        self.table, self.num_rows, self.values = table, n, dict(values)

    def column(self, name: str) -> list:
        """One column as a list of one value per row."""
        v = self.values.get(name)
        return v if isinstance(v, list) else [v] * self.num_rows

    def at(self, name: str, row: int) -> Any:
        """One row's value of one column."""
        v = self.values.get(name)
        return v[row] if isinstance(v, list) else v

    def slice(self, start: int, length: int) -> Columns:
        """Rows ``start`` to ``start + length`` (as Arrow's `slice`)."""
        end = min(start + length, self.num_rows)
        return Columns(self.table, max(end - start, 0),
                       {k: v[start:end] if isinstance(v, list) else v
                        for k, v in self.values.items()})

    def with_values(self, **values: Any) -> Columns:
        """The same rows with some columns set (seq numbers, by `Journal.record_columns`)."""
        out = Columns.__new__(Columns)
        out.table, out.num_rows = self.table, self.num_rows
        out.values = {**self.values, **values}
        return out

    def arrow(self) -> pa.Table:
        """The rows as an Arrow table of the lake table's columns but seq and ts."""
        return by_column(self.table, self.num_rows, self.values)

    @staticmethod
    def concat(parts: list[Columns]) -> Columns:
        """The rows of ``parts`` (of one table) one after the other."""
        names = dict.fromkeys(k for p in parts for k in p.values)
        return Columns(parts[0].table, sum(p.num_rows for p in parts),
                       {k: [v for p in parts for v in p.column(k)] for k in names})


def column_values(rows: pa.Table | Columns, name: str) -> list:
    """One column of Arrow rows or of `Columns` as a Python list."""
    if isinstance(rows, Columns):
        return rows.column(name)
    col = rows.column(name)
    return [None] * len(col) if col.null_count == len(col) else col.to_pylist()


def value_at(rows: pa.Table | Columns, name: str, row: int) -> Any:
    """One value of Arrow rows or of `Columns`."""
    return rows.at(name, row) if isinstance(rows, Columns) else rows.column(name)[row].as_py()


def _check(table: str, n: int, values: Mapping[str, Any]) -> None:
    unknown = values.keys() - _NAMES[table]
    if unknown:
        raise InvariantError(f"table {table!r} has no column(s) {sorted(unknown)}")
    for name, v in values.items():
        if isinstance(v, list) and len(v) != n:
            raise InvariantError(f"column {name!r}: {len(v)} values for {n} rows")


def by_column(table: str, n: int, values: Mapping[str, Any]) -> pa.Table:
    """``n`` rows of lake table ``table`` (all its columns but seq and ts) from ``values``: a
    Python list holds one value per row, any other value is shared by every row, and a column
    not named (or None) is null. A shared value of a list-typed column is written ``[v] * n``.

    A shared value is a remembered constant column (`pipeline.state.constants`)."""
    _check(table, n, values)
    arrays = []
    for name, typ in _COLUMNS[table]:
        v = values.get(name)
        if isinstance(v, list):
            arrays.append(pa.array(v, typ))
        else:
            arrays.append(constant(v, n, typ))
    return pa.Table.from_arrays(arrays, schema=_HEADS[table])
