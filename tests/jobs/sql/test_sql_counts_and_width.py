"""What `replaylake sql` says is true and fits an 80-column terminal: a cut table's footer gives
the whole result's row count; the shell's help, catalog and notes fit 80 columns; a `.`-command
typed inside an unfinished statement is neither run nor made part of the SQL."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from jobs.cli import app
from tests.support.lake import ROOT
from tests.support.sql_runs import shared_run

cli = CliRunner()
WIDTH = 80


def sql(*args: str) -> object:
    return cli.invoke(app, ["sql", "--lake", str(shared_run("async").lake), *args],
                      env={"COLUMNS": str(WIDTH)})


def _footer(output: str) -> str:
    return output.rstrip("\n").splitlines()[-1]


def test_a_result_of_exactly_the_limit_is_shown_whole_with_its_count() -> None:
    res = sql("select * from range(40) t(i)")
    assert res.exit_code == 0, res.output
    assert _footer(res.output) == "(40 rows)"


@pytest.mark.parametrize(("n", "shown"), [(41, "41"), (45, "45"), (36458, "36,458")])
def test_a_cut_table_says_how_many_rows_the_result_has(n: int, shown: str) -> None:
    res = sql(f"select * from range({n}) t(i) order by i desc")
    assert res.exit_code == 0, res.output
    footer = _footer(res.output)
    assert footer == f"({shown} rows; showing the first 40; --max-rows 0 or --format csv for all)"
    assert len(footer) <= WIDTH
    values = [int(line) for line in res.output.splitlines() if line.strip().isdigit()]
    assert values == list(range(n - 1, n - 41, -1))     # the first 40, in the query's order


def test_a_vertical_layout_and_max_rows_count_the_same_way() -> None:
    res = sql("select * from range(7) t(i)", "--format", "vertical", "--max-rows", "3")
    assert res.exit_code == 0, res.output
    assert _footer(res.output).startswith("(7 rows; showing the first 3;")
    assert res.output.count("-[ row ") == 3


def test_a_named_querys_cut_table_counts_its_whole_result() -> None:
    every = json.loads(sql("--name", "staleness_by_step", "--format", "json").output)
    assert len(every) > 1
    res = sql("--name", "staleness_by_step", "--max-rows", "1")
    assert res.exit_code == 0, res.output
    assert _footer(res.output).startswith(f"({len(every)} rows; showing the first 1;")


def _shell(script: str) -> str:
    cmd = [sys.executable, "-m", "jobs.cli", "sql", "--lake", str(shared_run("async").lake)]
    res = subprocess.run(cmd, input=script, capture_output=True, text=True, cwd=ROOT,
                         timeout=120, env={**os.environ, "COLUMNS": str(WIDTH)})
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_the_shells_help_tables_and_queries_fit_80_columns() -> None:
    out = _shell(".help\n.tables\n.queries\nselect * from range(50) t(i);\n")
    assert ".maxrows N" in out and "lineage" in out and "macro" in out
    too_long = [line for line in out.splitlines() if len(line) > WIDTH]
    assert not too_long, too_long
    assert "(50 rows; showing the first 40; .maxrows 0 or .mode csv for all)" in out


def test_the_help_text_itself_fits_80_columns() -> None:
    from jobs.sql.shell import HELP
    assert max(len(line) for line in HELP.splitlines()) <= WIDTH


def test_a_dot_command_inside_an_unfinished_statement_is_refused_and_the_statement_goes_on(
        ) -> None:
    out = _shell("select 40\n.tables\n+ 2 as answer;\n")
    assert ".tables not run: end the unfinished statement with ';' (Ctrl-C drops it)" in out
    assert "macro" not in out                       # .tables did not run
    assert "answer" in out and "42" in out          # nor became SQL: the statement still runs
    assert "error" not in out


def test_quit_inside_an_unfinished_statement_leaves_without_running_it() -> None:
    out = _shell("select 1 as never\n.quit\nselect 2 as after;\n")
    assert "the unfinished statement was not run" in out
    assert "never" not in out and "after" not in out


def test_a_number_starting_with_a_dot_is_sql_not_a_command() -> None:
    out = _shell("select\n.5 as half;\n")
    assert "half" in out and "0.5" in out and "not run" not in out
