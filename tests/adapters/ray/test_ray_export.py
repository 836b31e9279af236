"""`replaylake export --ray`: Ray Data reads the lake and the export equals the in-process one."""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
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
    sampled_lake(root, steps=4, roll_bytes=1)    # a segment per call: shards span lake files
    return root


def _export(lake: Path, out: Path, *extra: str) -> tuple[dict, str]:
    res = CliRunner().invoke(app, ["export", "--lake", str(lake), "--out", str(out),
                                   "--rows-per-shard", "5", "--no-progress", *extra])
    assert res.exit_code == 0, res.output
    return json.loads((out / "manifest.json").read_text()), res.output


def test_export_with_ray_writes_the_shards_the_in_process_export_writes(lake, tmp_path):
    plain, _ = _export(lake, tmp_path / "plain", "--format", "parquet", "--format", "pt")
    on_ray, said = _export(lake, tmp_path / "ray", "--ray", "--format", "parquet", "--format", "pt")
    assert plain["partitions"] == on_ray["partitions"]
    assert len(plain["shards"]) > 2                          # several shards, several tasks
    assert [s["rows_key"] for s in plain["shards"]] == [s["rows_key"] for s in on_ray["shards"]]
    for a, b in zip(plain["shards"], on_ray["shards"]):
        assert {k: a[k] for k in a if k != "files"} == {k: b[k] for k in b if k != "files"}
        assert a["files"]["parquet"] == b["files"]["parquet"]     # byte for byte (sha256)
        path = a["files"]["parquet"]["path"]
        assert pq.read_table(tmp_path / "plain" / path).equals(pq.read_table(tmp_path / "ray" / path))
        pt = a["files"]["pt"]["path"]
        ta, tb = torch.load(tmp_path / "plain" / pt), torch.load(tmp_path / "ray" / pt)
        assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)
    assert re.search(r"shards written by [1-9]\d* Ray worker process\(es\) on [1-9] node", said)


def test_ray_export_cuts_a_shard_into_the_same_row_groups(tmp_path):
    """Rows of about 360 kB and 1 MB row groups: both writers gather each shard a row group at a
    time, sized from the plan, and write the same bytes."""
    sampled_lake(tmp_path / "lake", steps=3, roll_bytes=1, min_response=40_000)
    plain, _ = _export(tmp_path / "lake", tmp_path / "plain", "--row-group-mb", "1")
    on_ray, _ = _export(tmp_path / "lake", tmp_path / "ray", "--ray", "--row-group-mb", "1")
    assert [s["files"] for s in plain["shards"]] == [s["files"] for s in on_ray["shards"]]
    first = tmp_path / "ray" / on_ray["shards"][0]["files"]["parquet"]["path"]
    assert pq.ParquetFile(first).metadata.num_row_groups >= 2


def test_ray_export_shards_are_written_by_workers_and_only_row_keys_reach_the_driver(lake,
                                                                                   tmp_path):
    from jobs.export.main import ExportConfig, export
    from jobs.export.ray import RayRows
    from jobs.export.rows import KEYS

    source = RayRows()
    plans: list[pa.Table] = []
    plan = source.plan
    source.plan = lambda *a: plans.append(plan(*a)) or plans[-1]   # record what the driver got
    result = export(ExportConfig(lake=lake, out=tmp_path / "out", rows_per_shard=5,
                                 progress=False), source)
    assert result["written"] == len(result["shards"]) > 2
    assert result["writers"] and all(pid != os.getpid() for _, pid in result["writers"])
    for keys in plans:                       # no payload column came to the driver
        assert keys.column_names == [*KEYS, "dropped", "nbytes", "block", "row"]
    assert max(len(refs) for refs in source.blocks.values()) > 3      # gathered across blocks
    again = export(ExportConfig(lake=lake, out=tmp_path / "out", rows_per_shard=5,
                                progress=False), RayRows())
    assert again["written"] == 0 and again["skipped"] == len(result["shards"])
    damaged = tmp_path / "out" / result["shards"][1]["files"]["parquet"]["path"]
    damaged.write_bytes(damaged.read_bytes()[:100])
    fixed = export(ExportConfig(lake=lake, out=tmp_path / "out", rows_per_shard=5,
                                progress=False), RayRows())
    assert fixed["written"] == fixed["repaired"] == 1
    assert pq.read_table(damaged).equals(pq.read_table(
        tmp_path / "out" / result["shards"][1]["files"]["parquet"]["path"]))


def test_ray_export_refuses_rows_whose_payload_retention_dropped_before_writing(lake, tmp_path):
    from pipeline.lake.retention import retain

    retained = shutil.copytree(lake, tmp_path / "lake")
    retain(retained, older_than=1)
    res = CliRunner().invoke(app, ["export", "--lake", str(retained), "--out",
                                   str(tmp_path / "out"), "--no-progress", "--ray"])
    assert res.exit_code == 2 and "`replaylake retain` dropped it" in res.output, res.output
    assert not list((tmp_path / "out").glob("*/shard-*"))      # refused before writing


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
