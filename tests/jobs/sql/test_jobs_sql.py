"""Smoke tests of `replaylake sql` and `replaylake audit` through the real CLI app."""
from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from jobs.cli import app
from sql.loader import in_folder
from tests.analysis.test_audits import _second_terminal
from tests.support.sql_runs import shared_run

cli = CliRunner()


def test_sql_prints_a_table_of_an_ad_hoc_query() -> None:
    lake = shared_run("async").lake
    res = cli.invoke(app, ["sql", "--lake", str(lake),
                           "select fate, count(*) as n from groups group by fate order by fate"])
    assert res.exit_code == 0, res.output
    assert "sampled" in res.output and "(3 rows)" in res.output


def test_sql_runs_a_named_query_with_params_as_csv_and_json() -> None:
    r = shared_run("async")
    b = r.batches[0]
    res = cli.invoke(app, ["sql", "--lake", str(r.lake), "--name", "batch_contents",
                           "--param", f"batch_id={b.batch_id}", "--format", "csv"])
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(io.StringIO(res.output)))
    assert [x["uid"] for x in rows] == b.table["uid"].to_pylist()
    res = cli.invoke(app, ["sql", "--lake", str(r.lake), "--name", "lineage",
                           "--param", f"uid={b.uids[0]}", "--format", "json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)[-1]["stage"] == "verdict"


def test_a_map_column_prints_as_an_object() -> None:
    lake = shared_run("async").lake
    res = cli.invoke(app, ["sql", "--lake", str(lake), "--name", "decision_log", "--format", "json"])
    assert res.exit_code == 0, res.output
    by_reason = [r["evicted_by_reason"] for r in json.loads(res.output)]
    assert {"zero_variance", "stale"} <= {k for m in by_reason for k in m}
    assert all(isinstance(m, dict) and all(isinstance(n, int) for n in m.values())
               for m in by_reason)


def test_sql_lists_the_named_queries() -> None:
    res = cli.invoke(app, ["sql", "--list"])
    assert res.exit_code == 0 and "stale(step BIGINT, threshold BIGINT, tightest BIGINT)" in res.output


def test_sql_refuses_writes_and_reports_bad_params(tmp_path: Path) -> None:
    lake = shared_run("sync").lake
    res = cli.invoke(app, ["sql", "--lake", str(lake), f"copy groups to '{tmp_path}/x.csv'"])
    assert res.exit_code == 2 and not (tmp_path / "x.csv").exists()
    res = cli.invoke(app, ["sql", "--lake", str(lake), "--name", "lineage"])
    assert res.exit_code == 2 and "missing uid" in res.output
    res = cli.invoke(app, ["sql", "--lake", str(lake), "--name", "batch_contents",
                           "--param", "batch_id=x"])
    assert res.exit_code == 2 and "not a BIGINT" in res.output
    res = cli.invoke(app, ["sql", "--lake", str(lake), "--name", "nope"])
    assert res.exit_code == 2 and "unknown query 'nope'" in res.output


def test_audit_passes_on_a_real_run_and_fails_on_a_tampered_lake(tmp_path: Path) -> None:
    r = shared_run("async")
    res = cli.invoke(app, ["audit", "--lake", str(r.lake), "--threshold", str(r.threshold)])
    assert res.exit_code == 0, res.output
    every = f"{len(in_folder('audits'))} passed, 0 failed, 0 skipped"
    assert every in res.output
    res = cli.invoke(app, ["audit", "--lake", str(r.lake)])      # the lake's recorded threshold
    assert res.exit_code == 0 and every in res.output
    lake = tmp_path / "lake"
    shutil.copytree(r.lake, lake)
    _second_terminal(lake)
    res = cli.invoke(app, ["audit", "--lake", str(lake), "--threshold", str(r.threshold)])
    assert res.exit_code == 1
    assert "FAIL  no_double_terminal" in res.output
