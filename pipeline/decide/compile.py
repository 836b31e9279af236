"""Declarations written once in SQL: the pieces of their text the live buffer compiles (for
either engine), and their compilation for the polars engine.

A declaration is a named query file under `sql/` (a rule, the group aggregates, the provenance
formulas, the off-policy metrics). DuckDB runs the file as it is, over the lake. The live buffer
compiles parts of the *same text*, once per process: for numpy what a poll evaluates
(`pipeline.decide.vectors`), into polars expressions what is evaluated once per value and
remembered (a rule's horizon, a group's effective status, the aggregates of a group without
trajectories) or off the poll (a batch's certificate). The parts are:

- the predicate of a rule or check: the text between `where (` and its closing `)`;
- the items of a select list written `<expression> as <name>` (plain column names are skipped):
  the query's first select list, or that of one named step (`<step> as (select ...)`);
- the sort key of a ranking window (`row_number() over (partition by ... order by a, b)`), which
  the live buffer's candidate index orders by (and checks against the declared ranking).

Parameters (`$name` in the text) become columns `__p_name` (`param_column`) that the caller adds
to the frame right before evaluating (`vectors.bind`), so a compiled expression never has to be
rebuilt when a step or a threshold changes. An expression over parameters alone (a rule's
horizon) is instead compiled with its values written in as literals and evaluated without a frame
(`evaluate_bound`). The SQL text is the definition; nothing here restates a rule.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache, lru_cache
from typing import Any

import polars as pl

from sql import loader
from sql.loader import Query, SqlError

_WHERE = re.compile(r"^where \(\n(.*?)\n\)$", re.MULTILINE | re.DOTALL)
_ALIAS = re.compile(r"^(.*\S)\s+as\s+([a-z_][a-z0-9_]*)$", re.DOTALL)
_STEP_FROM = re.compile(r"\n\s*from\s")
_WINDOW_ORDER = re.compile(r"row_number\(\)\s+over\s*\(\s*partition by\s+[a-z_][a-z0-9_]*\s+"
                           r"order by\s+([^()]*?)\s*\)")
_IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")


def param_column(name: str) -> str:
    """The column a parameter ``$name`` reads in either engine."""
    return f"__p_{name}"


def to_polars(text: str) -> pl.Expr:
    """Compile one SQL expression (with `$name` parameters) into a polars expression."""
    return pl.sql_expr(loader.PLACEHOLDER.sub(lambda m: param_column(m.group(1)), text))


def _sql_literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    raise SqlError(f"parameter value {value!r} ({type(value).__name__}) cannot be written into "
                   "an expression; use a number, a bool, a string or None")


def _bound(text: str, params: Mapping[str, Any]) -> pl.Expr:
    return pl.sql_expr(loader.PLACEHOLDER.sub(lambda m: _sql_literal(params[m.group(1)]), text))


def evaluate_bound(text: str, params: Mapping[str, Any]) -> Any:
    """The value of an expression over parameters alone (e.g. a rule's horizon), its `$name`
    written in as literals: compiled and evaluated as a frame-less select, about a third of
    what building and evaluating a one-row frame of parameter columns costs. Remembered per
    text and values (it reads nothing else): the polls of one step, and the count and capacity
    reads before a `sample`, evaluate it once."""
    try:
        key = (text, tuple(sorted(params.items())))
        hash(key)
    except TypeError:          # a value that cannot be a key: evaluated every time
        return pl.select(_bound(text, params)).item()
    return _remembered_bound(key)


@lru_cache(maxsize=1024)
def _remembered_bound(key: tuple[str, tuple[tuple[str, Any], ...]]) -> Any:
    text, params = key
    return pl.select(_bound(text, dict(params))).item()


def _body(q: Query) -> str:
    """The query text without its header comment lines."""
    return "\n".join(line for line in q.text.splitlines() if not line.startswith("--"))


def predicate(q: Query) -> str:
    """The predicate of a rule or check file: the block between `where (` and `)` lines."""
    m = _WHERE.search(_body(q))
    if m is None:
        raise SqlError(f"{q.path}: a declaration needs its predicate on its own lines between "
                       "`where (` and `)`")
    return m.group(1).strip()


def _split_top_level(text: str) -> list[str]:
    out, depth, cur = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return out


def select_items(q: Query, step: str | None = None) -> dict[str, str]:
    """`{name: expression}` for every `<expression> as <name>` item of the first select list, or
    of the select list of the named step ``step`` (written `<step> as (` on its own line)."""
    body = _body(q)
    if step is None:   # the query's own select list: its `from` starts a line
        start = body.find("select")
        end = body.find("\nfrom ", start) if start >= 0 else -1
    else:              # a step's: its `from` is indented like its select
        m = re.search(rf"^{re.escape(step)} as \(\n\s*select\b", body, re.MULTILINE)
        start = body.find("select", m.start()) if m else -1
        found = _STEP_FROM.search(body, start) if start >= 0 else None
        end = found.start() if found else -1
    if start < 0 or end < 0:
        where = f"step {step!r}: " if step else ""
        raise SqlError(f"{q.path}: {where}expected `select ... from ...`")
    items = {}
    for item in _split_top_level(body[start + len("select"):end]):
        m = _ALIAS.match(item)
        if m:
            items[m.group(2)] = m.group(1)
    return items


def window_order(q: Query) -> tuple[str, ...]:
    """The columns of the query's `row_number() over (partition by p order by a, b, ...)`, in
    order. Only plain ascending columns are accepted: they are what a key tuple can reproduce."""
    found = _WINDOW_ORDER.findall(_body(q))
    if len(found) != 1:
        raise SqlError(f"{q.path}: expected one `row_number() over (partition by <column> "
                       f"order by <columns>)`, found {len(found)}")
    columns = tuple(c.strip() for c in found[0].split(","))
    bad = [c for c in columns if not _IDENT.match(c)]
    if bad:
        raise SqlError(f"{q.path}: the ranking order must list plain columns (ascending), got "
                       f"{', '.join(bad)}")
    return columns


@cache
def compiled_items(name: str, step: str | None = None) -> dict[str, pl.Expr]:
    """The select items of the named query (or of one of its steps), compiled (cached per
    process)."""
    return {k: to_polars(v) for k, v in select_items(loader.load(name), step).items()}
