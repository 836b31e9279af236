"""The read-only guard of `replaylake sql`, its shell and `pipeline.analysis.views.read_sql` judges what
DuckDB will execute: an EXPLAIN ANALYZE (which runs the statement it wraps) of a write is refused
like the write itself, whatever options or comments sit between, and a refused input runs none
of its statements; the session's views answer the same afterwards. Reads, EXPLAIN of a read
included, still run."""
from __future__ import annotations

import io
import json

import duckdb
import pytest
from typer.testing import CliRunner

from jobs.cli import app
from jobs.sql.session import open_session
from jobs.sql.shell import Shell, complete
from pipeline.analysis.guard import ReadOnlyError, statements
from pipeline.analysis.views import connect, read_sql
from tests.support.sql_runs import one, shared_run

cli = CliRunner()

# Each of these changes the session's catalog (or would) when run; EXPLAIN ANALYZE executes.
BYPASSES = [
    "explain analyze drop view groups",
    "explain analyze create or replace view groups as select 1 as n",
    "explain analyze create temp table t as select 42 as x",
    "explain analyse create table t as select 42 as x",
    "explain (analyze) create table t as select 42 as x",
    "explain (analyze, format json) create table t as select 42 as x",
    "EXPLAIN /* a comment */ ANALYZE -- and another\n CREATE TABLE t AS SELECT 42 AS x",
    "explain analyze insert into t select 1",
    "explain analyze with x as (select 1) insert into t select * from x",
    "explain analyze create temp macro groups() as table select 1 as n",
    "explain drop view candidates",
    "select 1; explain analyze drop view candidates",
]
# Refused before as well; kept refused (each would change what later statements answer).
WRITES = [
    "drop view groups", "create or replace view groups as select 1 as n",
    "create temp view candidates as select 1 as n", "create temp table t (a int)",
    "with x as (select 1) insert into t select * from x", "/* select */ drop view groups",
    "select 1; drop view groups", "alter view groups rename to g", "use system",
    "reset variable filter_metric", "call pragma_version()", "checkpoint", "prepare p as select 1",
    "create macro groups() as table select 1", "pivot groups on fate", "pragma version",
    "set enable_external_access = true", "begin", "create sequence s",
]
READS = [
    "select count(*) as n from groups", "from groups limit 1", "describe groups",
    "summarize groups", "show tables", "explain select count(*) from groups",
    "explain analyze select count(*) from groups", "explain (format json) select 1",
    "explain analyze (select 1)", "with x as (select 1 as a) select * from x",
    "pivot groups on fate in ('sampled', 'evicted') using count(*)",
    "select * from query('select 1 as a')", "set variable filter_metric = 'reward'",
]


def _groups(con) -> int:
    return one(con, "select count(*) from groups")[0]


@pytest.mark.parametrize("statement", BYPASSES + WRITES)
def test_the_cli_refuses_what_is_not_a_read_and_runs_none_of_the_input(statement: str) -> None:
    lake = shared_run("sync").lake
    n = _groups(connect(lake))
    res = cli.invoke(app, ["sql", "--lake", str(lake), "--format", "json",
                           f"{statement}; select count(*) as n from groups"])
    assert res.exit_code == 2, res.output
    assert res.output.startswith("error: refused: `replaylake sql` is read-only")
    assert str(n) not in res.output          # the select after it did not run either


@pytest.mark.parametrize("statement", BYPASSES)
def test_the_shell_refuses_an_explain_analyze_of_a_write_and_its_views_keep_answering(
        statement: str) -> None:
    con = open_session(shared_run("sync").lake)
    n, tables = _groups(con), one(con, "select count(*) from duckdb_tables()")
    out = io.StringIO()
    shell = Shell(con, "csv", 0, out)
    shell.execute(statement + ";")
    assert "error: refused" in out.getvalue() and "EXPLAIN" in out.getvalue()
    assert _groups(con) == n
    assert one(con, "select count(*) from duckdb_tables()") == tables
    assert one(con, "select count(*) from duckdb_views() where view_name = 'candidates'") == (1,)


@pytest.mark.parametrize("statement", BYPASSES + WRITES)
def test_read_sql_refuses_the_same_statements(statement: str) -> None:
    con = connect(shared_run("sync").lake)
    n = _groups(con)
    with pytest.raises(ReadOnlyError, match="read_sql is read-only"):
        read_sql(con, statement)
    assert _groups(con) == n


@pytest.mark.parametrize("statement", READS)
def test_reads_and_explain_of_a_read_still_run(statement: str) -> None:
    lake = shared_run("sync").lake
    res = cli.invoke(app, ["sql", "--lake", str(lake), "--format", "json", statement])
    assert res.exit_code == 0, res.output
    rel = read_sql(connect(lake), statement)
    assert rel is None or rel.fetchall() is not None


def test_explain_analyze_of_a_select_shows_the_executed_plan() -> None:
    res = cli.invoke(app, ["sql", "--lake", str(shared_run("sync").lake), "--format", "json",
                           "explain analyze select count(*) from groups"])
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.output)
    assert row["explain_key"] == "analyzed_plan" and "Total Time" in row["explain_value"]


def test_a_statement_kind_the_parser_cannot_name_is_refused_in_one_line() -> None:
    res = cli.invoke(app, ["sql", "--lake", str(shared_run("sync").lake),
                           "select 1; update extensions"])
    assert res.exit_code == 2
    assert res.output.startswith("error: refused:") and "cannot check" in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)


def test_a_syntax_error_runs_nothing_and_is_duckdbs_own_message() -> None:
    with pytest.raises(duckdb.ParserException, match="syntax error"):
        statements("explain explain select 1")
    con = connect(shared_run("sync").lake)
    n = _groups(con)
    with pytest.raises(duckdb.ParserException):
        read_sql(con, "drop view groups; select from from")
    assert _groups(con) == n


def test_read_sql_runs_every_statement_and_returns_the_last_result() -> None:
    con = connect(shared_run("sync").lake)
    rel = read_sql(con, "set variable filter_metric = 'acc'; "
                        "select getvariable('filter_metric') as m, $k as k", {"k": 7})
    assert rel.fetchall() == [("acc", 7)]
    assert read_sql(con, "set variable filter_metric = 'reward'") is None
    assert read_sql(con, "  -- nothing but a comment\n") is None


def test_the_shell_sees_a_statement_end_past_a_block_comment_with_a_quote() -> None:
    assert complete("/* it's here */ select 1;")
    assert not complete("select 1 /* ; */")
    assert complete("select '/* not a comment' as a;")
