"""Named SQL queries: every `sql/**/*.sql` file is one query, called by the name in its header.

A file starts with a header comment block naming the query, what it is for, its typed parameters,
the relations it reads and the columns it returns::

    -- name: stale_bound_respected
    -- description: selected groups whose group span exceeded the threshold
    -- params: threshold BIGINT
    -- reads: decisions, groups
    -- returns: partition, uid, batch_id, step, group_span

Declarations the live buffer compiles (rules/) add `reason`/`check`, `horizon`, `metric`,
`spread`, `value`, `credit` and `lookup` (see pipeline/decide/rules.py); the metric declarations (metrics/)
add `weights` (see pipeline/decide/metrics.py). `params: none` declares a query without
parameters; a header line starting with two spaces after
`--` continues the previous field. The header is checked when the file is loaded (every field
present, no unknown field, name == file stem, the declared params are exactly the `$name`
placeholders of the text), so a broken file fails loudly at load, not half-way through a job.
Arguments are checked before DuckDB sees them (unknown query, missing or extra params, values of
the wrong type), each error naming what the query expects.
"""
from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from pipeline.errors import ReplayLakeError

SQL_DIR = Path(__file__).resolve().parent
HEADER_FIELDS = ("name", "description", "params", "reads", "returns")
# Fields only declarations compiled by the live engine carry (rules and checks; see
# pipeline/decide/compile.py): the eviction reason or check name, the horizon, the metric keys,
# the weight of each mean (metrics/), ...
OPTIONAL_FIELDS = ("reason", "check", "horizon", "metric", "spread", "value", "credit", "weights",
                   "lookup")

# DuckDB parameter types a header may declare, with the python values each accepts.
PARAM_TYPES: dict[str, tuple[type, ...]] = {
    "BIGINT": (int,),
    "INTEGER": (int,),
    "DOUBLE": (int, float),
    "VARCHAR": (str,),
    "BOOLEAN": (bool,),
}

_FIELD = re.compile(r"^--\s?([a-z_]+):\s*(.*)$")
_CONTINUATION = re.compile(r"^--\s{2,}(\S.*)$")
_IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")
# A `$name` parameter. The one spelling of it: the loader checks a header against it and the live
# engine (pipeline/decide/compile.py) substitutes it.
PLACEHOLDER = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")
_STRINGS_AND_COMMENTS = re.compile(r"'(?:[^']|'')*'|--[^\n]*")


class SqlError(ReplayLakeError, ValueError):
    """A named query cannot be loaded or called as asked (bad header, unknown name, bad params)."""


@dataclass(frozen=True)
class Param:
    """One declared parameter: its name (used as `$name` in the text), DuckDB type and, for a
    number, the smallest value it takes (`name BIGINT >= 1`; None: any)."""

    name: str
    type: str
    minimum: int | float | None = None

    def __str__(self) -> str:
        at_least = "" if self.minimum is None else f" >= {self.minimum}"
        return f"{self.name} {self.type}{at_least}"

    def problem(self, value: Any) -> str | None:
        """Why ``value`` cannot be this parameter (its type, or below its minimum), or None."""
        ok = PARAM_TYPES[self.type]
        # bool is an int in python: never accept it for a numeric parameter (or vice versa)
        if not isinstance(value, ok) or (isinstance(value, bool) and bool not in ok):
            return f"must be {self.type}"
        if self.minimum is not None and not value >= self.minimum:
            return f"must be >= {self.minimum}"
        return None


