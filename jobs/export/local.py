"""The in-process row source of `replaylake export`: the trained rows read one lake file at a time.

An export's rows are a small part of a large lake, ordered by (batch_id, seq) across many files,
and they carry the token payload (a real run's rows are about 100 kB each). Holding them all
before writing the first shard cost the whole export's size in memory (10 steps of a real run:
several GB). So the plan reads each trajectories file that can hold a trained row (its seq range,
from the Parquet statistics, meets the trained groups'), keeps only each trained row's keys and
where it lies (file, position), and drops the file; writing a shard reads again only the files
its rows lie in, one at a time, and takes its rows. What is held: the keys (a few bytes a row),
one file, and one shard.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from jobs.export.rows import attach_provenance, row_keys, trained_groups
from pipeline.lake import committed_calls, current_files, read_log, read_newest, read_segment
from schemas import LAKE_TABLES
from schemas.evolve import upgrade

SCHEMA = LAKE_TABLES["trajectories"]


def _seq_range(path: Path) -> tuple[int, int] | None:
    """(min, max) seq of a compacted file from its statistics; None: unknown (read it)."""
    if path.suffix != ".parquet":
        return None
    meta = read_newest(path, pq.read_metadata)
    if not meta.num_row_groups:
        return (0, -1)
    # the leaf column: list and struct columns before it make more leaves than fields
    leaves = [meta.row_group(0).column(j).path_in_schema for j in range(meta.num_columns)]
    if "seq" not in leaves:
        return None
    col = leaves.index("seq")
    lo, hi = None, None
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(col).statistics
        if stats is None or not stats.has_min_max:
            return None
        lo = stats.min if lo is None else min(lo, stats.min)
        hi = stats.max if hi is None else max(hi, stats.max)
    return (lo, hi) if lo is not None else (0, -1)


class LocalRows:
    """The in-process row source of `export` (see the module doc); its shards are written here,
    one after the other.

    A row source has two steps. ``plan(lake, partition, selects)`` returns the partition's
    `row_keys` in export order (batch_id, seq), which the export slices into shards and checks;
    ``write(cfg, todo)`` writes the shards ``todo`` names (``(partition, index, keys slice)``)
    and yields ``(partition, index, files, writer)`` as each completes, in any order; ``writer``
    names the process that wrote it (None here). `jobs.export.ray.RayRows` is the other source."""

    def __init__(self) -> None:
        self.files: dict[str, list[Path]] = {}
        self.groups: dict[str, pa.Table] = {}
        self.committed: set[tuple[str, str]] = set()

    def _rows(self, partition: str, file: int) -> pa.Table:
        """The trained rows of one file, with their provenance, in (batch_id, seq) order."""
        groups = self.groups[partition]
        traj = read_segment(self.files[partition][file], self.committed)
        if traj.schema != SCHEMA:             # a file written before a column was added
            traj = upgrade("trajectories", traj)
        traj = traj.filter(pc.is_in(traj.column("uid"), value_set=groups.column("uid")))
        return attach_provenance(traj, groups)

    def plan(self, lake: Path, partition: str, selects: pa.Table) -> pa.Table:
        groups = trained_groups(lake, partition, selects)
        log = read_log(lake)
        self.committed = committed_calls(lake, log)
        self.groups[partition] = groups
        lo = pc.min(groups.column("start_seq")).as_py()
        hi = pc.max(groups.column("sel_seq")).as_py()
        files = self.files[partition] = []
        parts = []
        for path in current_files(lake, "trajectories", [partition], log):
            span = _seq_range(path)
            if lo is None or (span is not None and (span[1] <= lo or span[0] >= hi)):
                continue                  # no trained row can lie here
            files.append(path)
            keys = row_keys(self._rows(partition, len(files) - 1))
            pa.default_memory_pool().release_unused()
            parts.append(keys.append_column("file", pa.array(
                np.full(keys.num_rows, len(files) - 1, np.int64))).append_column(
                "pos", pa.array(np.arange(keys.num_rows, dtype=np.int64))))
        if not parts:
            keys = row_keys(attach_provenance(SCHEMA.empty_table(), groups))
            parts = [keys.append_column("file", pa.array([], pa.int64()))
                     .append_column("pos", pa.array([], pa.int64()))]
        return pa.concat_tables(parts).sort_by([("batch_id", "ascending"), ("seq", "ascending")])

    def write(self, cfg: Any, todo: list[tuple[str, int, pa.Table]]) -> Any:
        from jobs.export.main import write_shard
        pool = pa.default_memory_pool()
        for p, index, keys in todo:
            pieces = []
            files = keys.column("file").to_numpy()
            pos = keys.column("pos").to_numpy()
            for f in np.unique(files):
                pieces.append(self._rows(p, int(f)).take(pa.array(pos[files == f])))
                pool.release_unused()        # the file read for them goes back at once
            rows = pa.concat_tables(pieces)
            del pieces
            # the shard's order across its files, taken row group by row group as it is written
            order = np.lexsort((rows.column("seq").to_numpy(), rows.column("batch_id").to_numpy()))
            yield p, index, write_shard(cfg, rows, p, index, order), None
            del rows
            pool.release_unused()
