"""The interactive read-only shell of `replaylake sql`: statements end with `;` and may span
lines; `.`-commands inspect the catalog. With a terminal, line editing and a history file
(readline); without one (a pipe), the same loop reads statements from stdin without prompts."""
from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path
from typing import Any

from jobs.sql import render as sql_render
from jobs.sql.run import SHOW_ALL_SHELL, run_text
from pipeline.errors import ReplayLakeError

PROMPT, MORE = "replaylake> ", "       ...> "
MODES = ("auto", "table", "vertical", "csv", "json")
HELP = """\
Statements end with ';' and may span several lines. Read-only: only SELECT
(and WITH, DESCRIBE, SHOW, SUMMARIZE, EXPLAIN of a query) and SET VARIABLE run.
  .tables           tables, views and named queries; a named query is a table
                    macro: select * from lineage('g1')
  .schema NAME      columns of a table or view, or a named query's signature
  .queries          every named query with its parameters
  .mode MODE        output layout: auto (a table, or one field per line when
                    shorter), table, vertical, csv or json
  .maxrows N        rows shown per result (0: all)
  .help             this text
  .quit / .exit     leave (Ctrl-D too)
A line that starts with '.' is a command only between statements, not inside
an unfinished one."""
UNFINISHED = "{cmd} not run: end the unfinished statement with ';' (Ctrl-C drops it)"


def is_command(line: str) -> bool:
    """Whether a line is a `.`-command: a dot then a letter (`.5` is a number, not one)."""
    s = line.lstrip()
    return len(s) > 1 and s[0] == "." and s[1].isalpha()


def history_path() -> Path:
    """Where the shell keeps its history (`REPLAYLAKE_SQL_HISTORY`, else ~/.replaylake_sql_history)."""
    return Path(os.environ.get("REPLAYLAKE_SQL_HISTORY",
                               Path.home() / ".replaylake_sql_history"))


def complete(buffer: str) -> bool:
    """Whether the buffer holds whole statements: it ends with `;` outside quotes and comments
    (`-- ...` to the line's end, `/* ... */`; a quote inside a comment opens nothing)."""
    quote = None
    last = ""
    i = 0
    while i < len(buffer):
        ch = buffer[i]
        if quote:
            if ch == quote:
                quote = None
        elif ch in ("'", '"'):
            quote = ch
        elif buffer.startswith(("--", "/*"), i):
            end = "\n" if ch == "-" else "*/"
            j = buffer.find(end, i + 2)
            if j < 0:   # the rest is comment: an open block comment is not a statement end
                return end == "\n" and last == ";"
            i = j + len(end)
            continue
        elif not ch.isspace():
            last = ch
        i += 1
    return quote is None and last == ";"


class Shell:
    """One shell session on a read-only connection."""

    def __init__(self, con: Any, fmt: str, max_rows: int, out: Any = None):
        self.con, self.fmt, self.max_rows = con, fmt, max_rows
        self.out = out or sys.stdout
        self.done = False

    def write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def dot(self, line: str) -> None:
        """Run one `.`-command; its errors (a name that is no relation, say) are one `error:`
        line, and the shell goes on."""
        import duckdb

        cmd, *rest = line.split(None, 1)
        try:
            self._dot(cmd, "".join(rest).strip().rstrip(";").strip())
        except (ReplayLakeError, duckdb.Error) as exc:
            self.write(f"error: {exc}\n")

    def _dot(self, cmd: str, arg: str) -> None:
        from jobs.sql.session import describe, relations
        if cmd in (".quit", ".exit"):
            self.done = True
        elif cmd == ".help":
            self.write(HELP + "\n")
        elif cmd == ".tables":
            import pyarrow as pa
            rels = relations(self.con)
            self.write(sql_render.table_text(pa.table(
                {"name": [r[0] for r in rels], "kind": [r[1] for r in rels]})))
        elif cmd == ".schema":
            if not arg:
                raise ReplayLakeError(".schema needs a name: .schema groups (.tables lists them)")
            self.write(sql_render.render(describe(self.con, arg), "table"))
        elif cmd == ".queries":
            self._queries()
        elif cmd == ".mode":
            if arg not in MODES:
                raise ReplayLakeError(f".mode {arg or '(nothing)'}: use one of {', '.join(MODES)}")
            self.fmt = arg
        elif cmd == ".maxrows":
            if not arg.isdigit():
                raise ReplayLakeError(f".maxrows {arg or '(nothing)'}: give a row count, "
                                      "0 for all")
            self.max_rows = int(arg)
        else:
            self.write(f"unknown command {cmd!r}; try .help\n")

    def _queries(self) -> None:
        from sql import loader
        cols = sql_render.width()
        for _, q in sorted(loader.catalog().items()):
            head = textwrap.fill(f"{q.signature}  [{q.path.parent.name}]", cols,
                                 subsequent_indent="  ")
            body = textwrap.fill(q.description, cols, initial_indent="    ",
                                 subsequent_indent="    ")
            self.write(f"{head}\n{body}\n")

    def execute(self, sql: str) -> None:
        import duckdb
        try:
            run_text(self.con, sql, fmt=self.fmt, max_rows=self.max_rows, write=self.write,
                     show_all=SHOW_ALL_SHELL)
        except (ReplayLakeError, duckdb.Error) as exc:
            self.write(f"error: {exc}\n")

    def loop(self, interactive: bool) -> None:
        """Read until `.quit` or end of input; each complete buffer runs as one input. On a
        terminal the history is saved however the loop ends."""
        if interactive:
            _setup_readline()
            self.write("replaylake sql: read-only shell over the lake; .help for help\n")
        try:
            self._read(interactive)
        finally:
            if interactive:
                _save_history()

    def _read(self, interactive: bool) -> None:
        buffer = ""
        while not self.done:
            try:
                line = input(MORE if buffer else PROMPT) if interactive else _read_line()
            except EOFError:
                break
            except KeyboardInterrupt:
                buffer = ""
                self.write("\n")
                continue
            if is_command(line):
                if not buffer.strip():
                    buffer = ""
                    self.dot(line)
                    continue
                cmd = line.split()[0]
                if cmd in (".quit", ".exit"):
                    self.write("the unfinished statement was not run\n")
                    buffer = ""
                    self.done = True
                    continue
                # a command typed mid-statement is neither run nor made part of the SQL: either
                # would surprise (a dot inside SQL only fails later, with DuckDB's message)
                self.write(UNFINISHED.format(cmd=cmd) + "\n")
                continue
            buffer += line + "\n"
            if complete(buffer):
                self.execute(buffer)
                buffer = ""
        if buffer.strip():
            self.execute(buffer)


def _read_line() -> str:
    line = sys.stdin.readline()
    if not line:
        raise EOFError
    return line.rstrip("\n")


def _setup_readline() -> None:
    try:
        import readline
    except ImportError:   # no line editing on this platform; the shell still works
        return
    try:
        readline.read_history_file(history_path())
    except OSError:
        pass
    readline.set_history_length(1000)


def _save_history() -> None:
    try:
        import readline
        readline.write_history_file(history_path())
    except (ImportError, OSError):
        pass
