"""What `replaylake sql` tells its user when something is off, and how it shows long cells: a
`.`-command's error leaves the shell running; a DuckDB error names the line of the input; a
missing relation is matched against the lake's own; cells are cut only when the table does not
fit, and a cut that makes values look alike says so; an empty result still names its columns;
JSON stays strict; a bad --max-rows is refused; -o makes its directory."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow as pa
from typer.testing import CliRunner

from jobs.cli import app
from jobs.sql.render import table_text
from jobs.sql.run import moved
from tests.support.lake import ROOT
from tests.support.pty_shell import shell_on_a_terminal
from tests.support.sql_runs import shared_run

cli = CliRunner()
EXACT = "select distinct name from metrics where name like '%staleness_exact%' order by name"


def sql(*args: str, columns: int = 80) -> object:
    return cli.invoke(app, ["sql", "--lake", str(shared_run("async").lake), *args],
                      env={"COLUMNS": str(columns)})


def _cmd() -> list[str]:
    return [sys.executable, "-m", "jobs.cli", "sql", "--lake", str(shared_run("async").lake)]


def _shell(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(_cmd(), input=script, capture_output=True, text=True, cwd=ROOT,
                          timeout=120, env={**os.environ, "COLUMNS": "80"})


def test_a_dot_command_error_is_one_line_and_the_shell_goes_on() -> None:
    res = _shell(".schema nosuch\nselect 4 as four;\n.schema\n.mode nosuch\n.maxrows -1\n"
                 ".schema grups\nselect 5 as five;\n")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert "error: no relation or named query 'nosuch'; try .tables" in lines
    assert "error: .schema needs a name: .schema groups (.tables lists them)" in lines
    assert "error: .mode nosuch: use one of auto, table, vertical, csv, json" in lines
    assert "error: .maxrows -1: give a row count, 0 for all" in lines
    assert "error: no relation or named query 'grups'; did you mean 'groups'? (.tables lists " \
           "them)" in lines
    assert "four" in lines and "five" in lines            # the statements after each one ran
    assert res.stderr == ""


def test_on_a_terminal_a_schema_typo_keeps_the_shell_and_its_history(tmp_path: Path) -> None:
    hist = tmp_path / "history"
    with shell_on_a_terminal(shared_run("async").lake, hist) as type_line:
        assert b"no relation or named query 'nosuch'" in type_line(b".schema nosuch")
        assert b"four" in type_line(b"select 4 as four;")
    assert ".schema nosuch" in hist.read_text() and "select 4 as four;" in hist.read_text()


def test_a_wide_terminal_shows_every_cell_whole() -> None:
    full = json.loads(sql(EXACT, "--format", "json").output)
    names = [r["name"] for r in full]
    assert len(names) > 1 and max(len(n) for n in names) > 40
    res = sql(EXACT, columns=200)
    assert res.exit_code == 0, res.output
    assert "…" not in res.output
    assert [line.strip() for line in res.output.splitlines()[2:-1]] == names


def test_a_cut_that_makes_values_look_alike_says_so_and_fits() -> None:
    res = sql(EXACT, columns=40)
    assert res.exit_code == 0, res.output
    assert "…" in res.output
    assert max(len(line) for line in res.output.splitlines()) <= 40
    said = " ".join(res.output.split())
    assert "different values of name look alike; vertical or csv output shows them whole" in said


def test_cells_are_cut_only_as_far_as_the_width_needs() -> None:
    long = "x" * 60
    assert f"| {long}" in table_text(pa.table({"id": [1], "text": [long]}), cols=80)
    two = table_text(pa.table({"a": ["a" * 70], "b": ["b" * 70]}), cols=100)
    assert max(len(line) for line in two.splitlines()) == 99      # 48 + 3 + 48: a cap each
    assert "a" * 47 + "…" in two and "b" * 47 + "…" in two
    assert "look alike" not in two                                  # one value a column


def test_a_conversion_error_names_the_line_of_the_users_input() -> None:
    res = sql("select 'a'::int")
    assert res.exit_code == 2
    assert "LINE 1: select 'a'::int\n                  ^^^^^" in res.output
    res = sql("select 1;\nselect 2,\n  'a'::int")        # the third line of the input
    assert "LINE 3:   'a'::int\n             ^^^^^" in res.output
    res = sql("select 1 as x," + "\n" * 8 + "'a'::int as y")    # DuckDB counts 11 lines here
    assert "LINE 9: 'a'::int as y\n           ^^^^^" in res.output


def test_a_moved_line_keeps_its_caret_under_the_same_character() -> None:
    exc = duckdb.ConversionException("Conversion Error: x\n\nLINE 10: abc\n           ^")
    assert str(moved(exc, -2)) == "Conversion Error: x\n\nLINE 8: abc\n          ^"
    assert isinstance(moved(exc, -2), duckdb.ConversionException)
    assert moved(exc, 0) is exc


def test_an_empty_result_too_wide_for_a_table_still_names_its_columns() -> None:
    res = sql("select * from groups where false")
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())
    assert said.startswith("columns: partition, uid, global_steps,") and "dataset" in said
    assert res.output.endswith("(0 rows)\n")
    assert max(len(line) for line in res.output.splitlines()) <= 80


def _strict(text: str) -> object:
    def refuse(name: str) -> object:
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=refuse)


def test_json_writes_nan_and_infinities_as_null() -> None:
    res = sql("select 1/0 as inf, -1/0 as ninf, 'nan'::double as nan, [1/0, 1.5] as l, "
              "map {'a': 1/0} as m", "--format", "json")
    assert res.exit_code == 0, res.output
    assert _strict(res.output) == [{"inf": None, "ninf": None, "nan": None, "l": [None, 1.5],
                                    "m": {"a": None}}]


def test_a_negative_max_rows_is_refused() -> None:
    res = sql("select * from range(3) t(i)", "--max-rows", "-1")
    assert res.exit_code == 2
    assert "--max-rows -1: give the rows a table shows, or 0 for all" in res.output


def test_output_makes_the_missing_directory(tmp_path: Path) -> None:
    out = tmp_path / "nodir" / "sub" / "x.csv"
    res = sql("select 1 as a", "--format", "csv", "-o", str(out))
    assert res.exit_code == 0, res.output
    assert out.read_text() == "a\n1\n"


def test_an_output_file_takes_its_format_from_its_extension_and_csv_keeps_every_digit(
        tmp_path: Path) -> None:
    """`-o x.csv` writes CSV (not the table layout), `.json` JSON, `.parquet` Parquet, without
    `--format`; CSV writes each float whole (a table cell's 6 digits would lose data)."""
    import pyarrow.parquet as pq
    query = "select 1::double / 3 as third, 'x' as s"
    for name in ("a.csv", "a.json", "a.parquet"):
        res = sql(query, "-o", str(tmp_path / name))
        assert res.exit_code == 0, res.output
    assert (tmp_path / "a.csv").read_text() == "third,s\n0.3333333333333333,x\n"
    assert json.loads((tmp_path / "a.json").read_text()) == [{"third": 1 / 3, "s": "x"}]
    assert pq.read_table(tmp_path / "a.parquet").to_pylist() == [{"third": 1 / 3, "s": "x"}]
    assert sql(query, "-o", str(tmp_path / "a.txt")).exit_code == 0      # else: the table
    assert "0.3333 | x" in (tmp_path / "a.txt").read_text()


def test_a_missing_table_is_matched_against_the_lakes_relations() -> None:
    res = sql("select * from nosuch")
    assert res.exit_code == 2
    assert "pg_sequences" not in res.output
    assert "No lake relation is named like it; the shell's .tables lists them." in res.output
    res = sql("select * from group_aggregate")
    assert 'Did you mean "group_aggregates"?' in res.output
    res = sql("select * from GROUPZ")
    assert 'Did you mean "groups"?' in res.output
    res = sql("select * from lineage")         # a named query is a macro: it takes parameters
    assert "lineage is a named query; read it as select * from lineage('<uid>')" in res.output
    res = sql("select * from lineag('g0001')")
    assert 'Did you mean "lineage"? (a named query: select * from lineage(\'<uid>\'))' in res.output
