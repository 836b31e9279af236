"""`replaylake sql` as a tool: one-shot and shell, every named query, layouts, read-only guard."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from jobs.cli import app
from jobs.sql.render import table_text
from sql import loader
from tests.support.lake import ROOT
from tests.support.pty_shell import shell_on_a_terminal
from tests.support.sql_runs import shared_run

cli = CliRunner()

# A value per parameter name that the async shared run has (a real uid, a step, a batch).
ARGS = {"uid": "g0001", "step": "3", "threshold": "1", "batch_id": "0", "evict_all": "true",
        "max_response_length": "3", "batch_size": "2", "first_step": "2", "last_step": "5"}
# any other parameter (a new rule's knob, say) gets a value of its declared type
BY_TYPE = {"BIGINT": "2", "INTEGER": "2", "DOUBLE": "0.5", "BOOLEAN": "true", "VARCHAR": "x"}


def sql(*args: str, env: dict | None = None) -> object:
    return cli.invoke(app, ["sql", "--lake", str(shared_run("async").lake), *args], env=env)


def test_every_listed_query_runs_from_the_cli_by_name() -> None:
    for name, q in sorted(loader.catalog().items()):
        params = [a for p in q.params
                  for a in ("--param", f"{p.name}={ARGS.get(p.name, BY_TYPE[p.type.upper()])}")]
        res = sql("--name", name, *params, "--format", "json")
        assert res.exit_code == 0, (name, res.output)
        assert isinstance(json.loads(res.output), list)


def test_every_in_sql_hint_of_the_listing_runs_once_its_placeholders_are_filled() -> None:
    """`sql --list` shows how ad-hoc SQL reads each query: a view by its name, any other query
    as a macro with `<param>` placeholders. Filled in, every hint runs; the listing fits 80
    columns."""
    import re
    listing = cli.invoke(app, ["sql", "--list"], env={"COLUMNS": "80"}).output
    assert max(len(line) for line in listing.splitlines()) <= 80
    hints = re.findall(r"in SQL: (.*(?:\n {8}.*)*)", listing)
    assert len(hints) == len(loader.catalog())
    for hint in hints:
        text = " ".join(hint.split())
        filled = re.sub(r"<([a-z_]+)>", lambda m: ARGS.get(m.group(1), "2"), text)
        res = sql("-c", filled, "--format", "json")
        assert res.exit_code == 0, (text, res.output)
    assert "select * from groups" in listing and "select * from groups(" not in listing
    assert "select * from lineage('<uid>')" in listing


def test_named_queries_are_table_macros_inside_ad_hoc_sql() -> None:
    res = sql("-c", "select stage from lineage('g0001') where stage = 'verdict'", "--format",
              "json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == [{"stage": "verdict"}]
    by_name = json.loads(sql("--name", "stale", "--param", "step=3", "--param", "threshold=1",
                             "--param", "tightest=1", "--format", "json").output)
    inline = json.loads(sql("select * from stale(3, 1, 1)", "--format", "json").output)
    assert inline == by_name


def test_every_statement_of_an_input_is_shown_and_null_differs_from_empty() -> None:
    res = sql("select 1 as first_one; select null as n, '' as e")
    assert res.exit_code == 0, res.output
    assert "first_one" in res.output
    lines = res.output.splitlines()
    assert lines[lines.index("n    | e") + 2] == "NULL |"


def test_json_ends_with_a_newline_and_parquet_goes_to_the_named_file(tmp_path: Path) -> None:
    res = sql("select uid from groups order by uid limit 2", "--format", "json")
    assert res.output.endswith("]\n") and len(json.loads(res.output)) == 2
    out = tmp_path / "g.parquet"
    res = sql("select * from groups", "--format", "parquet", "--output", str(out))
    assert res.exit_code == 0, res.output
    n = json.loads(sql("select count(*) as n from groups", "--format", "json").output)[0]["n"]
    assert pq.read_table(out).num_rows == n
    res = sql("select 1", "--format", "parquet")
    assert res.exit_code != 0 and "--output" in res.output


def test_a_table_has_a_default_row_limit_with_a_note() -> None:
    res = sql("select * from range(100) t(i)")
    assert res.exit_code == 0
    assert "showing the first 40" in res.output
    assert sum(line.strip().isdigit() for line in res.output.splitlines()) == 40
    assert "showing" not in sql("select * from range(100) t(i)", "--max-rows", "0").output


def test_wide_rows_switch_to_a_vertical_layout_that_respects_columns() -> None:
    res = sql("select * from groups order by uid limit 1", env={"COLUMNS": "60"})
    assert res.exit_code == 0
    assert "-[ row 1 ]" in res.output and "effective_status | " in res.output
    assert max(len(line) for line in res.output.splitlines()[:-1]) <= 60
    import pyarrow as pa
    narrow = table_text(pa.table({"min_global_steps": [1]}), cols=60)
    assert narrow.splitlines()[0] == "min_global_steps"   # headers are never cut


@pytest.mark.parametrize("statement", [
    "insert into groups values (1)", "create table t as select 1", "drop view groups",
    "update decisions set step = 0", "delete from decisions", "attach 'other.db' as o",
    "copy groups to 'x.csv'", "install httpfs", "load httpfs", "set threads = 1",
    "pragma enable_profiling", "export database 'dump'",
])
def test_statements_that_are_not_reads_are_refused_with_a_clear_message(statement: str,
                                                                         tmp_path: Path) -> None:
    res = sql(statement)
    assert res.exit_code == 2
    assert "read-only" in res.output and "refused" in res.output


def test_set_variable_is_allowed_to_change_the_filter_metric() -> None:
    res = sql("set variable filter_metric = 'acc'; select getvariable('filter_metric') as m",
              "--format", "json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output.split("ok\n", 1)[1]) == [{"m": "acc"}]


def test_help_renders_flags_and_an_example() -> None:
    res = cli.invoke(app, ["sql", "--help"], env={"COLUMNS": "120"})
    assert res.exit_code == 0
    list_line = next(line for line in res.output.splitlines() if "--list" in line)
    assert "<bool>" not in list_line
    assert "Examples:" in res.output and "replaylake sql --lake" in res.output
    assert "KEY=VALUE" in res.output


def _cmd() -> list[str]:
    return [sys.executable, "-m", "jobs.cli", "sql", "--lake", str(shared_run("async").lake)]


def test_the_shell_reads_multi_line_statements_and_dot_commands_from_stdin() -> None:
    script = "select 40\n  + 2 as answer;\n.tables\n.schema groups\ninsert into t values (1);\n"
    res = subprocess.run(_cmd(), input=script, capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert "answer" in res.stdout and "42" in res.stdout
    assert "lineage" in res.stdout and "macro" in res.stdout     # .tables
    assert "effective_status" in res.stdout                       # .schema groups
    assert "refused" in res.stdout                                # the shell goes on after it


def test_the_shell_on_a_terminal_prompts_continues_lines_and_keeps_history(tmp_path: Path) -> None:
    hist = tmp_path / "history"
    with shell_on_a_terminal(shared_run("async").lake, hist) as type_line:
        assert b"...> " in type_line(b"select 6 *", b"...> ")
        out = type_line(b"7 as product;")
        assert b"product" in out and b"42" in out
    assert "7 as product;" in hist.read_text()
