"""Read-only SQL over the lake: an in-memory DuckDB connection with a view per lake table.

`connect(lake_dir)` reads every table through pipeline.lake's torn-tail-tolerant reader (live
`.arrow` segments and compacted `.parquet`), registers them as Arrow views (`trajectories`,
`group_events`, `decisions`, `metrics`), creates the derived views of `sql/views/*.sql`
(`groups`, `trajectory_fates`, `inflight`, `batches`), and then locks the connection down:

    SET enable_external_access = false   -- no file, extension or network access at all:
                                         -- COPY ... TO, EXPORT, ATTACH, INSTALL/LOAD, read_csv,
                                         -- read_parquet, glob, ... on any path fail
    SET lock_configuration = true        -- and that setting can no longer be switched back

Why this and not a read-only database file: the lake is Arrow IPC streams and Parquet, not a
DuckDB database, and DuckDB cannot open an in-memory database read-only. With external access off
the only things a statement can touch are this connection's in-memory catalog (a user may create
temp views in it) and the Arrow tables the Python side registered, which DuckDB scans read-only.
So no statement run through this interface can modify the lake (SPEC §8).

The views are a snapshot of the lake as `connect` (or `refresh`) read it. Reading while a buffer
appends is safe: a segment's torn or half-written last batch is skipped, every table is cut at the
same point of the buffer's history (see `_consistent`), and `refresh` picks up what was appended
since (the Python-side registration still works on a locked connection).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.errors import LakeError
from pipeline.lake import read_table
from schemas import LAKE_TABLES
from sql import loader

BASE_TABLES = tuple(LAKE_TABLES)
# Derived views, in dependency order; each is sql/views/<name>.sql.
DERIVED_VIEWS = ("groups", "trajectory_fates", "inflight", "batches")

CANDIDATES = pa.schema([
    pa.field("partition", pa.string()),
    pa.field("uid", pa.string()),
    pa.field("global_steps", pa.int64()),
    pa.field("term_seq", pa.int64()),
    pa.field("status", pa.string()),          # finished | failure
    pa.field("n_traj", pa.int64()),
    pa.field("zero_variance", pa.bool_()),
    pa.field("value", pa.float64()),
], metadata={"table": "candidates",
             "doc": "terminal groups a poll decides over (the live candidate table's columns); "
                    "a finished group with n_traj = 0 counts as a failure"})

INFLIGHT = pa.schema([
    pa.field("partition", pa.string()),
    pa.field("uid", pa.string()),
    pa.field("global_steps", pa.int64()),
    pa.field("status", pa.string()),          # pending | running
], metadata={"table": "inflight", "doc": "pending and running groups (what the wait gate reads)"})

RELATIONS = {"candidates": CANDIDATES, "inflight": INFLIGHT}


def _dedupe(table: pa.Table) -> pa.Table:
    """Drop rows whose `seq` repeats (a segment and its compacted copy both listed mid-compaction)."""
    if table.num_rows == 0:
        return table
    seq = table.column("seq")
    if pc.count_distinct(seq).as_py() == table.num_rows:
        return table
    # read_table sorts by seq, so a repeat follows its first copy
    s = seq.combine_chunks()
    keep = pc.not_equal(s.slice(1), s.slice(0, len(s) - 1))
    return table.filter(pa.concat_arrays([pa.array([True]), keep.fill_null(True)]))


def _consistent(tables: dict[str, pa.Table], first: str) -> dict[str, pa.Table]:
    """Cut every table at one `seq`, so a snapshot taken while a buffer writes is a prefix of the
    buffer's history (no selection of a group whose registration was not read yet).

    The journal numbers rows of every table from one dense counter, in write order, and the tables
    are read one after the other. Every row up to the largest seq of the table read ``first`` was
    written before that read began, so every later-read table holds it too; past it, the first gap
    in the union of seqs is a row written after its table was read (or a torn tail): cut there.
    Gaps below that point are permanent (e.g. retention) and are kept as they are."""
    seqs = {n: t.column("seq").to_numpy() for n, t in tables.items()}
    head = seqs[first]
    floor = int(head.max()) if len(head) else -1
    above = np.unique(np.concatenate([s[s > floor] for s in seqs.values()]))
    if len(above) == 0:
        return tables
    start = floor + 1 if floor >= 0 else int(above[0])
    gaps = np.flatnonzero(above != start + np.arange(len(above)))
    if len(gaps) == 0:
        return tables
    cut = start + int(gaps[0]) - 1
    return {n: t if len(seqs[n]) == 0 or seqs[n].max() <= cut else
            t.filter(pc.less_equal(t.column("seq"), cut)) for n, t in tables.items()}


def read_lake(lake_dir: str | os.PathLike) -> dict[str, pa.Table]:
    """Every lake table as a pyarrow Table (empty, with its schema, when absent), all cut at one
    `seq` so that they form a consistent prefix even while a buffer appends."""
    root = Path(lake_dir)
    if not root.is_dir():
        raise LakeError(f"no lake directory at {root}")
    tables = {name: _dedupe(read_table(root, name)) for name in BASE_TABLES}
    return _consistent(tables, BASE_TABLES[0])


def register(con: duckdb.DuckDBPyConnection, tables: Mapping[str, pa.Table]) -> None:
    """Register Arrow tables as views, then create the derived views that do not exist yet.

    Lake tables missing from ``tables`` are registered empty, so every view always exists. Extra
    relations (e.g. `candidates` for the policy queries) are registered as given; one named like
    a derived view (e.g. `inflight`) shadows that view until it is unregistered. Registering again
    replaces the tables; the derived views read them by name, so they follow."""
    for name in BASE_TABLES:
        con.register(name, tables.get(name, LAKE_TABLES[name].empty_table()))
    for name, table in tables.items():
        if name not in BASE_TABLES:
            con.register(name, table)
    existing = {r[0] for r in con.sql(
        "select view_name from duckdb_views() where not internal and not temporary").fetchall()}
    for view in DERIVED_VIEWS:
        if view not in existing:
            con.sql(f"create view {view} as {loader.load(view).text}")


def lock(con: duckdb.DuckDBPyConnection) -> None:
    """Switch off every file/extension access and freeze the configuration (see module doc)."""
    con.execute("set enable_external_access = false")
    con.execute("set lock_configuration = true")


def connect(lake_dir: str | os.PathLike) -> duckdb.DuckDBPyConnection:
    """An in-memory, locked-down DuckDB connection with the lake's tables and derived views.

    One connection per thread (DuckDB connections are not shareable across threads)."""
    tables = read_lake(lake_dir)
    con = duckdb.connect(":memory:")
    register(con, tables)
    lock(con)
    return con


def refresh(con: duckdb.DuckDBPyConnection, lake_dir: str | os.PathLike) -> None:
    """Re-read the lake into an existing connection (rows appended since connect become visible)."""
    register(con, read_lake(lake_dir))
