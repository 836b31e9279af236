"""Run the statements of one input through a read-only session and print every result in order
(`select 1; select 2` shows both), with a row limit on terminal tables."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jobs.sql import render as sql_render
from pipeline.analysis import statements

DEFAULT_MAX_ROWS = 40


def fetch(con: Any, text: str, limit: int | None, kind: str = "SELECT") -> tuple[Any, int] | None:
    """The statement's rows (at most ``limit``; None = all) and how many rows the whole result
    has, or None for a statement without rows (SET VARIABLE)."""
    if kind == "SET":
        con.execute(text)
        return None
    rel = con.sql(text)
    return None if rel is None else first_rows(rel, limit)


def first_rows(rel: Any, limit: int | None) -> tuple[Any, int]:
    """A DuckDB relation's first ``limit`` rows (None = all) and how many rows it has.

    Past the limit the total is counted by DuckDB as an aggregate over the same relation, not
    by fetching the rest: the count needs none of the result's columns nor its order, so a
    `select *` over the trajectories never reads their tokens, and nothing is held twice. (A
    query that draws at random, `using sample`, may count a different draw than the one shown.)"""
    if limit is None:
        t = rel.to_arrow_table()
        return t, t.num_rows
    t = rel.limit(limit + 1).to_arrow_table()
    if t.num_rows <= limit:
        return t, t.num_rows
    return t.slice(0, limit), int(rel.aggregate("count(*)").fetchall()[0][0])


# how to see every row, as the command line says it and as the shell does
SHOW_ALL, SHOW_ALL_SHELL = "--max-rows 0 or --format csv for all", ".maxrows 0 or .mode csv for all"


def truncated_note(shown: int, total: int, show_all: str = SHOW_ALL) -> str:
    """The footer's note when a table shows only the first ``shown`` of ``total`` rows (short:
    with the count it fits an 80-column line)."""
    return f"showing the first {shown}; {show_all}" if total > shown else ""


def run_text(con: Any, sql: str, *, fmt: str, max_rows: int, write: Callable[[str], None],
             output: str | None = None, show_all: str = SHOW_ALL) -> int:
    """Run every statement of ``sql``; print (or write to ``output``) each result. Returns the
    number of result sets. Guard errors and DuckDB errors propagate to the caller. ``show_all``:
    how a cut table's footer says to see every row."""
    todo = statements(sql)
    if output is not None and sum(s.kind != "SET" for s in todo) != 1:
        from pipeline.errors import ReplayLakeError
        raise ReplayLakeError(f"--output takes the result of one query; got {len(todo)} "
                              "statements")
    shown = 0
    terminal = fmt in ("table", "vertical") and output is None
    for st in todo:
        got = fetch(con, st.text, max_rows if terminal and max_rows > 0 else None, st.kind)
        if got is None:
            write("ok\n")
            continue
        table, total = got
        if output is not None:
            sql_render.write_file(table, fmt, output)
            write(f"wrote {table.num_rows} row(s) to {output}\n")
        else:
            if shown and terminal:
                write("\n")
            write(sql_render.render(table, fmt, truncated_note(table.num_rows, total, show_all),
                                    total))
        shown += 1
    return shown
