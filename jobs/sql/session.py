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

import difflib
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
    close = difflib.get_close_matches(name, [*kinds, *loader.catalog()], n=1, cutoff=_CLOSE)
    hint = f"did you mean {close[0]!r}? (.tables lists them)" if close else "try .tables"
    raise ReplayLakeError(f"no relation or named query {name!r}; {hint}")


def call_sql(q: Any) -> str:
    """How ad-hoc SQL reads a named query that is a table macro, its parameters as `<name>`
    placeholders (quoted where the parameter is text): `select * from lineage('<uid>')`."""
    args = ", ".join(f"'<{p.name}>'" if p.type == "VARCHAR" else f"<{p.name}>" for p in q.params)
    return f"select * from {q.name}({args})"


# DuckDB's message for a missing table or table function; its suggestion comes from DuckDB's own
# catalog (`select * from nosuch` suggests "pg_sequences"), not from the lake
_MISSING = re.compile(r'(?P<head>(?P<kind>Table|Table Function) with name (?P<name>.+?) does not '
                      r'exist!)(\nDid you mean "(?P<theirs>[^"]*)"\?)?')


def suggest(con: Any, message: str) -> str:
    """``message`` with DuckDB's suggestion for a missing relation replaced by the lake's
    closest table, view or named query (or by where to find them when none is close)."""
    m = _MISSING.search(message)
    if m is None:
        return message
    hint = _hint(con, m["kind"], m["name"], m["theirs"])
    return message[:m.start()] + m["head"] + "\n" + hint + message[m.end():]


def _hint(con: Any, kind: str, name: str, theirs: str | None) -> str:
    from sql import loader
    kinds = {n.lower(): (n, k) for n, k in relations(con)}
    catalog = loader.catalog()
    if kind == "Table" and kinds.get(name.lower(), ("", ""))[1] == "macro":
        return f"{name} is a named query; read it as {call_sql(catalog[name.lower()])}"
    close = difflib.get_close_matches(name.lower(), list(kinds), n=1, cutoff=_CLOSE)
    if not close:
        # DuckDB's own table functions (range, unnest, ...) are there to be called too
        if kind == "Table Function" and theirs and _near(name, theirs):
            return f'Did you mean "{theirs}"?'
        return "No lake relation is named like it; the shell's .tables lists them."
    found, what = kinds[close[0]]
    if what == "macro" and found in catalog:
        return f'Did you mean "{found}"? (a named query: {call_sql(catalog[found])})'
    return f'Did you mean "{found}"?'


_CLOSE = 0.6        # how alike two names must be (difflib's ratio) for one to be suggested


def _near(a: str, b: str) -> bool:
    return difflib.SequenceMatcher(None, a.lower(), b.lower()).ratio() >= _CLOSE
