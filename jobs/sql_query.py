"""`replaylake sql`: run ad-hoc SQL or a named query (sql/**/*.sql) over a lake, read-only.

    replaylake sql --lake runs/demo/lake "select fate, count(*) from groups group by fate"
    replaylake sql --lake runs/demo/lake --name lineage --param uid=p000012
    replaylake sql --lake runs/demo/lake --name staleness_by_step --format csv
    replaylake sql --list

The connection comes from pipeline.analysis.connect: in-memory DuckDB, the lake's tables and
derived views registered, file/extension access switched off and the configuration locked, so no
statement given here can modify the lake.
"""
from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

FORMATS = ("table", "csv", "json")


def _params(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"--param {item!r}: write key=value")
        out[key.strip()] = value
    return out


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _rows(table: Any) -> list[dict]:
    """The rows as dicts, map columns (e.g. evictions per reason) as dicts, not lists of pairs."""
    import pyarrow as pa
    maps = [f.name for f in table.schema if pa.types.is_map(f.type)]
    rows = table.to_pylist()
    for r in rows:
        for c in maps:
            if r[c] is not None:
                r[c] = dict(r[c])
    return rows


def render(table: Any, fmt: str, title: str | None = None) -> str:
    """A pyarrow table as a rich table (text), CSV or JSON (one object per row)."""
    rows = _rows(table)
    if fmt == "json":
        return json.dumps(rows, default=str, indent=1)
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(table.column_names)
        w.writerows([[_cell(r[c]) for c in table.column_names] for r in rows])
        return buf.getvalue()
    from rich.console import Console
    from rich.table import Table
    out = Table(title=title, caption=f"{len(rows)} row(s)")
    for c in table.column_names:
        out.add_column(c)
    for r in rows:
        out.add_row(*[_cell(r[c]) for c in table.column_names])
    console = Console(file=io.StringIO(), width=200, force_terminal=False)
    console.print(out)
    return console.file.getvalue()


def _catalog_text() -> str:
    from sql import loader
    lines = []
    for _, q in sorted(loader.catalog().items()):
        lines.append(f"{q.signature}  [{q.path.parent.name}]\n    {q.description}")
    return "\n".join(lines)


def main(
    query: Annotated[str | None, typer.Argument(help="a SQL statement (or use --name / --list)")]
    = None,
    lake: Annotated[Path | None, typer.Option("--lake", help="the lake directory")] = None,
    name: Annotated[str | None, typer.Option("--name", help="a named query from sql/")] = None,
    param: Annotated[list[str] | None,
                     typer.Option("--param", help="named-query parameter key=value")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table | csv | json")] = "table",
    list_: Annotated[bool, typer.Option("--list", help="list the named queries and exit")] = False,
) -> None:
    """Run read-only SQL (or a named query) over a lake and print the result."""
    from pipeline.errors import ReplayLakeError
    param = param or []
    if list_:
        typer.echo(_catalog_text())
        return
    if fmt not in FORMATS:
        raise typer.BadParameter(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")
    if (query is None) == (name is None):
        raise typer.BadParameter("give either a SQL statement or --name (not both)")
    if param and name is None:
        raise typer.BadParameter("--param goes with --name")
    if lake is None:
        raise typer.BadParameter("--lake is required")
    import duckdb

    from pipeline.analysis import connect
    from sql import loader
    try:
        con = connect(lake)
        if name is not None:
            q = loader.load(name)
            result = loader.run(con, q, **q.coerce(_params(param)))
            title = q.signature
        else:
            rel = con.sql(query)
            if rel is None:
                typer.echo("ok (statement returned no rows)")
                return
            result, title = rel.to_arrow_table(), None
    except (ReplayLakeError, duckdb.Error) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    sys.stdout.write(render(result, fmt, title))


if __name__ == "__main__":
    typer.run(main)
