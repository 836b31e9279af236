"""`replaylake sql`: ad-hoc SQL, named queries (sql/**/*.sql) or an interactive shell over a lake,
read-only.

    replaylake sql --lake runs/demo/<ts>/lake "select fate, count(*) from groups group by fate"
    replaylake sql --lake L -c "select * from lineage('p000012')"   # a named query inside SQL
    replaylake sql --lake L --name staleness_by_step --format csv --output steps.csv
    replaylake sql --lake L                                           # interactive shell
    replaylake sql --list

Heavy imports (duckdb, pyarrow, the lake reader) happen inside `main`, so `--help` stays fast.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from jobs.sql.render import DEFAULT_MAX_ROWS, FORMATS

EPILOG = """Examples:
    replaylake sql --lake runs/demo/latest/lake "select * from groups limit 5"
    replaylake sql --lake runs/demo/latest/lake --name staleness_by_step
    replaylake sql --lake runs/demo/latest/lake
    replaylake sql --list"""


def _params(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"--param {item!r}: write key=value")
        out[key.strip()] = value
    return out


def _format_of(output: Path | None) -> str:
    """The format an --output file's extension names (.csv, .json, .parquet), else table (on the
    terminal "auto": a table, or one field per line when that reads shorter)."""
    suffix = output.suffix.lower().lstrip(".") if output is not None else ""
    if suffix in ("csv", "json", "parquet"):
        return suffix
    return "table" if output is not None else "auto"


def _known(name: str) -> None:
    """Refuse an unknown query name in a line: the closest names, and where the list is."""
    from pipeline.errors import ReplayLakeError
    from sql import loader
    names = list(loader.catalog())
    if name in names:
        return
    import difflib
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
    hint = ""
    if close:
        hint = "; did you mean " + (f"{', '.join(close[:-1])} or " if close[1:] else "") + \
            f"{close[-1]}?"
    raise ReplayLakeError(f"unknown query {name!r}{hint} (`replaylake sql --list` lists them)")


def _catalog_text(width: int) -> str:
    """Each named query: its signature and folder, what it is for, and how ad-hoc SQL reads it
    (a view by its name; any other query as a table macro called with its parameters, shown as
    `<name>` placeholders to fill in, quoted where the parameter is text), wrapped to ``width``."""
    import textwrap

    from jobs.sql.session import call_sql
    from pipeline.analysis import DERIVED_VIEWS
    from sql import loader
    lines = []
    for _, q in sorted(loader.catalog().items()):
        title = q.signature
        if q.name in DERIVED_VIEWS:
            call, title = f"select * from {q.name}", f"{q.name} (a view)"
        else:
            call = call_sql(q)
        lines.append(textwrap.fill(f"{title}  [{q.path.parent.name}]", width,
                                   subsequent_indent="    "))
        lines.append(textwrap.fill(q.description, width, initial_indent="    ",
                                   subsequent_indent="    "))
        lines.append(textwrap.fill(f"in SQL: {call}", width, initial_indent="    ",
                                   subsequent_indent="        "))
    return "\n".join(lines)


def main(
    query: Annotated[str | None, typer.Argument(
        metavar="[SQL]", help="SQL to run (several statements allowed); none: --name or a shell")]
    = None,
    command: Annotated[str | None, typer.Option(
        "-c", "--command", metavar="SQL", help="SQL to run, as an option")] = None,
    lake: Annotated[Path | None, typer.Option("--lake", metavar="DIR",
                                              help="the lake directory")] = None,
    name: Annotated[str | None, typer.Option("--name", metavar="QUERY",
                                             help="a named query (see --list)")] = None,
    param: Annotated[list[str] | None, typer.Option(
        "--param", metavar="KEY=VALUE", help="a named query's parameter (repeatable)")] = None,
    fmt: Annotated[str | None, typer.Option(
        "--format", metavar="FORMAT", help="table | vertical | csv | json | parquet "
        "(parquet needs --output); default: the --output file's extension (.csv, .json, "
        ".parquet), else a table, or one field per line when that is shorter")] = None,
    output: Annotated[Path | None, typer.Option(
        "--output", "-o", metavar="FILE", help="write the result to FILE instead of printing")]
    = None,
    max_rows: Annotated[int, typer.Option(
        "--max-rows", metavar="N", help="rows a table shows (0: all); csv/json/files get all")]
    = DEFAULT_MAX_ROWS,
    filter_metric: Annotated[str, typer.Option(
        "--filter-metric", metavar="NAME", help="the run's zero-variance metric")] = "reward",
    list_: Annotated[bool, typer.Option(
        "--list", metavar="", help="list the named queries and exit")] = False,
) -> None:
    """Read-only SQL over a lake: one-shot, a named query, or an interactive shell."""
    if list_:
        from jobs.cli import terminal_width
        typer.echo(_catalog_text(terminal_width()))
        return
    if fmt is None:                      # the file says what it is: x.csv gets CSV, not a table
        fmt = _format_of(output)
    if fmt not in (*FORMATS, "auto"):
        raise typer.BadParameter(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")
    if max_rows < 0:
        raise typer.BadParameter(f"--max-rows {max_rows}: give the rows a table shows, or 0 for "
                                 "all")
    if fmt == "parquet" and output is None:
        raise typer.BadParameter("--format parquet writes a file: add --output FILE")
    if query is not None and command is not None:
        raise typer.BadParameter("give the SQL either as an argument or with -c, not both")
    sql = query if query is not None else command
    if sql is not None and name is not None:
        raise typer.BadParameter("give either SQL or --name, not both")
    if param and name is None:
        raise typer.BadParameter("--param goes with --name")
    if lake is None:
        raise typer.BadParameter("--lake is required")
    if name is not None:
        _known(name)
    import duckdb

    from jobs.sql.run import run_text
    from jobs.sql.session import open_session
    from sql import loader
    write = sys.stdout.write
    try:
        con = open_session(lake, filter_metric)
        if name is None and sql is None:
            from jobs.sql.shell import Shell
            Shell(con, fmt if fmt != "parquet" else "auto", max_rows).loop(sys.stdin.isatty())
            return
        if name is not None:
            q = loader.load(name)
            bound = q.coerce(_params(param or []))
            args = ", ".join(f"${k}" for k in (p.name for p in q.params))
            rel_sql = (f"select * from {q.name}" if name in _views(con)
                       else f"select * from {q.name}({args})")
            _run_bound(con, rel_sql, bound, fmt, max_rows, output)
            return
        run_text(con, sql, fmt=fmt, max_rows=max_rows, write=write,
                 output=None if output is None else str(output))
    except duckdb.Error as exc:          # the SQL's own mistakes (the rest: jobs.cli.handled)
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


def _views(con: object) -> set[str]:
    return {r[0] for r in con.sql(  # type: ignore[attr-defined]
        "select view_name from duckdb_views() where not internal").fetchall()}


def _run_bound(con: object, sql: str, bound: dict, fmt: str, max_rows: int,
               output: Path | None) -> None:
    """A named query through its macro (or view), parameters bound by DuckDB, not spliced."""
    from jobs.sql import render as sql_render
    from jobs.sql.run import first_rows, truncated_note
    rel = con.sql(sql, params=bound or None)  # type: ignore[attr-defined]
    terminal = fmt in sql_render.TERMINAL and output is None
    table, total = first_rows(rel, max_rows if terminal and max_rows > 0 else None)
    if output is not None:
        sql_render.write_file(table, fmt, str(output))
        sys.stdout.write(f"wrote {table.num_rows} row(s) to {output}\n")
        return
    sys.stdout.write(sql_render.render(table, fmt, truncated_note(table.num_rows, total), total))


main.__doc__ = (main.__doc__ or "") + "\n\n" + EPILOG


if __name__ == "__main__":
    from jobs.cli import run
    run(main)       # through the one handler of user errors
