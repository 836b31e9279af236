"""The in-process row source of `replaylake export`: the trained rows read one lake file at a time.

An export's rows are a small part of a large lake, ordered by (batch_id, seq) across many files,
and they carry the token payload (a real run's rows are about 100 kB each). Holding them all
before writing the first shard cost the whole export's size in memory (10 steps of a real run:
several GB). So the plan reads each trajectories file that can hold a trained row (its seq range,
from the Parquet statistics, meets the trained groups'), keeps only each trained row's keys and
where it lies (file, position), and drops the file; writing a shard reads again only the files
its rows lie in, one at a time, and gathers it one Parquet row group at a time. What is held: the
keys (a few bytes a row), one file's trained rows, and one row group.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from jobs.export.rows import attach_provenance, row_keys, trained_groups
from pipeline.lake import (
    committed_calls,
    current_files,
    read_log,
    read_newest,
    read_segment,
    seq_ranges,
)
from schemas import LAKE_TABLES
from schemas.evolve import upgrade

SCHEMA = LAKE_TABLES["trajectories"]


def _seq_range(path: Path) -> tuple[int, int] | None:
    """(min, max) seq of a compacted file from its statistics; None: unknown (read it)."""
    if path.suffix != ".parquet":
        return None
    ranges = seq_ranges(read_newest(path, pq.read_metadata))
    if ranges is None:
        return None
    if not ranges:
        return (0, -1)
    return min(lo for lo, _ in ranges), max(hi for _, hi in ranges)


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
        self.held: dict[tuple[str, int], pa.Table] = {}   # the last file read by `write`

    def _rows(self, partition: str, file: int) -> pa.Table:
        """The trained rows of one file, with their provenance, in (batch_id, seq) order."""
        groups = self.groups[partition]
        traj = read_segment(self.files[partition][file], self.committed)
        if traj.schema != SCHEMA:             # a file written before a column was added
            traj = upgrade("trajectories", traj)
        # one take of the trained rows (a filter first would copy them once more: a lake file
        # of a real run is about 100 MB of payload); the file read is handed back at once
        rows = attach_provenance(traj, groups)
        del traj
        pa.default_memory_pool().release_unused()
        return rows

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
            parts.append(keys.append_column("file", pa.array(
                np.full(keys.num_rows, len(files) - 1, np.int64))).append_column(
                "pos", pa.array(np.arange(keys.num_rows, dtype=np.int64))))
        if not parts:
            keys = row_keys(attach_provenance(SCHEMA.empty_table(), groups))
            parts = [keys.append_column("file", pa.array([], pa.int64()))
                     .append_column("pos", pa.array([], pa.int64()))]
        return pa.concat_tables(parts).sort_by([("batch_id", "ascending"), ("seq", "ascending")])

    def _gather(self, partition: str, keys: pa.Table) -> Callable[[int, int], pa.Table]:
        """``gather(lo, hi)``: the rows ``keys[lo:hi]`` name, in that order. The last file read
        is kept for the next call (and the next shard): a shard's rows walk its files in order
        (a batch's rows are in seq order, and so are the lake's files), so each file is read
        about once."""
        files = keys.column("file").to_numpy()
        pos = keys.column("pos").to_numpy()
        held = self.held

        def gather(lo: int, hi: int) -> pa.Table:
            f, p = files[lo:hi], pos[lo:hi]
            pieces, where = [], np.empty(hi - lo, np.int64)
            at = 0
            for file in dict.fromkeys(f.tolist()):    # in order of first use
                if (partition, file) not in held:
                    held.clear()
                    pa.default_memory_pool().release_unused()   # before the next file is read
                    held[(partition, file)] = self._rows(partition, file)
                mine = np.flatnonzero(f == file)
                pieces.append(held[(partition, file)].take(pa.array(p[mine])))
                where[mine] = np.arange(at, at + len(mine))
                at += len(mine)
            if not pieces:
                return attach_provenance(SCHEMA.empty_table(), self.groups[partition])
            rows = pa.concat_tables(pieces)
            return rows if len(pieces) == 1 else rows.take(pa.array(where))

        return gather

    def write(self, cfg: Any, todo: list[tuple[str, int, pa.Table]]) -> Any:
        from jobs.export.main import write_shard
        for p, index, keys in todo:
            yield p, index, write_shard(cfg, keys, self._gather(p, keys), p, index), None
        self.held.clear()
