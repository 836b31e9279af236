"""SQL is tested as data: every `sql/**/*.sql` file has `sql/cases/<name>.json`, whose
cases give input rows per relation and the expected rows; a query file without a case fails."""
from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from sql.loader import SQL_DIR, SqlError, catalog, load, run
from tests.support.sql_cases import CaseDB, load_cases, missing_cases, rows_match

CASES_DIR = SQL_DIR / "cases"


def _all_cases() -> list:
    out = []
    for name in sorted(catalog()):
        path = CASES_DIR / f"{name}.json"
        if not path.exists():
            continue   # reported by test_every_query_has_a_case
        for i, case in enumerate(load_cases(path)):
            out.append(pytest.param(name, case, id=f"{name}[{i}]"))
    return out


def test_every_query_has_a_case() -> None:
    assert missing_cases(SQL_DIR, CASES_DIR) == []


def test_a_query_without_a_case_is_reported(tmp_path: Path) -> None:
    (tmp_path / "queries").mkdir()
    (tmp_path / "cases").mkdir()
    (tmp_path / "queries" / "fake.sql").write_text(
        "-- name: fake\n-- description: a query nobody wrote a case for\n-- params: none\n"
        "-- reads: decisions\n-- returns: x\nselect 1 as x\n")
    assert missing_cases(tmp_path / "queries", tmp_path / "cases") == ["fake"]
    (tmp_path / "cases" / "fake.json").write_text('{"cases": []}')
    assert missing_cases(tmp_path / "queries", tmp_path / "cases") == []


def test_every_case_file_belongs_to_a_query() -> None:
    names = set(catalog())
    orphans = [p.name for p in CASES_DIR.glob("*.json")
               if not p.name.startswith("_") and p.stem not in names]
    assert orphans == []


def test_every_case_file_has_cases() -> None:
    for name in catalog():
        assert load_cases(CASES_DIR / f"{name}.json"), f"{name}.json holds no case"


@pytest.fixture(scope="module")
def db() -> CaseDB:
    return CaseDB()


@pytest.mark.parametrize(("name", "case"), _all_cases())
def test_query_case(name: str, case: dict, db: CaseDB) -> None:
    q = load(name)
    con = db.load(case)
    params = case.get("params", {})
    if "error" in case:
        with pytest.raises(duckdb.Error, match=case["error"].replace("(", r"\(").replace(")", r"\)")):
            run(con, q, **params)
        return
    got = run(con, q, **params)
    assert tuple(got.column_names) == q.columns, "the columns differ from the header's `returns`"
    rows = [[r[c] for c in q.columns] for r in got.to_pylist()]
    want = [[w[c] for c in q.columns] if isinstance(w, dict) else w for w in case["expected"]]
    assert rows_match(rows, want), f"{case['name']}\n got: {rows}\nwant: {want}"


# --- the loader: headers checked at load, arguments checked before DuckDB sees them -----------

HEADER = ("-- name: {name}\n-- description: what it is for\n--   and why\n-- params: {params}\n"
          "-- reads: decisions\n-- returns: x\n")


def _write(tmp_path: Path, name: str, body: str, **header: str) -> Path:
    fields = {"name": name, "params": "none", **header}
    path = tmp_path / f"{name}.sql"
    path.write_text(HEADER.format(**fields) + body)
    return path


def test_a_header_is_parsed_with_typed_params_and_continuation_lines(tmp_path: Path) -> None:
    _write(tmp_path, "q", "select $step::bigint + $k as x\n", params="step BIGINT, k double")
    q = load("q", tmp_path)
    assert q.description == "what it is for and why"
    assert [(p.name, p.type) for p in q.params] == [("step", "BIGINT"), ("k", "DOUBLE")]
    assert (q.tables, q.columns) == (("decisions",), ("x",))
    con = duckdb.connect()
    assert run(con, q, step=2, k=1).to_pylist() == [{"x": 3.0}]
    assert run(con, q, format="polars", step=2, k=1.5)["x"].to_list() == [3.5]