@dataclass(frozen=True)
class Query:
    """One `.sql` file: header fields plus the query text (header included; DuckDB skips comments)."""

    name: str
    description: str
    params: tuple[Param, ...]
    tables: tuple[str, ...]
    columns: tuple[str, ...]
    text: str
    path: Path
    extra: Mapping[str, str] = field(default_factory=dict)   # the OPTIONAL_FIELDS present

    @property
    def signature(self) -> str:
        """`name(p1 TYPE, ...)` as shown in error messages and the CLI."""
        return f"{self.name}({', '.join(str(p) for p in self.params)})"

    def bind(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Check ``values`` against the declared params: none missing, none extra, types right."""
        declared = {p.name: p for p in self.params}
        missing = sorted(set(declared) - set(values))
        extra = sorted(set(values) - set(declared))
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"missing {', '.join(missing)}")
            if extra:
                parts.append(f"unexpected {', '.join(extra)}")
            raise SqlError(f"query {self.name!r}: {'; '.join(parts)}; it expects {self.signature}")
        out: dict[str, Any] = {}
        for name, p in declared.items():
            v = values[name]
            why = p.problem(v)
            if why:
                raise SqlError(f"query {self.name!r}: parameter {name} {why}, got {v!r}; it "
                               f"expects {self.signature}")
            out[name] = float(v) if p.type == "DOUBLE" else v
        return out

    def coerce(self, raw: Mapping[str, str]) -> dict[str, Any]:
        """Parse string values (e.g. from the command line) into the declared types, then bind."""
        declared = {p.name: p for p in self.params}
        out: dict[str, Any] = {}
        for name, text in raw.items():
            p = declared.get(name)
            if p is None:
                out[name] = text  # reported as an extra param by bind
                continue
            try:
                if p.type in ("BIGINT", "INTEGER"):
                    out[name] = int(text)
                elif p.type == "DOUBLE":
                    out[name] = float(text)
                elif p.type == "BOOLEAN":
                    if text.lower() not in ("true", "false", "1", "0"):
                        raise ValueError(text)
                    out[name] = text.lower() in ("true", "1")
                else:
                    out[name] = text
            except ValueError as exc:
                raise SqlError(f"query {self.name!r}: parameter {name}={text!r} is not a "
                               f"{p.type}; it expects {self.signature}") from exc
        return self.bind(out)


def _split_list(value: str) -> list[str]:
    return [x.strip() for x in value.split(",") if x.strip()]


def _minimum(bits: list[str], typ: str) -> int | float | None:
    """The smallest value of `>= N` after a numeric type (None when absent or not that)."""
    if len(bits) != 2 or bits[0] != ">=" or typ not in ("BIGINT", "INTEGER", "DOUBLE"):
        return None
    try:
        return float(bits[1]) if typ == "DOUBLE" else int(bits[1])
    except ValueError:
        return None


def _parse_params(path: Path, value: str) -> tuple[Param, ...]:
    if value.strip().lower() == "none":
        return ()
    params = []
    for item in _split_list(value):
        bits = item.split()
        typ = bits[1].upper() if len(bits) > 1 else ""
        minimum = _minimum(bits[2:], typ)
        if len(bits) not in (2, 4) or not _IDENT.match(bits[0]) or typ not in PARAM_TYPES or \
                (len(bits) == 4 and minimum is None):
            raise SqlError(f"{path}: bad param {item!r}: write `name TYPE` with TYPE one of "
                           f"{', '.join(PARAM_TYPES)}, a number's smallest value as "
                           "`name BIGINT >= 1` (or `params: none`)")
        params.append(Param(bits[0], typ, minimum))
    names = [p.name for p in params]
    if len(set(names)) != len(names):
        raise SqlError(f"{path}: a param is declared twice: {names}")
    return tuple(params)


def placeholders(text: str) -> set[str]:
    """The `$name` placeholders of a query, ignoring string literals and comments."""
    return set(PLACEHOLDER.findall(_STRINGS_AND_COMMENTS.sub(" ", text)))


def parse(path: str | Path) -> Query:
    """Read and check one `.sql` file (see the module docstring for the header's rules)."""
    path = Path(path)
    text = path.read_text()
    fields: dict[str, str] = {}
    last: str | None = None
    for line in text.splitlines():
        if not line.startswith("--"):
            break  # the header is the leading block of comment lines
        if (c := _CONTINUATION.match(line)) and last is not None:
            fields[last] = f"{fields[last]} {c.group(1).strip()}"
        elif m := _FIELD.match(line):
            key = m.group(1)
            if key not in HEADER_FIELDS and key not in OPTIONAL_FIELDS:
                raise SqlError(f"{path}: unknown header field {key!r}; fields are "
                               f"{', '.join(HEADER_FIELDS + OPTIONAL_FIELDS)}")
            if key in fields:
                raise SqlError(f"{path}: header field {key!r} appears twice")
            fields[key] = m.group(2).strip()
            last = key
        elif line.strip() != "--":
            raise SqlError(f"{path}: header line {line!r} is not `-- field: value`")
    missing = [f for f in HEADER_FIELDS if not fields.get(f)]
    if missing:
        raise SqlError(f"{path}: header lacks {', '.join(missing)}; every query file starts with "
                       f"`-- field: value` lines for {', '.join(HEADER_FIELDS)}")
    name = fields["name"]
    if name != path.stem:
        raise SqlError(f"{path}: header name {name!r} differs from the file name {path.stem!r}")
    params = _parse_params(path, fields["params"])
    used = placeholders(text)
    declared = {p.name for p in params}
    if used != declared:
        raise SqlError(f"{path}: declared params {sorted(declared)} differ from the $placeholders "
                       f"the query uses {sorted(used)}")
    tables = tuple(_split_list(fields["reads"]))
    columns = tuple(_split_list(fields["returns"]))
    for what, items in (("reads", tables), ("returns", columns)):
        bad = [x for x in items if not _IDENT.match(x)]
        if bad or not items:
            raise SqlError(f"{path}: `{what}` must list identifiers, got {fields[what]!r}")
    extra = {k: v for k, v in fields.items() if k in OPTIONAL_FIELDS}
    return Query(name, fields["description"], params, tables, columns, text, path, extra)


@cache
def _catalog(root: Path) -> dict[str, Query]:
    out: dict[str, Query] = {}
    for path in sorted(root.rglob("*.sql")):
        q = parse(path)
        if q.name in out:
            raise SqlError(f"query name {q.name!r} is used by {out[q.name].path} and {path}")
        out[q.name] = q
    return out


def catalog(root: str | Path | None = None) -> dict[str, Query]:
    """Every query under ``root`` (default: this package) by name; files are parsed once."""
    return dict(_catalog(Path(root).resolve() if root is not None else SQL_DIR))


def names(root: str | Path | None = None) -> list[str]:
    """The names of every query, sorted."""
    return sorted(catalog(root))


def in_folder(folder: str, root: str | Path | None = None) -> list[Query]:
    """The queries of one sub-folder (e.g. `audits`), sorted by name."""
    return [q for _, q in sorted(catalog(root).items()) if q.path.parent.name == folder]


def load(name: str, root: str | Path | None = None) -> Query:
    """The query called ``name``; an unknown name is an error listing the known ones."""
    queries = catalog(root)
    if name not in queries:
        close = difflib.get_close_matches(str(name), list(queries), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise SqlError(f"unknown query {name!r}{hint} (known queries: {', '.join(sorted(queries))}"
                       "; `replaylake sql --list` describes each)")
    return queries[name]


def run(con: Any, name: str | Query, *, format: str = "arrow", root: str | Path | None = None,
        **params: Any) -> Any:
    """Run a named query on a DuckDB connection with its params bound as `$name` placeholders.

    Returns a pyarrow Table (``format="arrow"``) or a polars DataFrame (``format="polars"``)."""
    q = name if isinstance(name, Query) else load(name, root)
    bound = q.bind(params)
    if format not in ("arrow", "polars"):
        raise SqlError(f"format={format!r}: use 'arrow' or 'polars'")
    rel = con.sql(q.text, params=bound or None)
    return rel.pl() if format == "polars" else rel.to_arrow_table()
