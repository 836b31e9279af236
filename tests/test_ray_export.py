"""`replaylake export --ray`: Ray Data reads the lake and the export equals the in-process one."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from jobs.cli import app
from jobs.export_ray import lake_dataset
from pipeline.lake import read_table
from tests.support.torch_reference import sampled_lake

pytestmark = pytest.mark.usefixtures("ray_cluster")


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ray-export") / "lake"
    sampled_lake(root, steps=4)
    return root


def _export(lake: Path, out: Path, *extra: str) -> dict:
    res = CliRunner().invoke(app, ["export", "--lake", str(lake), "--out", str(out),
                                   "--rows-per-shard", "5", "--no-progress", *extra])
    assert res.exit_code == 0, res.output
    return json.loads((out / "manifest.json").read_text())


def test_export_with_ray_writes_the_shards_the_in_process_export_writes(lake, tmp_path):
    plain = _export(lake, tmp_path / "plain")
    on_ray = _export(lake, tmp_path / "ray", "--ray")
    assert plain["partitions"] == on_ray["partitions"]
    assert [s["rows_key"] for s in plain["shards"]] == [s["rows_key"] for s in on_ray["shards"]]
    for shard in plain["shards"]:
        path = shard["files"]["parquet"]["path"]
        assert pq.read_table(tmp_path / "plain" / path).equals(pq.read_table(tmp_path / "ray" / path))


@pytest.mark.parametrize("table", ["trajectories", "group_events", "decisions"])
def test_a_lake_table_read_with_ray_data_holds_the_rows_read_table_returns(lake, table):
    ds = lake_dataset(lake, table)
    rows = sorted(ds.take_all(), key=lambda r: r["seq"])
    expected = read_table(lake, table).to_pylist()
    assert [r["seq"] for r in rows] == [r["seq"] for r in expected]
    assert [r["uid"] for r in rows] == [r["uid"] for r in expected]
