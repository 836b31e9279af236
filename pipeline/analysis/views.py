"""Read-only SQL over the lake: an in-memory DuckDB connection with a view per lake table.

`connect(lake_dir)` registers every lake table as a lazily scanned dataset (`lake.scan`: compacted
`.parquet` where it lies, live `.arrow` segments through the torn-tail-tolerant reader), so a
query reads only the columns and rows it names (`trajectories`, `group_events`, `decisions`,
`metrics`), creates the derived views (`DERIVED_VIEWS`, each one
query file under `sql/`), and then locks the connection down:

    SET enable_external_access = false   -- no file, extension or network access at all:
                                         -- COPY ... TO, EXPORT, ATTACH, INSTALL/LOAD, read_csv,
                                         -- read_parquet, glob, ... on any path fail
    SET lock_configuration = true        -- and that setting can no longer be switched back

Why this and not a read-only database file: the lake is Arrow IPC streams and Parquet, not a
DuckDB database, and DuckDB cannot open an in-memory database read-only. With external access off
the only things a statement can touch are this connection's in-memory catalog (a user may create
temp views in it) and the Arrow datasets the Python side registered, which DuckDB scans read-only.
So no statement run through this interface can modify the lake. The catalog, though, is
writable: a statement can drop or replace a view and change what later statements answer. Text
you did not write (a pasted script, a dashboard's field) goes through `read_sql`, which runs
reads only (`pipeline.analysis.guard`), as `replaylake sql` does.

Several derived views are the declarations the live buffer compiles, run here over the lake:
`group_aggregates` (what every eviction rule reads), `provenance` (the staleness and span
formulas of trained rows) and `off_policy` (the per-step metrics). Their inputs are rebuilt from
the lake by `group_trajectories`, `candidates` and `batch_rows`. Which trajectory value the
zero-variance filter compares is the DuckDB variable `filter_metric` (`connect(...,
filter_metric=...)`; change it later with `SET VARIABLE filter_metric = 'acc'`, which the lock
allows: a variable is not configuration).

The views are a snapshot of the lake as `connect` (or `refresh`) read it. Reading while a buffer
appends is safe: a segment's torn or half-written last batch is skipped, every table is cut at the
same point of the buffer's history (see `lake.scan.cut_seq`), and `refresh` picks up what was appended
since (the Python-side registration still works on a locked connection).
"""
from __future__ import annotations

import os
import weakref
from collections.abc import Mapping

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset  # noqa: F401  (pa.dataset in annotations)

from pipeline.analysis.guard import statements
from pipeline.config import stale_bounds
from pipeline.errors import ConfigError
from pipeline.lake import (
    LakeScan,
    burnt_ranges,
    cut_seq,
    orphans,
    read_log,
    read_table,
    require_lake,
    scan_lake,
)
from pipeline.lake import config as lake_config
from schemas import CANDIDATES, GROUP_TRAJECTORIES, LAKE_TABLES, LOOKUPS
from sql import loader

BASE_TABLES = tuple(LAKE_TABLES)
# Derived views, in dependency order; each is the query file of that name under sql/.
DERIVED_VIEWS = ("group_fates", "groups", "group_trajectories", "group_aggregates", "candidates",
                 "batch_rows", "provenance", "off_policy", "restart_rows", "trajectory_fates",
                 "inflight", "batches",
                 "certificates", "starved_stretches", "prompt_history")
DEFAULT_FILTER_METRIC = "reward"

INFLIGHT = pa.schema([
    pa.field("partition", pa.string()),
    pa.field("uid", pa.string()),
    pa.field("global_steps", pa.int64()),
    pa.field("status", pa.string()),          # pending | running
    pa.field("prompt_id", pa.int64()),        # the group's dataset id (null: none given)
    pa.field("dataset", pa.string()),         # the group's dataset name (null: none given)
], metadata={"table": "inflight", "doc": "pending and running groups (what the wait gate reads)"})

