"""Rows written before a lake column existed, brought up to the current lake schema.

Why: a lake outlives the code that wrote it. Columns added later are either nullable (a group's
`prompt_id`, a refill's `replaces`: null means "not recorded") or derivable from the row itself
(`n_response_tokens` is the length of `response_ids`, read from the list offsets without touching
the token values). Every reader that turns stored batches into the lake schema goes through
`upgrade`, so an old lake opens, restores and answers every query like a new one.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from schemas.tables import LAKE_TABLES

DERIVED = {"n_response_tokens": "response_ids"}
"""Columns computed from another column of the same row when a stored row lacks them."""


def _derived(name: str, rows: pa.Table) -> pa.ChunkedArray | None:
    source = DERIVED.get(name)
    if source is None or source not in rows.column_names:
        return None
    return pc.list_value_length(rows.column(source)).cast(pa.int64())


def upgrade(table: str, rows: pa.Table | pa.RecordBatch) -> pa.Table:
    """``rows`` of lake table ``table`` in its current schema: missing derived columns computed,
    missing nullable columns null, the rest cast (as every reader did before)."""
    schema = LAKE_TABLES[table]
    if isinstance(rows, pa.RecordBatch):
        rows = pa.Table.from_batches([rows])
    if rows.schema == schema:
        return rows
    have = set(rows.column_names)
    if all(f.name in have for f in schema):
        return rows.select(schema.names).cast(schema)
    cols = []
    for f in schema:
        if f.name in have:
            cols.append(rows.column(f.name))
            continue
        col = _derived(f.name, rows)
        if col is None:
            col = pa.nulls(rows.num_rows, f.type)
        cols.append(col)
    return pa.Table.from_arrays(cols, names=schema.names).cast(schema)


def upgrade_batch(table: str, batch: pa.RecordBatch) -> pa.RecordBatch:
    """`upgrade` for one record batch (streamed readers write batch by batch)."""
    if batch.schema == LAKE_TABLES[table]:
        return batch
    out = upgrade(table, batch).combine_chunks()
    batches = out.to_batches()
    return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=LAKE_TABLES[table])


def missing_columns(table: str, schema: pa.Schema) -> list[str]:
    """Columns of the current lake schema that a stored file's ``schema`` lacks."""
    return [f.name for f in LAKE_TABLES[table] if f.name not in schema.names]
