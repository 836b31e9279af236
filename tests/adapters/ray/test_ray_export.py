"""`replaylake export --ray`: Ray Data reads the lake and the export equals the in-process one."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from jobs.cli import app
from jobs.export.ray import lake_dataset
from pipeline.lake.compaction import compact
from pipeline.lake.writer import read_table
from tests.lake.test_compact_crash import kill
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


@pytest.mark.parametrize("job, point", [("compact", "compact.renamed:1"),
                                        ("retain", "retain.renamed:1")])
def test_ray_data_counts_each_row_once_beside_the_leftovers_of_a_killed_job(lake, tmp_path,
                                                                             job, point):
    """A compaction killed with the Parquet copy in place and its segment not yet deleted, a
    retention killed with its rewrite in place and the file it rewrote not yet deleted: both
    files of the segment are on disk, and its rows count once."""
    killed = shutil.copytree(lake, tmp_path / "lake")
    if job == "retain":
        compact(killed)
    kill(job, killed, point)
    for table in ("trajectories", "group_events", "decisions"):
        rows = sorted(r["seq"] for r in lake_dataset(killed, table).take_all())
        assert rows == read_table(killed, table).column("seq").to_pylist()
        assert rows == read_table(lake, table).column("seq").to_pylist()
