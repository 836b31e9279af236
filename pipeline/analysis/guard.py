"""The read-only guard of SQL text someone else wrote: which statements of an input may run on
the analysis connection (`replaylake sql`, its shell, `pipeline.analysis.views.read_sql`).

The connection itself cannot reach a file, an extension or the network (see
`pipeline.analysis.views.lock`), but its in-memory catalog is writable: a statement could create a
table, or drop or replace the views `groups` and `candidates`, and every later statement of the
session would then answer from the altered catalog without a word. So the guard lets through
reads only, judged by what DuckDB will execute, not by the first keyword:

- each statement is classified by DuckDB's own parser (comments, `WITH ... INSERT`, several
  statements in one input are all seen as DuckDB sees them); the input is refused whole, before
  any of it runs, when one statement is not a read, and an input DuckDB cannot parse runs nothing;
- `EXPLAIN ANALYZE` executes the statement it wraps (and `EXPLAIN` plans it), so an `EXPLAIN`
  passes only when every statement its text can be wrapping is a read;
- a PIVOT without an IN list is several statements to DuckDB (it may wrap a CREATE or INSERT
  that the parser does not show), so it is refused with the way to write it as one;
- `SET VARIABLE` passes: a variable is not configuration (the zero-variance views read the
  `filter_metric` variable), and the configuration is locked anyway.
"""
from __future__ import annotations

from dataclasses import dataclass

import duckdb

from pipeline.errors import ReplayLakeError

# What a refused statement kind would do, in the words of the refusal.
_WHAT = {
    "INSERT": "writes", "UPDATE": "writes", "DELETE": "writes", "MERGE_INTO": "writes",
    "CREATE": "creating objects", "DROP": "dropping objects", "ALTER": "altering objects",
    "COPY": "COPY (use --output FILE)", "ATTACH": "ATTACH", "DETACH": "DETACH",
    "LOAD": "INSTALL/LOAD of extensions", "EXPORT": "EXPORT DATABASE", "CALL": "CALL",
    "SET": "SET, RESET and USE (configuration is locked; only SET VARIABLE is allowed)",
    "PRAGMA": "PRAGMA", "TRANSACTION": "transactions", "VACUUM": "VACUUM and ANALYZE",
    "PREPARE": "PREPARE", "EXECUTE": "EXECUTE", "UNKNOWN": "a statement of a kind it cannot check",
    "MULTI": "a PIVOT without an IN list (DuckDB runs it as several statements, which cannot "
             "be checked; name the values: PIVOT ... ON col IN (v1, v2, ...))",
}
# An EXPLAIN's wrapped statement starts within this many tokens of its `explain` keyword
# (`explain`, `analyze` or a parenthesized option list such as `(analyze, format json)`).
_EXPLAIN_HEADER = 64


class ReadOnlyError(ReplayLakeError, PermissionError):
    """A statement that is not a read was given to a read-only SQL entry."""


@dataclass(frozen=True)
class Statement:
    """One statement of the input: its text and its kind (`SELECT`, `EXPLAIN` or `SET`)."""

    text: str
    kind: str


def statements(sql: str, where: str = "`replaylake sql`") -> list[Statement]:
    """The statements of ``sql`` in order, each a read; otherwise ReadOnlyError naming the first
    statement that is not (``where`` names the entry in the message). A syntax error is DuckDB's
    own ParserException, raised before anything runs."""
    out = []
    for text, kind in _parsed(sql, where):
        why = _refusal(text, kind)
        text = text.strip().rstrip(";")
        if why is not None:
            raise ReadOnlyError(f"refused: {where} is read-only, so {why} cannot run here "
                                f"(statement: {_short(text)})")
        out.append(Statement(text, kind))
    return out


def _parsed(sql: str, where: str) -> list[tuple[str, str]]:
    """(text, kind) of every statement, by DuckDB's parser."""
    try:
        return [(st.query, st.type.name) for st in duckdb.extract_statements(sql)]
    except ValueError as exc:   # a kind the python API cannot name (e.g. UPDATE EXTENSIONS)
        raise ReadOnlyError(f"refused: {where} is read-only, and this input holds a statement "
                            f"of a kind it cannot check ({exc}); run SELECT statements only"
                            ) from None


def _refusal(text: str, kind: str) -> str | None:
    """Why a statement is not a read (the refusal's words), or None for a read."""
    if kind == "SELECT":
        return None
    if kind == "SET":
        return None if _words(text, 2) == ["set", "variable"] else _WHAT["SET"]
    if kind == "EXPLAIN":
        wrapped = _wrapped(text)
        whys = [w for w in (_refusal(t, k) for t, k in wrapped) if w is not None]
        if wrapped and not whys:
            return None
        return ("EXPLAIN (EXPLAIN ANALYZE runs the statement it wraps) of "
                + (whys[0] if whys else "a statement it cannot tell"))
    return _WHAT.get(kind, kind)


def _tokens(text: str) -> list[int]:
    """Offsets of the tokens of ``text`` that are not comments."""
    return [off for off, typ in duckdb.tokenize(text) if typ != duckdb.token_type.comment]


def _words(text: str, n: int) -> list[str]:
    """The first ``n`` tokens of ``text`` (comments skipped), lower-cased."""
    offs = _tokens(text)[: n + 1]
    ends = [*offs[1:], len(text)]
    return [text[a:b].split("/*")[0].split("--")[0].strip().lower()
            for a, b in zip(offs[:n], ends[:n])]


def _wrapped(text: str) -> list[tuple[str, str]]:
    """(text, kind) of every statement an EXPLAIN can be wrapping: each suffix of its text that
    starts at a token after `explain` (within the header) and parses as one statement. The
    wrapped statement is one of them, so refusing when any is not a read is safe whatever the
    options between `explain` and the statement."""
    out = []
    for off in _tokens(text)[1: 1 + _EXPLAIN_HEADER]:
        try:
            parsed = duckdb.extract_statements(text[off:])
        except duckdb.Error:
            continue
        except ValueError:
            out.append((text[off:], "UNKNOWN"))
            continue
        if len(parsed) == 1:
            out.append((parsed[0].query, parsed[0].type.name))
    return out


def _short(text: str, width: int = 60) -> str:
    one = " ".join(text.split())
    return one if len(one) <= width else one[: width - 1] + "…"
