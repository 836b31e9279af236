"""What a user sees at 80 columns: sql tables that honour --format table and stay readable when
wide, float columns with one number of decimals, NULL (not Python's None), a pasteable audit
hint, an unknown query named in a line, usage errors pointing at the command's own help, the lake
as an argument, thousands separators."""
from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from jobs.cli import app
from jobs.export.manifest import _option_value
from jobs.sql.render import float_column, table_text
from tests.support.sql_runs import shared_run

cli = CliRunner()
NARROW = {"COLUMNS": "80"}


def run(*args: str) -> object:
    return cli.invoke(app, list(args), env=NARROW, prog_name="replaylake")


def lake() -> str:
    return str(shared_run("async").lake)


def test_an_explicit_table_format_prints_a_table_that_fits() -> None:
    res = run("sql", "--lake", lake(), "--format", "table", "select * from batches limit 3")
    assert res.exit_code == 0, res.output
    assert "-[ row" not in res.output
    lines = res.output.splitlines()
    assert lines[0].startswith("partition | batch_id | ")
    assert max(len(line) for line in lines) <= 80
    # every column is shown, in tables of the same rows, the first columns repeated
    assert {"strategy", "select_seq", "staleness_mean"} <= set(re.split(r"[\s|]+", res.output))
    assert sum(line.startswith("partition | batch_id") for line in lines) >= 2


def test_a_wide_many_row_result_defaults_to_tables_not_records() -> None:
    res = run("sql", "--lake", lake(), "--name", "staleness_by_step")
    assert res.exit_code == 0, res.output
    assert "-[ row" not in res.output
    steps = len(res.output.splitlines())
    vertical = run("sql", "--lake", lake(), "--name", "staleness_by_step", "--format", "vertical")
    assert steps < len(vertical.output.splitlines()) / 2


def test_one_wide_row_still_prints_one_field_per_line() -> None:
    narrow = table_text(pa.table({f"column_number_{i}": [i] for i in range(12)}), cols=80)
    assert narrow.startswith("-[ row 1 ]")
    forced = table_text(pa.table({f"column_number_{i}": [i] for i in range(12)}), cols=80,
                        layout="table")
    assert "-[ row" not in forced and max(len(x) for x in forced.splitlines()) <= 80


def test_a_float_column_has_one_number_of_decimals_right_aligned() -> None:
    assert float_column([0.0, 0.65625, 0.671875, 1.015625]) == [
        "0.0000", "0.6562", "0.6719", "1.0156"]
    assert float_column([1.5, 2.0, None]) == ["1.5", "2.0", "NULL"]
    assert float_column([1e-9, 2.0]) == ["1.000e-09", "2.000e+00"]
    text = table_text(pa.table({"x": [1.55906, 1.5, 1.6381]}), cols=80)
    assert text.splitlines()[2:5] == ["1.559", "1.500", "1.638"]


def test_csv_keeps_floats_exact() -> None:
    res = run("sql", "--lake", lake(), "--format", "csv", "select 0.671875::double as x")
    assert res.output.splitlines()[1] == "0.671875"


def test_audit_rows_print_null_and_the_listing_command_on_a_line_of_its_own() -> None:
    res = run("audit", lake(), "--threshold", "1")
    assert res.exit_code == 1, res.output
    assert "=None" not in res.output
    lines = res.output.splitlines()
    at = next(i for i, line in enumerate(lines) if re.search(r"\(\+[\d,]+ more", line))
    command = lines[at + 1].strip()
    assert command.startswith("replaylake sql --lake ") and command.endswith("threshold=1")
    listed = cli.invoke(app, [*command.split()[1:], "--format", "json"])
    assert listed.exit_code == 0, listed.output


def test_an_unknown_query_is_one_short_line_with_the_closest_names() -> None:
    res = run("sql", "--lake", lake(), "--name", "staleness_by_ste")
    assert res.exit_code == 2
    line = res.output.strip()
    assert line.startswith("error: unknown query 'staleness_by_ste'; did you mean staleness_by_step")
    assert "replaylake sql --list" in line and len(line) < 200
    assert len(run("sql", "--lake", lake(), "--name", "nosuch").output) < 120


@pytest.mark.parametrize(("args", "where"), [
    (["audit", "--lake"], "replaylake audit --help"),
    (["sql", "--lake", "x", "--name"], "replaylake sql --help"),
    (["export", "--out"], "replaylake export --help"),
])
def test_an_option_without_its_value_points_to_the_commands_help(args: list[str],
                                                                  where: str) -> None:
    res = run(*args)
    assert res.exit_code == 2
    assert f"(try: {where})" in res.output


def test_audit_and_export_take_the_lake_as_an_argument_too(tmp_path: Path) -> None:
    assert "passed" in run("audit", lake()).output
    res = run("export", lake(), "--out", str(tmp_path / "e"), "--no-progress")
    assert res.exit_code == 0, res.output
    both = run("audit", lake(), "--lake", str(tmp_path))
    assert both.exit_code == 2 and "name the lake once" in both.output
    assert "missing the lake" in run("audit").output


def test_the_maintenance_commands_take_the_lake_as_an_argument_too(tmp_path: Path) -> None:
    import shutil
    copy = tmp_path / "lake"
    shutil.copytree(lake(), copy)          # compact and retain rewrite files: not the shared lake
    for args in (("compact", str(copy), "--no-progress"),
                 ("retain", str(copy), "--older-than", "1000", "--no-progress"),
                 ("lake", "check", str(copy))):
        res = run(*args)
        assert res.exit_code == 0, (args, res.output)
    assert "compacted 0 segment(s)" in run("compact", str(copy), "--no-progress").output
    both = run("compact", str(copy), "--lake", str(tmp_path))
    assert both.exit_code == 2 and "name the lake once: `replaylake compact LAKE`" in both.output
    for args in (("compact",), ("retain", "--older-than", "3"), ("lake", "check"),
                 ("lake", "salvage")):
        res = run(*args)
        assert res.exit_code == 2 and "missing the lake" in res.output, (args, res.output)


def test_export_summary_and_option_mismatch_speak_the_clis_terms(tmp_path: Path) -> None:
    out = str(tmp_path / "e")
    res = run("export", "--lake", lake(), "--out", out, "--no-progress", "--rows-per-shard", "2")
    assert res.exit_code == 0, res.output
    rows = int(re.search(r"exported ([\d,]+) rows", res.output).group(1).replace(",", ""))
    assert f"exported {rows:,} rows" in res.output
    again = run("export", "--lake", lake(), "--out", out, "--no-progress", "--steps", "2:3")
    assert again.exit_code == 2
    assert "--steps all there, 2:3 now" in again.output
    assert "--rows-per-shard 2 there, 4096 now" in again.output
    assert "None" not in again.output
    assert [_option_value("steps", v) for v in ([5, None], [None, 9], [4, 4])] == ["5:", ":9", "4"]
