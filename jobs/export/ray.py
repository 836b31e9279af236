"""The lake read with Ray Data: one dataset block per lake file, read by the cluster's workers.

Why the lake's own files and reader instead of `ray.data.read_parquet`: a running lake holds
Arrow IPC segments (Parquet appears only where compaction has run), and a segment may hold record
batches of a multi-partition call whose commit record never landed, which must be skipped. So each
Ray task reads one file (IPC segment or compacted Parquet) with `pipeline.lake.writer.read_segment`,
honouring the commit records the driver collected once; the result is the same rows
`pipeline.lake.writer.read_table` returns, spread over the cluster.

`lake_dataset` serves analysis (any lake table as a `ray.data.Dataset`); `trained_rows_ray` is
the row source of ``replaylake export --ray``: the payload is read and filtered and the provenance
computed on the workers; the driver only orders the (already filtered) rows and writes the shards
with the same manifest as the in-process export. The lake directory must be visible at the same
path from every node (a shared file system).
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.lake import committed_calls, current_files, read_segment, require_lake
from schemas import LAKE_TABLES


def _ray() -> Any:
    import ray
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)
    return ray


def lake_dataset(lake: str | Path, table: str, partitions: list[str] | None = None,
                 keep: Callable[[pa.Table], pa.Array] | None = None) -> Any:
    """A lake table as a Ray Dataset (one block per lake file; ``keep(segment) -> mask``
    filters each file on the worker that reads it). Row order is not defined: sort by ``seq``."""
    ray = _ray()
    lake = require_lake(lake).resolve()   # workers do not share the driver's working directory
    files = [str(p) for p in current_files(lake, table, partitions)]   # each segment's rows once
    committed = committed_calls(lake)
    schema = LAKE_TABLES[table]

    def read(paths: pa.Table) -> pa.Table:
        parts = []
        for path in paths.column("path").to_pylist():
            t = read_segment(Path(path), committed)
            if t.num_rows and keep is not None:
                t = t.filter(keep(t))
            parts.append(t.cast(schema) if t.schema != schema else t)
        return pa.concat_tables(parts) if parts else schema.empty_table()

    items = ray.data.from_items([{"path": f} for f in files],
                                override_num_blocks=max(len(files), 1))
    return items.map_batches(read, batch_format="pyarrow", batch_size=1)


def collect(ds: Any, schema: pa.Schema) -> pa.Table:
    """Every block of ``ds`` as one Arrow table on the driver (blocks fetched by reference)."""
    ray = _ray()
    parts = [t for t in ray.get(ds.to_arrow_refs()) if t.num_rows]
    return pa.concat_tables(parts) if parts else schema.empty_table()


def trained_rows_ray(lake: Path, partition: str, selects: pa.Table) -> pa.Table:
    """`jobs.export.main.trained_rows`, with the payload read, filtered and given its provenance by
    Ray Data workers; same rows, same order."""
    from jobs.export.rows import attach_provenance, trained_groups
    from schemas import BATCH_PROVENANCE

    groups = trained_groups(lake, partition, selects)
    uids = groups.column("uid").combine_chunks()
    ds = lake_dataset(lake, "trajectories", [partition],
                      keep=lambda seg: pc.is_in(seg.column("uid"), value_set=uids))
    ds = ds.map_batches(lambda t: attach_provenance(t, groups), batch_format="pyarrow",
                        batch_size=None)
    schema = pa.unify_schemas([LAKE_TABLES["trajectories"], BATCH_PROVENANCE])
    out = collect(ds, schema)
    return out.sort_by([("batch_id", "ascending"), ("seq", "ascending")])
