"""Rows of groups whose registration is not in the lake ("orphans"): damage, unless a salvage
set a registration aside.

Why: every row of a group (its trajectories, its later events, the decisions about it) is
written after the group's registration, and nothing ever removes a registration, so no crash
leaves an orphan. A lake whose readers see one lost a registration some other way (a checksum
file that lost its last record, a file edited or replaced), and reading on would drop the
group's trajectories and decisions without a word, or count them under no group. Readers refuse
it, naming the partition and a group. `lake salvage` may lose a registration (a damaged write it
could not keep); it records in the log what it set aside, and in the partitions it touched a
restore then skips the orphans with a warning, while the `no_orphan_rows` audit lists them.
"""
from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.errors import LakeDamageError
from pipeline.lake.read import log_records, read_table

ROW_TABLES = ("group_events", "trajectories", "decisions")    # the tables a group's rows are in


def key(t: pa.Table) -> pa.Array:
    """One string per row naming its group: partition and uid."""
    return pc.binary_join_element_wise(t.column("partition"), t.column("uid"), "\x00")


def registered_keys(events: pa.Table) -> pa.Array:
    """The group key of every registration among ``events``."""
    return pc.unique(key(events.filter(pc.equal(events.column("event"), "registered"))))


def orphan_mask(name: str, t: pa.Table, registered: pa.Array) -> pa.Array:
    """True for the rows of ``t`` (lake table ``name``) whose group is not in ``registered``."""
    own = pc.is_in(key(t), registered)
    if name == "group_events":
        own = pc.or_(own, pc.equal(t.column("event"), "registered"))
    elif name == "decisions":
        own = pc.or_kleene(own, pc.is_null(t.column("uid")))   # refill rows name no group
    return pc.invert(pc.fill_null(own, False))


def salvaged_partitions(log: pa.Table) -> set[str]:
    """Partitions whose group events a salvage set aside (or found gone): some of their
    registrations may be lost. Read from the log's `removed` records, which name the files
    salvage took away, under the lake or under its quarantine."""
    out = set()
    kinds, paths = log.column("kind").to_pylist(), log.column("path").to_pylist()
    for k, p in zip(kinds, paths):
        if k != "removed" or not p:
            continue
        parts = Path(p).parts
        for i, part in enumerate(parts[:-1]):
            if part == "group_events" and parts[i + 1].startswith("partition="):
                out.add(parts[i + 1].removeprefix("partition="))
    return out


def orphans_in(tables: dict[str, pa.Table]) -> dict[str, pa.Table]:
    """The orphan rows of lake tables read whole (``group_events`` among them), per table."""
    registered = registered_keys(tables["group_events"])
    found = {n: tables[n].filter(orphan_mask(n, tables[n], registered))
             for n in ROW_TABLES if n in tables}
    return {n: t for n, t in found.items() if t.num_rows}


def refuse(root: str | os.PathLike, found: pa.Table) -> None:
    """Raise the error of the first partition whose orphans (a `summary`) no salvage explains."""
    if found.num_rows:
        damage = orphan_damage(root, found, salvaged_partitions(log_records(root)))
        if damage:
            raise damage[0]


def find_orphans(root: str | os.PathLike) -> dict[str, pa.Table]:
    """The orphan rows of every table that has some. Holds the registrations and one segment
    at a time: the token payload of the rows that belong is dropped as each segment is read.
    Safe while a buffer writes: rows that look orphaned are checked against the registrations
    read again, after them (a group is registered, and committed, before any row of it)."""
    events = read_table(root, "group_events")
    registered = registered_keys(events)
    out = {}
    for name in ROW_TABLES:
        t = events.filter(orphan_mask(name, events, registered)) if name == "group_events" else \
            read_table(root, name, keep=lambda s, n=name: orphan_mask(n, s, registered))
        if t.num_rows:
            out[name] = t
    if out:
        registered = registered_keys(read_table(root, "group_events"))
        out = {n: t.filter(orphan_mask(n, t, registered)) for n, t in out.items()}
        out = {n: t for n, t in out.items() if t.num_rows}
    return out


def summary(orphans: dict[str, pa.Table]) -> pa.Table:
    """Orphan rows as the `no_orphan_rows` audit lists them: one row per group and table."""
    parts = []
    for name, t in orphans.items():
        g = t.group_by(["partition", "uid"]).aggregate([("seq", "count"), ("seq", "min")])
        parts.append(pa.table({
            "partition": g.column("partition"), "uid": g.column("uid"),
            "table_name": pa.array([name] * g.num_rows, pa.string()),
            "n_rows": g.column("seq_count"), "first_seq": g.column("seq_min")}))
    return pa.concat_tables(parts) if parts else pa.table({})


def orphan_damage(root: str | os.PathLike, found: pa.Table,
                  tolerated: set[str] = frozenset()) -> list[LakeDamageError]:
    """One error per partition of ``found`` (a `summary`) that no salvage explains, naming the
    partition's first orphan row."""
    out = []
    if found.num_rows == 0:
        return out
    rows = found.to_pylist()
    for p in sorted({r["partition"] for r in rows} - set(tolerated)):
        mine = [r for r in rows if r["partition"] == p]
        counts: dict[str, int] = {}
        for r in mine:
            counts[r["table_name"]] = counts.get(r["table_name"], 0) + r["n_rows"]
        first = min(mine, key=lambda r: r["first_seq"])
        listed = ", ".join(f"{n} {name}" for name, n in sorted(counts.items()))
        out.append(LakeDamageError(Path(root) / "group_events" / f"partition={p}", 0, (
            f"{listed} row(s) of partition {p!r} belong to groups whose registration is not in "
            f"the lake (the first: group {first['uid']!r}, {first['table_name']} seq "
            f"{first['first_seq']}); a group's rows are written after its registration, so a "
            "registration was lost (a file replaced by an older copy, or the lake copied while "
            "a buffer wrote to it?)")))
    return out


__all__ = ["key", "registered_keys", "orphan_mask", "salvaged_partitions", "orphans_in",
           "refuse", "find_orphans", "summary", "orphan_damage", "ROW_TABLES"]