BATCH_ROWS = pa.schema([
    pa.field("partition", pa.string()),
    pa.field("step", pa.int64()),             # the step of the selection
    pa.field("batch_id", pa.int64()),
    pa.field("uid", pa.string()),
    pa.field("global_steps", pa.int64()),     # the group's dispatch step when it was selected
    pa.field("min_global_steps", pa.int64()),
    pa.field("max_global_steps", pa.int64()),
    pa.field("is_padding", pa.bool_()),
    pa.field("n_response_tokens", pa.int64()),
    pa.field("span_tokens", pa.int64()),      # tokens covered by version spans (null: none)
    # sum of n_tokens * version (null: none), in 128 bits (DuckDB HUGEINT): 64 would overflow
    pa.field("span_version_sum", pa.decimal128(38, 0)),
    pa.field("span_version_min", pa.int64()),  # oldest version with tokens (null: none)
    pa.field("seq", pa.int64()),              # the trajectory's seq
    pa.field("prompt_id", pa.int64()),        # the group's dataset id (null: none given)
    pa.field("dataset", pa.string()),         # the group's dataset name (null: none given)
], metadata={"table": "batch_rows",
             "doc": "one row per trajectory of every selected group (the provenance inputs)"})

# Relations a query reads that are not lake tables, with the types a case or a caller gives
# their rows (registered under the name, they shadow the derived view of that name).
RELATIONS = {"candidates": CANDIDATES, "inflight": INFLIGHT,
             "group_trajectories": GROUP_TRAJECTORIES, "batch_rows": BATCH_ROWS, **LOOKUPS}


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


def _consistent(tables: dict[str, pa.Table], first: str, burnt: list[tuple[int, int]],
                pending: list[int]) -> dict[str, pa.Table]:
    """Cut every table at one `seq` (see `lake.scan.cut_seq`; ``burnt``: the seq ranges the log
    records as never written; ``pending``: the parts left out as not committed), so a snapshot
    taken while a buffer writes is a prefix of the buffer's history."""
    seqs = {n: t.column("seq").to_numpy() for n, t in tables.items()}
    cut = cut_seq(seqs, first, burnt, pending)
    if cut is None:
        return tables
    return {n: t if len(seqs[n]) == 0 or seqs[n].max() <= cut else
            t.filter(pc.less_equal(t.column("seq"), cut)) for n, t in tables.items()}


def read_lake(lake_dir: str | os.PathLike,
              tables: tuple[str, ...] = BASE_TABLES) -> dict[str, pa.Table]:
    """Lake tables (every one by default) as pyarrow Tables (empty, with its schema, when
    absent), all cut at one `seq` so that they form a consistent prefix even while a buffer
    appends. Name only the tables you need: `trajectories` carries the token payload."""
    root = require_lake(lake_dir)
    unknown = [t for t in tables if t not in BASE_TABLES]
    if unknown or not tables:
        raise ConfigError(f"read_lake(tables={tables!r}): name lake tables among "
                          f"{', '.join(BASE_TABLES)}")
    pending: list[int] = []
    read = _consistent({name: _dedupe(read_table(root, name, pending=pending))
                        for name in tables}, tables[0], burnt_ranges(read_log(root)), pending)
    if "group_events" in read:      # the rule `connect` and a restore apply (see lake_orphans)
        orphans.refuse(root, orphans.summary(orphans.orphans_in(read)))
    return read


def register(con: duckdb.DuckDBPyConnection,
             tables: Mapping[str, pa.Table | pa.dataset.Dataset]) -> None:
    """Register Arrow tables (or lazily scanned datasets) as views, then create the derived
    views that do not exist yet.

    Lake tables missing from ``tables`` are registered empty, so every view always exists. Extra
    relations (see `RELATIONS`) are registered as given; one named like a derived view (e.g.
    `candidates`) shadows that view until it is unregistered. Registering again replaces the
    tables; the derived views read them by name, so they follow. Without a `filter_metric`
    variable (see `set_filter_metric`) every trajectory's metric reads as null."""
    for name in BASE_TABLES:
        con.register(name, tables.get(name, LAKE_TABLES[name].empty_table()))
    for name, schema in LOOKUPS.items():   # a rule's settings relation: no rows unless given
        if name not in tables:
            con.register(name, schema.empty_table())
    for name, table in tables.items():
        if name not in BASE_TABLES:
            con.register(name, table)
    existing = {r[0] for r in con.sql(
        "select view_name from duckdb_views() where not internal and not temporary").fetchall()}
    for view in DERIVED_VIEWS:
        if view not in existing:
            con.sql(f"create view {view} as {loader.load(view).text}")


