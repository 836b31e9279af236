"""How `replaylake sql` prints results: an aligned table that stays readable when wide, CSV,
JSON, or Parquet to a file.

The table fits the terminal (`COLUMNS`, else the real width, else 100). Cells are cut (ending in
`…`) only when the table is wider than that, the longest first and none below `MIN_CUT`
characters; when the columns still do not fit side by side they are split into several tables of
the same rows (the first narrow columns repeated in each, so a row can be found), and headers are
never cut. The default layout (`auto`) shows the rows one field per line instead (vertical) when
that is shorter, a single row for one; `table` always prints tables. A float column is printed
with one number of decimals for all its values, right-aligned. A cut that makes different values
look alike is said under the table. NULL prints as `NULL`, an empty string as nothing, so the two
can be told apart. Map columns (e.g. evictions per reason) print as objects. JSON has no NaN or
infinity: those numbers are written as null.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import shutil
import textwrap
from decimal import Decimal
from typing import Any

FORMATS = ("table", "vertical", "csv", "json", "parquet")
DEFAULT_MAX_ROWS = 40      # rows a table shows unless --max-rows says otherwise
TERMINAL = ("auto", "table", "vertical")   # the layouts printed to the terminal ("auto": default)
NULL = "NULL"
MIN_CUT = 40           # a cell cut to fit keeps at least this many characters (or its header's)
DEFAULT_WIDTH = 100


def width() -> int:
    """The output width: `COLUMNS` when set, else the terminal's, else 100."""
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns


def rows_of(table: Any) -> list[dict]:
    """The rows as dicts, map columns as dicts (not lists of pairs)."""
    import pyarrow as pa
    maps = [f.name for f in table.schema if pa.types.is_map(f.type)]
    rows = table.to_pylist()
    for r in rows:
        for c in maps:
            if r[c] is not None:
                r[c] = dict(r[c])
    return rows


def cell(v: Any) -> str:
    """A value as text: NULL distinct from '', floats to 6 significant digits."""
    if v is None:
        return NULL
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, default=str)
    return str(v)


SIGNIFICANT = 4        # digits a float column keeps for its values (one number of decimals for all)
MAX_DECIMALS = 6


def float_column(values: list[Any]) -> list[str]:
    """A float column's cells with one number of decimals for all (enough for `SIGNIFICANT`
    digits of each value, at most `MAX_DECIMALS`), so they line up when right-aligned; in
    scientific notation, for all, when a value would print as 0 or is too large for that."""
    finite = [abs(v) for v in values if isinstance(v, float) and math.isfinite(v) and v != 0]
    decimals = 0
    for v in finite:
        need = max(0, SIGNIFICANT - 1 - math.floor(math.log10(v)))
        text = f"{v:.{min(need, MAX_DECIMALS)}f}"
        decimals = max(decimals, len(text.partition(".")[2].rstrip("0")))
    decimals = min(decimals, MAX_DECIMALS)
    sci = any(v < 0.5 * 10 ** -decimals or v >= 1e15 for v in finite)

    def one(v: Any) -> str:
        if not isinstance(v, float) or not math.isfinite(v):
            return cell(v)
        return f"{v:.{SIGNIFICANT - 1}e}" if sci else f"{v:.{decimals}f}"
    return [one(v) for v in values]


def _cells(table: Any) -> list[list[str]]:
    """The table's cells as text, a float column with one number of decimals (`float_column`)."""
    import pyarrow as pa
    names = table.column_names
    rows = rows_of(table)
    cols = [float_column([r[c] for r in rows]) if pa.types.is_floating(table.schema.field(c).type)
            else [cell(r[c]) for r in rows] for c in names]
    return [[col[i].replace("\n", "\\n") for col in cols] for i in range(len(rows))]


def _cut(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def _numeric(table: Any, name: str) -> bool:
    import pyarrow as pa
    t = table.schema.field(name).type
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)


