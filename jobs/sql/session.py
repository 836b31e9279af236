"""A read-only SQL session over a lake: the locked analysis connection, every named query usable
inside ad-hoc SQL as a table macro, and a statement guard that refuses anything but reading.

The analysis connection already has file, extension and network access switched off, so nothing
can reach the lake's files. The guard (`pipeline.analysis.guard`) refuses every statement that is not
a read, judged by what DuckDB will execute: writes to the in-memory catalog (which would change
what the session's views answer), ATTACH, COPY, INSTALL/LOAD, SET, PRAGMA, and an EXPLAIN ANALYZE
of any of those. `SET VARIABLE` stays allowed: the `filter_metric` variable chooses what the
zero-variance views compare, and a variable is not configuration.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pipeline.errors import ReplayLakeError


def macro_sql(q: Any) -> str:
    """`create temp macro name(p_a, p_b) as table <query>`: the query's `$a` placeholders become
    macro parameters `p_a` (prefixed so a parameter never collides with a column of that name)."""
    text = q.text.strip().rstrip(";")
    for p in q.params:
        text = re.sub(rf"\${p.name}\b", f"p_{p.name}", text)
    args = ", ".join(f"p_{p.name}" for p in q.params)
    return f"create temp macro {q.name}({args}) as table\n{text}"


def open_session(lake: Path, filter_metric: str | None = "reward") -> Any:
    """The locked analysis connection with every named query that is not already a view
    registered as a table macro: `select * from lineage('g0001')`."""
    from pipeline.analysis import connect
    from sql import loader
    con = connect(lake, filter_metric=filter_metric)
    existing = {r[0] for r in con.sql(
        "select view_name from duckdb_views() where not internal").fetchall()}
    existing |= {r[0] for r in con.sql("select table_name from duckdb_tables()").fetchall()}
    for name, q in sorted(loader.catalog().items()):
        if name not in existing:
            con.execute(macro_sql(q))
    return con


def relations(con: Any) -> list[tuple[str, str]]:
    """(name, kind) of every table, view and table macro the session offers, sorted by name."""
    rows = con.sql("""
        select view_name as name, 'view' as kind from duckdb_views() where not internal
        union all select table_name, 'table' from duckdb_tables()
        union all select distinct function_name, 'macro' from duckdb_functions()
            where function_type = 'table_macro' and not internal
        order by name""").fetchall()
    return [(r[0], r[1]) for r in rows]


def describe(con: Any, name: str) -> Any:
    """The columns of one relation (or the signature of a named query) as an Arrow table."""
    from sql import loader
    kinds = dict(relations(con))
    if kinds.get(name) in ("view", "table"):
        return con.sql(f'describe "{name}"').to_arrow_table()
    if name in loader.catalog():
        import pyarrow as pa
        q = loader.load(name)
        return pa.table({"query": [q.signature], "returns": [", ".join(q.columns)],
                         "description": [q.description]})
    raise ReplayLakeError(f"no relation or named query {name!r}; try .tables")