def set_filter_metric(con: duckdb.DuckDBPyConnection, metric: str | None) -> None:
    """Choose the trajectory value the group aggregates compare (the `filter_metric` variable):
    `reward` for the reward sum, another name for that entry of `reward_info`, None for none."""
    if metric is not None and (not isinstance(metric, str) or not metric):
        raise ConfigError(f"filter_metric={metric!r}: give a reward metric name such as "
                          "'reward' or 'acc', or None")
    con.execute("set variable filter_metric = $metric", {"metric": metric})


def lock(con: duckdb.DuckDBPyConnection) -> None:
    """Switch off every file/extension access and freeze the configuration (see module doc)."""
    con.execute("set enable_external_access = false")
    con.execute("set lock_configuration = true")


def connect(lake_dir: str | os.PathLike, *,
            filter_metric: str | None = DEFAULT_FILTER_METRIC) -> duckdb.DuckDBPyConnection:
    """An in-memory, locked-down DuckDB connection with the lake's tables and derived views.

    The tables are lazily scanned datasets (`lake.scan`): a query reads only the columns and
    rows it asks for, so the token payload never enters memory unless a query names it.
    ``filter_metric`` is the metric the run's zero-variance filter compared (the buffer's
    `filter_groups_metric`); it only changes the `metric_*` columns of `group_trajectories`,
    `group_aggregates` and `candidates`. One connection per thread (DuckDB connections are not
    shareable across threads). A path that is not a lake is refused (`lake.identity`)."""
    scan = scan_lake(require_lake(lake_dir))
    try:
        con = duckdb.connect(":memory:")
        set_filter_metric(con, filter_metric)
        register(con, scan.tables)
        refuse_orphans(con, lake_dir)
        lock(con)
    except BaseException:
        scan.close()
        raise
    _keep(con, scan)
    return con


def recorded_lookups(lake_dir: str | os.PathLike) -> dict[str, pa.Table]:
    """The rules' settings relations as the lake's newest recorded configuration sets them (the
    per-dataset `stale_bounds` of a max_off_policy_threshold mapping). `connect` reads no
    configuration, so over it `stale_bounds` is empty (every group takes the threshold given);
    register these (``con.register(name, table)``) to judge each group by the run's own bounds."""
    record = lake_config.read(lake_dir)
    config = record["versions"][-1]["config"] if record else {}
    return {"stale_bounds": stale_bounds.recorded(config.get("max_off_policy_threshold"))}


def refuse_orphans(con: duckdb.DuckDBPyConnection, lake_dir: str | os.PathLike) -> None:
    """Raise LakeDamageError if the lake holds rows of groups whose registration is gone,
    outside the partitions where a salvage set registrations aside: the same rule a restore
    and `lake check` apply (see `lake.orphans`), so SQL never counts what a restore refuses."""
    orphans.refuse(lake_dir, loader.run(con, "no_orphan_rows"))


# the scan behind each open connection: its mapped files are let go when the connection is
_SCANS: dict[int, LakeScan] = {}


def _keep(con: duckdb.DuckDBPyConnection, scan: LakeScan) -> None:
    old = _SCANS.pop(id(con), None)
    _SCANS[id(con)] = scan
    if old is None:
        weakref.finalize(con, _drop, id(con))
    else:
        old.close()


def _drop(key: int) -> None:
    scan = _SCANS.pop(key, None)
    if scan is not None:
        scan.close()


def read_sql(con: duckdb.DuckDBPyConnection, sql: str,
             params: Mapping[str, object] | None = None) -> duckdb.DuckDBPyRelation | None:
    """Run every statement of ``sql`` if all are reads (else `ReadOnlyError` before any runs):
    the last statement's relation, or None when it yields no rows (`SET VARIABLE`). ``params``
    bind `$name` placeholders of the last statement."""
    todo = statements(sql, where="read_sql")
    for st in todo[:-1]:
        con.execute(st.text)
    if not todo:
        return None
    last = todo[-1]
    if last.kind == "SET":
        con.execute(last.text, params or None)
        return None
    return con.sql(last.text, params=params or None)


def refresh(con: duckdb.DuckDBPyConnection, lake_dir: str | os.PathLike) -> None:
    """Re-scan the lake into an existing connection (rows appended since connect become visible)."""
    scan = scan_lake(require_lake(lake_dir))
    try:
        register(con, scan.tables)
        refuse_orphans(con, lake_dir)
    except BaseException:
        scan.close()
        raise
    _keep(con, scan)
