"""Run the statements of one input through a read-only session and print every result in order
(`select 1; select 2` shows both), with a row limit on terminal tables."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jobs.sql import render as sql_render
from pipeline.analysis import statements

DEFAULT_MAX_ROWS = 40


def fetch(con: Any, text: str, limit: int | None, kind: str = "SELECT") -> tuple[Any, bool] | None:
    """The statement's rows (at most ``limit``; None = all) and whether more exist, or None for a
    statement without rows (SET VARIABLE)."""
    if kind == "SET":
        con.execute(text)
        return None
    rel = con.sql(text)
    if rel is None:
        return None
    if limit is None:
        return rel.to_arrow_table(), False
    t = rel.limit(limit + 1).to_arrow_table()
    return (t.slice(0, limit), True) if t.num_rows > limit else (t, False)


def run_text(con: Any, sql: str, *, fmt: str, max_rows: int, write: Callable[[str], None],
             output: str | None = None) -> int:
    """Run every statement of ``sql``; print (or write to ``output``) each result. Returns the
    number of result sets. Guard errors and DuckDB errors propagate to the caller."""
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
        table, more = got
        if output is not None:
            sql_render.write_file(table, fmt, output)
            write(f"wrote {table.num_rows} row(s) to {output}\n")
        else:
            note = (f"showing the first {max_rows}; --max-rows 0 shows all, --format csv "
                    "or --output FILE exports them") if more else ""
            if shown and terminal:
                write("\n")
            write(sql_render.render(table, fmt, note))
        shown += 1
    return shown
