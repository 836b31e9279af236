"""Group aggregates, computed live from their one declaration (sql/aggregates/group_aggregates.sql).

Each stored trajectory chunk carries a small meta frame (schemas.GROUP_TRAJECTORIES); the first
poll after groups turned terminal runs the declared aggregates once over the meta rows of all of
them (one query per poll, and one for everything a restore brought back), never per group and
never over the token payload.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from pipeline import declared
from pipeline.ingest import metric_values
from schemas import GROUP_TRAJECTORIES

if TYPE_CHECKING:
    from pipeline.store import PartitionState

QUERY = "group_aggregates"
_KEYS = ("partition", "uid")


def meta_frame(rows: pa.Table, filter_metric: str | None) -> pl.DataFrame:
    """The GROUP_TRAJECTORIES rows of freshly stored trajectories."""
    metric = metric_values(rows, filter_metric)
    n = rows.num_rows
    return pl.from_arrow(pa.table({
        "partition": rows.column("partition"),
        "uid": rows.column("uid"),
        "metric": metric if metric is not None else pa.nulls(n, pa.float64()),
        "n_response_tokens": pc.list_value_length(rows.column("response_ids")).cast(pa.int64()),
        "min_global_steps": rows.column("min_global_steps"),
        "max_global_steps": rows.column("max_global_steps"),
    }, schema=GROUP_TRAJECTORIES))


def complete(part: PartitionState) -> None:
    """Compute the candidate rows of every group awaiting them, in one query."""
    pending = part.candidates.pending
    if not pending:
        return
    ids = [i for u in pending for i in part.groups[u].rows]
    meta = part.rows.take_meta(ids) if ids else None
    items = declared.compiled_items(QUERY)
    agg: dict[str, tuple] = {}
    names = list(items)
    if meta is not None:
        out = meta.group_by(*_KEYS).agg(e.alias(k) for k, e in items.items())
        agg = {r[1]: r[2:] for r in out.iter_rows()}
    empty = (0,) + tuple(None for _ in names[1:])
    empty = tuple(0 if k in ("n_traj", "metric_nulls") else v for k, v in zip(names, empty))
    n_at = names.index("n_traj")
    rows = []
    for uid, (gs, term_seq, status) in pending.items():
        a = agg.get(uid, empty)
        effective = "failure" if status == "failure" or a[n_at] == 0 else "finished"
        rows.append((part.partition, uid, gs, term_seq, effective, *a))
    part.candidates.complete(rows)