def _limits(names: list[str], rows: list[list[str]], cols: int) -> list[int] | None:
    """How many characters each column shows so that the table fits ``cols``: every value whole
    when it fits; else the widest columns cut to one common cap, as wide as fits but not below
    `MIN_CUT` (nor below the header); None when even that is too wide (vertical layout)."""
    full = [max([len(n)] + [len(r[i]) for r in rows]) for i, n in enumerate(names)]
    room = cols - 3 * max(len(names) - 1, 0)

    def at(cap: int) -> list[int]:
        return [min(w, max(cap, len(n))) for w, n in zip(full, names)]
    if sum(full) <= room:
        return full
    if sum(at(MIN_CUT)) > room:
        return None
    lo, hi = MIN_CUT, max(full)          # at(lo) fits, at(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if sum(at(mid)) <= room else (lo, mid)
    return at(lo)


def _look_alike(names: list[str], full: list[list[str]], shown: list[list[str]]) -> list[str]:
    """The columns where the cut made two different values print the same."""
    out = []
    for i, name in enumerate(names):
        seen: dict[str, str] = {}
        for f, s in zip(full, shown):
            if seen.setdefault(s[i], f[i]) != f[i]:
                out.append(name)
                break
    return out


def table_text(table: Any, cols: int | None = None, note: str = "",
               total: int | None = None, layout: str = "auto") -> str:
    """Side by side when it fits ``cols`` (default: `width()`), cutting the longest cells only
    if it must; else the columns split into several tables of the same rows, or (``layout``
    "auto", when that is shorter) the vertical layout. ``total``: the rows the whole result has
    when ``table`` holds only its first rows (the footer says it)."""
    cols = cols or width()
    names = table.column_names
    full = _cells(table)
    right = [_numeric(table, n) for n in names]
    panels = _panels(names, full, cols)
    if layout == "auto" and len(panels) > 1:
        records = table.num_rows * (len(names) + 1)
        tables = len(panels) * (table.num_rows + 3)      # a header, a rule, the rows, a gap
        if table.num_rows <= 1 or records <= tables:
            return vertical_text(table, cols, note, total)
    out: list[str] = []
    shown_all: list[list[str]] = [list(r) for r in full]
    for k, panel in enumerate(panels):
        if k:
            out.append("")
        sub = [names[i] for i in panel]
        rows_full = [[r[i] for i in panel] for r in full]
        limits = _limits(sub, rows_full, cols) or [max(MIN_CUT, len(n)) for n in sub]
        rows = [[_cut(v, n) for v, n in zip(r, limits)] for r in rows_full]
        for r, shown in zip(rows, shown_all):
            for i, v in zip(panel, r):
                shown[i] = v
        widths = [max([len(n)] + [len(r[j]) for r in rows]) for j, n in enumerate(sub)]
        sides = [right[i] for i in panel]
        out += [_line(sub, widths, sides), "-+-".join("-" * w for w in widths)]
        out += [_line(r, widths, sides) for r in rows]
    alike = _look_alike(names, full, shown_all)
    if alike:
        out += textwrap.wrap(f"(cut to fit {cols} columns, different values of "
                             f"{', '.join(alike)} look alike; vertical or csv output shows them "
                             "whole)", cols)
    out.append(_footer(table.num_rows if total is None else total, note))
    return "\n".join(out) + "\n"


def _line(vals: list[str], widths: list[int], right: list[bool]) -> str:
    """One line of a table: each value padded to its column, numbers to the right."""
    return " | ".join(v.rjust(w) if r else v.ljust(w)
                      for v, w, r in zip(vals, widths, right)).rstrip()


def _panels(names: list[str], rows: list[list[str]], cols: int) -> list[list[int]]:
    """The columns (by index) of each table the result is split into so that each fits ``cols``:
    one table when all fit side by side (cells cut as `_limits` allows); else the leading
    narrow columns (at most two, a third of the width) repeated in every table, and the others
    packed in order, each at most `MIN_CUT` characters wide (or its header's)."""
    if not names or _limits(names, rows, cols) is not None:
        return [list(range(len(names)))]
    width = [min(max([len(n)] + [len(r[i]) for r in rows]), max(MIN_CUT, len(n)))
             for i, n in enumerate(names)]
    keys: list[int] = []
    for i in range(min(2, len(names) - 1)):
        if sum(width[j] + 3 for j in [*keys, i]) > cols // 3:
            break
        keys.append(i)
    used = sum(width[j] + 3 for j in keys)
    panels: list[list[int]] = []
    current: list[int] = []
    at = used
    for i in range(len(keys), len(names)):
        if current and at + width[i] > cols:
            panels.append(keys + current)
            current, at = [], used
        current.append(i)
        at += width[i] + 3
    panels.append(keys + current)
    return panels


