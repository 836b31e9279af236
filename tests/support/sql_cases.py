"""Case files of the SQL tests: literal input rows -> typed lake tables and relations in DuckDB,
and the comparison of a query's rows with a case's expected rows (run by tests/analysis/test_sql_cases.py).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from pipeline.analysis.views import (
    BASE_TABLES,
    DEFAULT_FILTER_METRIC,
    RELATIONS,
    register,
    set_filter_metric,
)
from schemas import LAKE_TABLES

CASE_TS = 0  # every case row's `ts` (microseconds since the epoch, UTC)



def _typed(rows: list[dict], schema: pa.Schema, defaults: dict[str, Any]) -> pa.Table:
    cols = {}
    for f in schema:
        vals = []
        for r in rows:
            v = r.get(f.name, defaults.get(f.name))
            if pa.types.is_map(f.type) and isinstance(v, dict):
                v = list(v.items())
            vals.append(v)
        cols[f.name] = pa.array(vals, type=f.type)
    unknown = {k for r in rows for k in r} - set(schema.names) - {"table"}
    if unknown:
        raise ValueError(f"unknown column(s) {sorted(unknown)} for {schema.metadata}")
    return pa.Table.from_pydict(cols, schema=schema)


_LAKE_DEFAULTS: dict[str, Any] = {
    "partition": "train", "session_id": 0, "index": 0, "min_global_steps": 0,
    "max_global_steps": 0, "reward": 0.0, "prompt_ids": [], "response_ids": [],
    "is_padding": False, "poll": 0, "call_id": 0, "count": 1, "global_steps": 0, "ts": CASE_TS,
    "step": 0,
}


def case_tables(case: dict) -> dict[str, pa.Table]:
    """The tables of one case: `log` rows (lake rows in order; `seq` = position unless given) and
    `tables` (rows per relation: lake tables, the known relations, or `{columns, rows}`)."""
    rows: dict[str, list[dict]] = {}
    for i, r in enumerate(case.get("log", [])):
        rows.setdefault(r["table"], []).append({"seq": i, **r})
    out: dict[str, pa.Table] = {}
    for name, spec in case.get("tables", {}).items():
        if isinstance(spec, dict):   # an ad-hoc relation with its DuckDB-free pyarrow types
            schema = pa.schema([(c, _ARROW_TYPES[t]) for c, t in spec["columns"].items()])
            out[name] = _typed(spec["rows"], schema, {})
        elif name in LAKE_TABLES:
            rows.setdefault(name, []).extend(spec)
        elif name in RELATIONS:
            out[name] = _typed(spec, RELATIONS[name], {})
        else:
            raise ValueError(f"relation {name!r} needs a {{columns, rows}} spec")
    for name, rs in rows.items():
        if name not in BASE_TABLES:
            raise ValueError(f"log row for unknown lake table {name!r}")
        if name == "trajectories":   # as ingest stores it: the response length
            rs = [{"n_response_tokens": len(r.get("response_ids") or []), **r} for r in rs]
        out[name] = _typed(rs, LAKE_TABLES[name], _LAKE_DEFAULTS)
    return out


_ARROW_TYPES = {"BIGINT": pa.int64(), "INTEGER": pa.int32(), "DOUBLE": pa.float64(),
                "VARCHAR": pa.string(), "BOOLEAN": pa.bool_()}


class CaseDB:
    """One DuckDB connection reused by every case (a fresh connection costs ~50 ms here): each
    case re-registers the lake tables and its own relations, dropping the previous case's, and
    sets the filter metric the lake views compare (`"filter_metric"` in the case, default
    `reward`; null for a run without the filter)."""

    def __init__(self) -> None:
        self.con = duckdb.connect(":memory:")
        self._extra: list[str] = []

    def load(self, case: dict) -> duckdb.DuckDBPyConnection:
        for name in self._extra:
            self.con.unregister(name)
        tables = case_tables(case)
        self._extra = [n for n in tables if n not in BASE_TABLES]
        set_filter_metric(self.con, case.get("filter_metric", DEFAULT_FILTER_METRIC))
        register(self.con, tables)
        return self.con


def case_connection(case: dict) -> duckdb.DuckDBPyConnection:
    """A fresh connection holding one case's tables and the derived views over them."""
    return CaseDB().load(case)


def load_cases(path: Path) -> list[dict]:
    """The cases of one case file, references resolved: a `log` given as a string names a shared
    log file next to it (`"_story"` -> `_story.json`); a relation given as `"@name"` takes the
    rows of the file's `shared` section."""
    data = json.loads(path.read_text())
    shared = data.get("shared", {})
    cases = []
    for case in data["cases"]:
        case = dict(case)
        if isinstance(case.get("log"), str):
            case["log"] = json.loads((path.parent / f"{case['log']}.json").read_text())["log"]
        case["tables"] = {k: shared[v[1:]] if isinstance(v, str) and v.startswith("@") else v
                          for k, v in case.get("tables", {}).items()}
        cases.append(case)
    return cases


def missing_cases(sql_root: Path, cases_dir: Path) -> list[str]:
    """Query files under ``sql_root`` without a case file ``cases_dir/<name>.json`` (sorted)."""
    from sql.loader import catalog
    return sorted(name for name in catalog(sql_root) if not (cases_dir / f"{name}.json").exists())


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, bool) or isinstance(got, bool):
        return type(got) is type(want) and got == want
    if isinstance(want, float) or isinstance(got, float):
        return isinstance(got, (int, float)) and isinstance(want, (int, float)) \
            and math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(want, list) and isinstance(got, list):
        return len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want))
    if isinstance(want, dict) and isinstance(got, list):   # a map column comes back as pairs
        return _same(dict(got), want)
    if isinstance(want, dict) and isinstance(got, dict):
        return got.keys() == want.keys() and all(_same(got[k], want[k]) for k in want)
    return got == want


def rows_match(got: list[list], want: list[list]) -> bool:
    """Row lists equal in order, floats compared with a tolerance."""
    return len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want))