@pytest.mark.parametrize(("text", "message"), [
    ("-- name: q\n-- description: d\n-- params: none\n-- reads: t\nselect 1 as x\n", "lacks returns"),
    ("-- name: q\n-- params: none\n-- reads: t\n-- returns: x\nselect 1 as x\n", "lacks description"),
    ("-- name: other\n-- description: d\n-- params: none\n-- reads: t\n-- returns: x\nselect 1\n",
     "differs from the file name"),
    ("-- name: q\n-- description: d\n-- params: n INT4\n-- reads: t\n-- returns: x\nselect $n\n",
     "bad param"),
    ("-- name: q\n-- description: d\n-- params: none\n-- reads: t\n-- returns: x\nselect $n\n",
     "differ from the \\$placeholders"),
    ("-- name: q\n-- description: d\n-- params: n VARCHAR >= 1\n-- reads: t\n-- returns: x\n"
     "select $n\n", "bad param"),
    ("-- name: q\n-- description: d\n-- params: n BIGINT > 1\n-- reads: t\n-- returns: x\n"
     "select $n\n", "bad param"),
    ("-- name: q\n-- description: d\n-- params: none\n-- reads: t\n-- returns: x\n-- owner: me\n"
     "select 1\n", "unknown header field"),
    ("-- name: q\n-- name: q\n-- description: d\n-- params: none\n-- reads: t\n-- returns: x\n",
     "appears twice"),
])
def test_a_broken_header_is_an_error_at_load(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "q.sql").write_text(text)
    with pytest.raises(SqlError, match=message):
        load("q", tmp_path)


def test_placeholders_in_strings_and_comments_do_not_count(tmp_path: Path) -> None:
    _write(tmp_path, "q", "\n-- mentions $fake\nselect '$not_a_param' as x\n")
    assert load("q", tmp_path).params == ()


def test_two_files_with_one_name_are_an_error(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _write(tmp_path / "a", "q", "select 1 as x\n")
    _write(tmp_path / "b", "q", "select 2 as x\n")
    with pytest.raises(SqlError, match="is used by"):
        load("q", tmp_path)


def test_unknown_names_and_wrong_params_are_clear_errors() -> None:
    con = duckdb.connect()
    with pytest.raises(SqlError, match=r"unknown query 'stale_groups'; did you mean 'groups'\? "
                                       r"\(known queries: .*stale"):
        run(con, "stale_groups")
    with pytest.raises(SqlError, match=r"unknown query 'staleness_by_stp'; did you mean "
                                       r"'staleness_by_step'\?"):
        run(con, "staleness_by_stp")
    with pytest.raises(SqlError, match=r"missing threshold, tightest; it expects stale\(step "
                                       r"BIGINT, threshold BIGINT, tightest BIGINT\)"):
        run(con, "stale", step=3)
    with pytest.raises(SqlError, match="unexpected batch; it expects"):
        run(con, "stale", step=3, threshold=2, tightest=2, batch=1)
    with pytest.raises(SqlError, match="threshold must be BIGINT, got '2'"):
        run(con, "stale", step=3, threshold="2", tightest=2)
    with pytest.raises(SqlError, match="must be BIGINT, got True"):
        run(con, "stale", step=True, threshold=2, tightest=2)
    with pytest.raises(SqlError, match="evict_all must be BOOLEAN, got 1"):
        run(con, "failure", evict_all=1)
    with pytest.raises(SqlError, match="not a BIGINT"):
        load("stale").coerce({"step": "3", "threshold": "two", "tightest": "2"})
    assert load("stale").coerce({"step": "3", "threshold": "2", "tightest": "2"}) == \
        {"step": 3, "threshold": 2, "tightest": 2}
    assert load("failure").coerce({"evict_all": "false"}) == {"evict_all": False}
    with pytest.raises(SqlError, match=r"max_response_length must be >= 1, got 0; it expects "
                                       r"overlong\(max_response_length BIGINT >= 1\)"):
        run(con, "overlong", max_response_length=0)


def test_a_declared_minimum_is_read_from_the_header(tmp_path: Path) -> None:
    _write(tmp_path, "q", "select $n + $x as y\n", params="n BIGINT >= 2, x DOUBLE >= -0.5")
    q = load("q", tmp_path)
    assert [(p.name, p.type, p.minimum) for p in q.params] == [("n", "BIGINT", 2),
                                                                ("x", "DOUBLE", -0.5)]
    assert q.bind({"n": 2, "x": -0.5}) == {"n": 2, "x": -0.5}
    with pytest.raises(SqlError, match="n must be >= 2, got 1"):
        q.bind({"n": 1, "x": 0.0})


def test_every_query_returns_the_columns_its_header_declares_even_when_empty() -> None:
    con = CaseDB().load({"tables": {"candidates": [], "inflight": []}})
    args = {"BIGINT": 1, "INTEGER": 1, "DOUBLE": 1.0, "VARCHAR": "all", "BOOLEAN": True}
    for name, q in catalog().items():
        got = run(con, q, **{p.name: args[p.type] for p in q.params})
        assert tuple(got.column_names) == q.columns, name