def vertical_text(table: Any, cols: int | None = None, note: str = "",
                  total: int | None = None) -> str:
    """One `name | value` line per field, a ruler per row; long values wrap under the value.
    Without rows, the columns the result has."""
    cols = cols or width()
    names = table.column_names
    key_w = max((len(n) for n in names), default=0)
    val_w = max(cols - key_w - 3, 20)
    out = []
    if table.num_rows == 0 and names:
        out += textwrap.wrap("columns: " + ", ".join(names), cols, subsequent_indent="  ",
                             break_long_words=True, break_on_hyphens=False)
    for i, r in enumerate(rows_of(table), 1):
        out.append(f"-[ row {i} ]" + "-" * max(cols - len(f"-[ row {i} ]"), 0))
        for n in names:
            text = cell(r[n]).replace("\n", "\\n")
            parts = textwrap.wrap(text, val_w, break_long_words=True,
                                  break_on_hyphens=False) or [""]
            out.append(f"{n.ljust(key_w)} | {parts[0]}")
            out += [f"{' ' * key_w} | {p}" for p in parts[1:]]
    out.append(_footer(table.num_rows if total is None else total, note))
    return "\n".join(out) + "\n"


def _footer(n: int, note: str) -> str:
    """`(N rows; note)`: N is the whole result's row count, however many are shown."""
    return f"({n:,} row{'' if n == 1 else 's'}{'; ' + note if note else ''})"


def csv_text(table: Any) -> str:
    """CSV with a header; NULL is an empty field (CSV has no null), strings are quoted as needed,
    floats written whole."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(table.column_names)
    for r in rows_of(table):
        w.writerow([_csv_value(r[c]) for c in table.column_names])
    return buf.getvalue()


def _csv_value(v: Any) -> str:
    """A value as a CSV field: whole (a float as the shortest text that reads back as the same
    number, never rounded as a table cell is), NULL as an empty field."""
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v)
    return cell(v)


def json_text(table: Any) -> str:
    """A JSON array of row objects (null for NULL), ending in a newline. NaN and infinities are
    null too: JSON has no such numbers, and strict parsers refuse Python's `NaN`/`Infinity`."""
    rows = [{k: _finite(v) for k, v in r.items()} for r in rows_of(table)]
    return json.dumps(rows, default=_json_value, indent=1, allow_nan=False) + "\n"


def _finite(v: Any) -> Any:
    """``v`` with every NaN or infinite float in it (in lists and objects too) made None."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_finite(x) for x in v]
    return v


def _json_value(v: Any) -> Any:
    """A whole decimal (a 128-bit integer: DuckDB's SUM of integers, the token-weighted sums) is
    a JSON number; anything else JSON lacks is its text."""
    if isinstance(v, Decimal) and v == v.to_integral_value():
        return int(v)
    return str(v)


def render(table: Any, fmt: str, note: str = "", total: int | None = None) -> str:
    """``table`` in one of the text formats (``total``: see `table_text`)."""
    if fmt == "csv":
        return csv_text(table)
    if fmt == "json":
        return json_text(table)
    if fmt == "vertical":
        return vertical_text(table, note=note, total=total)
    return table_text(table, note=note, total=total, layout="table" if fmt == "table" else "auto")


def write_file(table: Any, fmt: str, path: str) -> None:
    """Write ``table`` to ``path`` (Parquet through pyarrow; text formats as rendered), making
    its directory first when missing."""
    from pathlib import Path
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    if fmt == "parquet":
        import pyarrow.parquet as pq
        pq.write_table(table, path, compression="zstd")
        return
    with open(path, "w", newline="") as f:
        f.write(render(table, fmt))
