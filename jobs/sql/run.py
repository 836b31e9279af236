"""Run the statements of one input through a read-only session and print every result in order
(`select 1; select 2` shows both), with a row limit on terminal tables.

A DuckDB error names the line of the input it is about (`LINE 2: ...`): DuckDB counts lines in
the text it ran, which is one statement of the input, and for a row-limited result the SQL it
writes around that statement; the line is moved back to the user's input."""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import duckdb

from jobs.sql import render as sql_render
from pipeline.analysis import statements


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
    t = _around(rel, rel.limit(limit + 1), lambda r: r.to_arrow_table())
    if t.num_rows <= limit:
        return t, t.num_rows
    return t.slice(0, limit), int(_around(rel, rel.aggregate("count(*)"),
                                          lambda r: r.fetchall()[0][0]))


def _around(rel: Any, derived: Any, get: Callable[[Any], Any]) -> Any:
    """``get(derived)``, where ``derived`` is a relation DuckDB builds around ``rel`` (a limit, a
    count); a DuckDB error's line number is moved from ``derived``'s SQL back to ``rel``'s."""
    try:
        return get(derived)
    except duckdb.Error as exc:
        new = moved(exc, -_lines_before(rel, derived))
        if new is exc:
            raise
        raise new from exc


def _lines_before(rel: Any, derived: Any) -> int:
    """How many lines DuckDB's SQL for ``derived`` has before ``rel``'s own SQL (0: not found)."""
    try:
        inner, outer = rel.sql_query(), derived.sql_query()
    except duckdb.Error:
        return 0
    at = outer.find(inner)
    return outer.count("\n", 0, at) if at >= 0 else 0


_LINE = re.compile(r"LINE (\d+): ")


def moved(exc: Exception, by: int) -> Exception:
    """``exc`` again (same type) with the `LINE n:` of its message moved by ``by`` lines, the
    `^^^` under it kept under the same character; ``exc`` itself when there is nothing to move."""
    text = str(exc)
    if not by or not _LINE.search(text):
        return exc
    lines = text.split("\n")
    for i, line in enumerate(lines):
        m = _LINE.match(line)
        if m is None:
            continue
        head = f"LINE {max(int(m.group(1)) + by, 1)}: "
        lines[i] = head + line[m.end():]
        grow = len(head) - m.end()
        if grow and i + 1 < len(lines) and lines[i + 1].lstrip().startswith("^"):
            caret = lines[i + 1]
            lines[i + 1] = " " * grow + caret if grow > 0 else caret[-grow:]
    return type(exc)("\n".join(lines))


def start_lines(sql: str, todo: list[Any]) -> list[int]:
    """The line of ``sql`` (counted from 0) where each statement of ``todo`` starts."""
    out, at = [], 0
    for st in todo:
        found = sql.find(st.text, at)
        if found < 0:       # not verbatim in the input: say the line where the last one ended
            out.append(sql.count("\n", 0, at))
            continue
        out.append(sql.count("\n", 0, found))
        at = found + len(st.text)
    return out


def explained(con: Any, exc: Exception, line: int) -> Exception:
    """A DuckDB error of the statement that starts on ``line`` of the input, as the user should
    read it: its line counted in the input, a missing relation's suggestion taken from the lake."""
    from jobs.sql.session import suggest
    new = moved(exc, line)
    text = suggest(con, str(new))
    return new if text == str(new) else type(exc)(text)


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
    terminal = fmt in sql_render.TERMINAL and output is None
    for st, line in zip(todo, start_lines(sql, todo)):
        try:
            got = fetch(con, st.text, max_rows if terminal and max_rows > 0 else None, st.kind)
        except duckdb.Error as exc:
            new = explained(con, exc, line)
            if new is exc:
                raise
            raise new from exc
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
