"""The lake read with Ray Data: one dataset block per lake file, read by the cluster's workers.

Why the lake's own files and reader instead of `ray.data.read_parquet`: a running lake holds
Arrow IPC segments (Parquet appears only where compaction has run), and a segment may hold record
batches of a multi-partition call whose commit record never landed, which must be skipped. So each
Ray task reads one file (IPC segment or compacted Parquet) with `pipeline.lake.writer.read_segment`,
honouring the commit records the driver collected once; the result is the same rows
`pipeline.lake.writer.read_table` returns, spread over the cluster.

`lake_dataset` serves analysis (any lake table as a `ray.data.Dataset`; the blocks stay in the
cluster until a caller asks for them). `RayRows` is the row source of ``replaylake export --ray``:
the payload is read and filtered and the provenance computed on the workers, and the shards are
written there too; the driver sees only a few key columns per row (to order the rows, cut the
shards and check them) and writes the manifest, the same as the in-process export's. The lake
directory and the export directory must be visible at the same path from every node (a shared
file system).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
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


def _keys(block: pa.Table, index: int) -> pa.Table:
    """On a worker: a block's `row_keys` with where each row lies (block index, row)."""
    from jobs.export.rows import row_keys

    if not block.num_rows:                   # Ray Data may hand out empty blocks without columns
        return pa.table({})
    keys = row_keys(block)
    return (keys.append_column("block", pa.array(np.full(block.num_rows, index, np.int64)))
                .append_column("row", pa.array(np.arange(block.num_rows, dtype=np.int64))))


def _write(cfg: Any, partition: str, index: int, keys: pa.Table, blocks: list[int],
           *tables: pa.Table) -> tuple[str, int, dict[str, Any], str, int]:
    """On a worker: write one shard, gathering its rows in plan order (a row group at a time)
    from the blocks it touches (handed over by reference as the trailing arguments, in the
    order ``blocks`` names)."""
    import os

    import ray

    from jobs.export.main import write_shard

    starts = np.cumsum([0] + [t.num_rows for t in tables[:-1]])
    offset = dict(zip(blocks, starts.tolist()))
    at = np.array([offset[b] for b in keys.column("block").to_pylist()], dtype=np.int64)
    at += keys.column("row").to_numpy()
    rows = pa.concat_tables(tables)          # no copy: the blocks' chunks side by side
    files = write_shard(cfg, keys, lambda lo, hi: rows.take(pa.array(at[lo:hi])),
                        partition, index)
    return partition, index, files, ray.get_runtime_context().get_node_id(), os.getpid()


class RayRows:
    """The row source of ``replaylake export --ray`` (see `jobs.export.main.LocalRows` for the
    two steps). ``plan``: Ray Data workers read the lake files, keep the trained groups' rows and
    attach their provenance; the blocks stay in Ray's object store and only each row's
    `jobs.export.rows.row_keys` (and where it lies) reach the driver, which orders them.
    ``write``: one Ray task per shard gathers the shard's rows from the blocks it touches and
    writes its files; the driver records each shard in the manifest as its task completes. A
    failed task fails the export and the tasks still pending are cancelled; a re-run resumes."""

    def __init__(self) -> None:
        self.blocks: dict[str, list[Any]] = {}

    def plan(self, lake: Path, partition: str, selects: pa.Table) -> pa.Table:
        from jobs.export.rows import attach_provenance, row_keys, trained_groups

        ray = _ray()
        groups = trained_groups(lake, partition, selects)
        uids = groups.column("uid").combine_chunks()
        ds = lake_dataset(lake, "trajectories", [partition],
                          keep=lambda seg: pc.is_in(seg.column("uid"), value_set=uids))
        ds = ds.map_batches(lambda t: attach_provenance(t, groups), batch_format="pyarrow",
                            batch_size=None)
        self.blocks[partition] = refs = ds.to_arrow_refs()
        keys_of = ray.remote(_keys)
        parts = [t for t in ray.get([keys_of.remote(r, i) for i, r in enumerate(refs)])
                 if t.num_rows]
        if not parts:
            return row_keys(attach_provenance(LAKE_TABLES["trajectories"].empty_table(), groups))
        return pa.concat_tables(parts).sort_by([("batch_id", "ascending"), ("seq", "ascending")])

    def write(self, cfg: Any, todo: list[tuple[str, int, pa.Table]]) -> Any:
        ray = _ray()
        # the workers do not share the driver's working directory
        cfg = dataclasses.replace(cfg, lake=cfg.lake.resolve(), out=cfg.out.resolve())
        write_on = ray.remote(_write)
        pending = []
        for p, index, keys in todo:
            keys = keys.select(["block", "row", "nbytes"])
            blocks = sorted(set(keys.column("block").to_pylist()))
            pending.append(write_on.remote(cfg, p, index, keys, blocks,
                                           *[self.blocks[p][b] for b in blocks]))
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                p, index, files, node, pid = ray.get(ready[0])
                yield p, index, files, (node, pid)
        finally:
            for ref in pending:              # an error (or an abandoned export): stop the rest
                ray.cancel(ref)
