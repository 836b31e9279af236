"""The export job: trained rows out as shards, read back identically, resumable after a kill."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from jobs.cli import app
from jobs.export.main import ExportConfig, ExportError, export, parse_steps
from pipeline import ReplayBuffer
from pipeline.to_torch.convert import batch_to_torch
from tests.support.lake import ROOT
from tests.support.torch_reference import assert_same_tensors, sampled_lake


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[pa.Table]]]:
    """A lake of 6 trained steps (train every step, val every other step) and its Batch tables."""
    root = tmp_path_factory.mktemp("export") / "lake"
    return root, sampled_lake(root, steps=6)


def _config(lake_dir: Path, out: Path, **kw) -> ExportConfig:
    return ExportConfig(lake=lake_dir, out=out, progress=False, **kw)


def _shards(out: Path, partition: str, suffix: str = "parquet") -> list[Path]:
    return sorted((out / partition).glob(f"shard-*.{suffix}"))


def test_export_round_trips_through_polars_and_duckdb(lake, tmp_path: Path) -> None:
    lake_dir, batches = lake
    result = export(_config(lake_dir, tmp_path / "out", rows_per_shard=5))
    for partition in ("train", "val"):
        want = pa.concat_tables(batches[partition])
        files = _shards(tmp_path / "out", partition)
        assert len(files) == -(-want.num_rows // 5)
        got = pl.read_parquet(files)
        assert got.equals(pl.from_arrow(want))
        con = duckdb.connect()
        con.register("want", want)
        glob = str(tmp_path / "out" / partition / "*.parquet")
        exported = f"read_parquet('{glob}', filename = true, file_row_number = true)"
        assert con.execute(f"select count(*) from {exported}").fetchall() == [(want.num_rows,)]
        for a, b in ((f"(select * exclude (filename, file_row_number) from {exported})", "want"),
                     ("want", f"(select * exclude (filename, file_row_number) from {exported})")):
            assert con.execute(f"select count(*) from (select * from {a} except all "
                               f"select * from {b})").fetchall() == [(0,)]
        order = con.execute(f"select seq from {exported} order by filename, file_row_number"
                            ).fetchall()
        assert [s for (s,) in order] == want.column("seq").to_pylist()
    assert result["partitions"]["train"]["steps"] == [1, 6]
    assert result["complete"] and result["written"] == len(result["shards"])


def test_a_shard_is_written_a_row_group_at_a_time_in_plan_order(tmp_path: Path) -> None:
    """Rows of about 360 kB, a lake segment per call, 1 MB row groups: each shard is gathered
    from several lake files into several row groups, and reads back as the trainer's batches."""
    batches = sampled_lake(tmp_path / "lake", steps=4, roll_bytes=1, min_response=40_000)
    export(_config(tmp_path / "lake", tmp_path / "out", rows_per_shard=7, row_group_mb=1))
    files = _shards(tmp_path / "out", "train")
    groups = [pq.ParquetFile(f).metadata.num_row_groups for f in files]
    assert len(files) == 3 and min(groups[:-1]) >= 2, groups
    assert pl.read_parquet(files).equals(pl.from_arrow(pa.concat_tables(batches["train"])))


def test_only_groups_handed_to_the_trainer_are_exported(lake, tmp_path: Path) -> None:
    lake_dir, batches = lake
    export(_config(lake_dir, tmp_path / "out", partitions=("train",)))
    got = pq.read_table(_shards(tmp_path / "out", "train"))
    trained = {u for t in batches["train"] for u in t.column("uid").to_pylist()}
    assert set(got.column("uid").to_pylist()) == trained
    assert "train-6-2" not in trained          # registered, finished, never sampled
    assert not (tmp_path / "out" / "val").exists()


def test_steps_and_partition_options_choose_the_rows(lake, tmp_path: Path) -> None:
    lake_dir, batches = lake
    manifest = export(_config(lake_dir, tmp_path / "out", partitions=("train",), steps=(2, 4)))
    got = pq.read_table(_shards(tmp_path / "out", "train"))
    assert got.equals(pa.concat_tables(batches["train"][1:4]))
    assert manifest["source_steps"] == [2, 4]
    assert manifest["selection"]["steps"] == [2, 4]


def test_pt_shards_hold_the_tensors_of_batch_to_torch(lake, tmp_path: Path) -> None:
    lake_dir, batches = lake
    export(_config(lake_dir, tmp_path / "out", partitions=("train",), formats=("parquet", "pt"),
                   tensor_layout="padded", pad_token_id=5, rows_per_shard=4))
    for parquet, pt in zip(_shards(tmp_path / "out", "train"),
                           _shards(tmp_path / "out", "train", "pt"), strict=True):
        rows = pq.read_table(parquet)
        want = batch_to_torch(rows, layout="padded", pad_token_id=5)
        want["batch_id"] = torch.tensor(rows.column("batch_id").to_pylist())
        want["step"] = torch.tensor(rows.column("step").to_pylist())
        assert_same_tensors(torch.load(pt), want)


def test_manifest_lists_every_shard_with_checksums_and_schema(lake, tmp_path: Path) -> None:
    lake_dir, _ = lake
    export(_config(lake_dir, tmp_path / "out", rows_per_shard=4))
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["complete"] is True
    assert {f["name"] for f in manifest["schema"]} >= {"prompt_ids", "batch_id", "staleness"}
    assert sum(s["rows"] for s in manifest["shards"]) == sum(
        p["rows"] for p in manifest["partitions"].values())
    import hashlib
    for shard in manifest["shards"]:
        f = shard["files"]["parquet"]
        data = (tmp_path / "out" / f["path"]).read_bytes()
        assert len(data) == f["bytes"] and hashlib.sha256(data).hexdigest() == f["sha256"]
        assert pq.ParquetFile(tmp_path / "out" / f["path"]).metadata.num_rows == shard["rows"]


_DYING_EXPORT = """
    import os, signal, sys
    from pathlib import Path
    import pyarrow.parquet as pq
    import jobs.export.main as ex

    calls = [0]

    class WriteThenDie(pq.ParquetWriter):      # a shard's Parquet file is written through one
        def close(self):
            was_open = self.is_open
            super().close()
            if not was_open:
                return
            calls[0] += 1
            if calls[0] == int(sys.argv[3]):    # leave half a file, then die like `kill -9`
                data = Path(self.where).read_bytes()
                Path(self.where).write_bytes(data[: len(data) // 2])
                os.kill(os.getpid(), signal.SIGKILL)

    ex.pq.ParquetWriter = WriteThenDie
    ex.export(ex.ExportConfig(lake=Path(sys.argv[1]), out=Path(sys.argv[2]), rows_per_shard=3,
                              progress=False))
"""


def test_an_export_killed_mid_shard_resumes_and_skips_the_finished_shards(lake,
                                                                          tmp_path: Path) -> None:
    lake_dir, batches = lake
    out = tmp_path / "out"
    script = tmp_path / "dying_export.py"
    script.write_text(textwrap.dedent(_DYING_EXPORT))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, str(script), str(lake_dir), str(out), "3"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] is False and len(manifest["shards"]) == 2
    assert list(out.glob("train/.shard-00002.parquet.tmp-*"))      # the torn temporary file
    kept = {p: p.stat().st_mtime_ns for p in out.glob("train/shard-0000[01].*")}
    assert len(kept) == 2

    result = export(_config(lake_dir, out, rows_per_shard=3))
    assert result["skipped"] == 2 and result["written"] == len(result["shards"]) - 2
    assert {p: p.stat().st_mtime_ns for p in kept} == kept          # finished shards untouched
    assert not list(out.glob("**/.*.tmp-*"))
    for partition in ("train", "val"):
        got = pq.read_table(_shards(out, partition))
        assert got.equals(pa.concat_tables(batches[partition]))


def test_a_rerun_writes_nothing_and_a_damaged_shard_is_rewritten(lake, tmp_path: Path) -> None:
    lake_dir, batches = lake
    cfg = _config(lake_dir, tmp_path / "out", partitions=("train",), rows_per_shard=4)
    first = export(cfg)
    again = export(cfg)
    assert again["written"] == 0 and again["skipped"] == len(first["shards"])
    damaged = _shards(tmp_path / "out", "train")[1]
    damaged.write_bytes(damaged.read_bytes()[:100])
    fixed = export(cfg)
    assert fixed["written"] == 1
    assert pq.read_table(_shards(tmp_path / "out", "train")).equals(
        pa.concat_tables(batches["train"]))


def test_rows_dropped_by_a_reissue_are_not_exported(tmp_path: Path) -> None:
    lake_dir = tmp_path / "lake"

    def traj(session: int, response: list[int]) -> dict:
        return {"partition": "train", "uid": "g", "session_id": session, "min_global_steps": 0,
                "max_global_steps": 0, "reward": 1.0, "prompt_ids": [1],
                "response_ids": response}

    with ReplayBuffer.sync(lake=lake_dir, poll_interval=0.05) as buf:
        buf.register(partition="train", uids=["g"], global_steps=1, n=2)
        buf.put([traj(0, [9, 9, 9])])                # partial: the rollout worker then dies
    with ReplayBuffer.sync(lake=lake_dir, poll_interval=0.05) as buf:
        assert buf.reissue(2) == {"train": ["g"]}
        buf.put([traj(0, [4]), traj(1, [5])])
        buf.update_status(partition="train", uids=["g"], status="running")
        buf.update_status(partition="train", uids=["g"], status="finished")
        batch = buf.sample(2, "train", 1)
    export(_config(lake_dir, tmp_path / "out"))
    got = pq.read_table(_shards(tmp_path / "out", "train"))
    assert got.equals(batch.table)
    assert got.column("response_ids").to_pylist() == [[4], [5]]
    assert got.column("global_steps").to_pylist() == [2, 2]


def test_unknown_partition_error_names_it_and_the_known_ones(lake, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="unknown partition.*'nope'.*train, val"):
        export(_config(lake[0], tmp_path / "out", partitions=("train", "nope")))


def test_unknown_step_error_names_the_step_and_the_trained_range(lake, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=r"unknown step 99 .*trained steps 1\.\.6"):
        export(_config(lake[0], tmp_path / "out", steps=(2, 99)))
    with pytest.raises(ExportError, match=r"unknown step 0 "):
        export(_config(lake[0], tmp_path / "out", steps=(0, 0)))
    with pytest.raises(ExportError, match="first step is after the last"):
        _config(lake[0], tmp_path / "out", steps=(4, 2))


def test_steps_option_accepts_ranges_single_steps_and_open_ends() -> None:
    assert parse_steps("2:5") == (2, 5)
    assert parse_steps("3") == (3, 3)
    assert parse_steps("3:") == (3, None)
    assert parse_steps(":4") == (None, 4)
    with pytest.raises(ExportError, match="A:B"):
        parse_steps("two")


def test_an_out_directory_of_another_export_is_refused(lake, tmp_path: Path) -> None:
    export(_config(lake[0], tmp_path / "out", rows_per_shard=4))
    with pytest.raises(ExportError, match="other options \\(--rows-per-shard 4 there, 8 now\\)"):
        export(_config(lake[0], tmp_path / "out", rows_per_shard=8))


def test_an_out_directory_holding_another_lakes_export_is_refused(lake, tmp_path: Path) -> None:
    """Same options, another lake: refused, its shards kept (like runs hold like sequence
    numbers, so a shard's rows key alone could take the other lake's rows as done)."""
    other = tmp_path / "other"
    shutil.copytree(lake[0], other)
    export(_config(lake[0], tmp_path / "out", rows_per_shard=4))
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file()}
    with pytest.raises(ExportError, match=rf"holds an export of another lake \({lake[0].resolve()}\)"):
        export(_config(other, tmp_path / "out", rows_per_shard=4))
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file()} == before


def test_cli_export_runs_and_reports_errors_with_exit_code_2(lake, tmp_path: Path) -> None:
    runner = CliRunner()
    ok = runner.invoke(app, ["export", "--lake", str(lake[0]), "--out", str(tmp_path / "out"),
                             "--partition", "val", "--steps", "1:5", "--format", "parquet",
                             "--format", "pt", "--no-progress"])
    assert ok.exit_code == 0, ok.output
    assert "exported 6 rows" in ok.output
    assert _shards(tmp_path / "out", "val", "pt")
    bad = runner.invoke(app, ["export", "--lake", str(lake[0]), "--out", str(tmp_path / "o2"),
                              "--partition", "nope"])
    assert bad.exit_code == 2
    assert "unknown partition" in bad.output


def test_a_shard_with_one_flipped_byte_is_found_by_its_sha256_and_rewritten(lake,
                                                                            tmp_path: Path) -> None:
    lake_dir, batches = lake
    cfg = _config(lake_dir, tmp_path / "out", partitions=("train",), rows_per_shard=4)
    export(cfg)
    shard = _shards(tmp_path / "out", "train")[1]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01                 # same size, one bit different
    shard.write_bytes(bytes(data))
    fixed = export(cfg)
    assert fixed["written"] == 1 and fixed["repaired"] == 1
    assert pq.read_table(_shards(tmp_path / "out", "train")).equals(
        pa.concat_tables(batches["train"]))
    again = export(cfg)
    assert (again["written"], again["repaired"]) == (0, 0)


def test_the_cli_says_how_many_shards_were_damaged_and_rewritten(lake, tmp_path: Path) -> None:
    args = ["export", "--lake", str(lake[0]), "--out", str(tmp_path / "out"), "--partition",
            "train", "--rows-per-shard", "4", "--no-progress"]
    assert CliRunner().invoke(app, args).exit_code == 0
    shard = _shards(tmp_path / "out", "train")[0]
    shard.write_bytes(shard.read_bytes()[::-1])
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "(1 written, 1 of them damaged and rewritten, " in result.output


@pytest.mark.parametrize(("text", "match"), [
    ("{not json", "cannot be read"),
    ("[]", "is not an export manifest"),
    ('{"shards": [{"partition": "train", "index": 0, "rows_key": "k", "files": '
     '{"parquet": {"path": "../../elsewhere.parquet", "bytes": 1, "sha256": "x"}}}]}',
     "is damaged: shard train/0: its parquet file is not at train/shard-00000.parquet"),
])
def test_a_damaged_manifest_is_refused_naming_it_and_nothing_is_deleted(lake, tmp_path: Path,
                                                                        text, match) -> None:
    cfg = _config(lake[0], tmp_path / "out", partitions=("train",), rows_per_shard=4)
    export(cfg)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    if text.startswith('{"shards"'):
        manifest["shards"] = json.loads(text)["shards"]
        text = json.dumps(manifest)
    (tmp_path / "out" / "manifest.json").write_text(text)
    (tmp_path / "elsewhere.parquet").write_text("not the export's\n")
    shards = _shards(tmp_path / "out", "train")
    with pytest.raises(ExportError, match=rf"{tmp_path / 'out' / 'manifest.json'}.*{match}"):
        export(cfg)
    assert _shards(tmp_path / "out", "train") == shards
    assert (tmp_path / "elsewhere.parquet").exists()


def test_an_out_directory_of_other_files_or_a_lake_is_refused(lake, tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / ".draft.tmp-1").write_text("keep me\n")
    with pytest.raises(ExportError, match="holds files but no export"):
        export(_config(lake[0], tmp_path / "mine"))
    assert (tmp_path / "mine" / ".draft.tmp-1").exists()
    with pytest.raises(ExportError, match="is a replaylake lake"):
        export(_config(lake[0], lake[0]))


def test_export_refuses_trained_steps_whose_payload_retention_dropped(tmp_path: Path) -> None:
    from pipeline.lake.retention import retain
    lake_dir = tmp_path / "lake"
    batches = sampled_lake(lake_dir, steps=6)
    kept = export(_config(lake_dir, tmp_path / "before", partitions=("train",),
                          rows_per_shard=4))
    report = retain(lake_dir, older_than=2)       # groups released at steps 1..4 lose their tokens
    assert report.horizon == 4 and report.rows > 0
    with pytest.raises(ExportError, match=r"trained rows hold no token payload \(partition "
                                          r"train: \d+ trajectories \(\d+ response tokens\) "
                                          r"trained at step\(s\) 1-4\).*`replaylake retain` "
                                          r"dropped it.*--steps 5:"):
        export(_config(lake_dir, tmp_path / "after", partitions=("train",)))
    assert not (tmp_path / "after" / "train").exists()          # refused before writing
    with pytest.raises(ExportError, match=r"step\(s\) 2-3\)"):
        export(_config(lake_dir, tmp_path / "after", partitions=("train",), steps=(2, 3)))
    export(_config(lake_dir, tmp_path / "late", partitions=("train",), steps=(5, 6)))
    assert pq.read_table(_shards(tmp_path / "late", "train")).equals(
        pa.concat_tables(batches["train"][4:6]))           # the steps retention kept, whole
    resumed = export(_config(lake_dir, tmp_path / "before", partitions=("train",),
                             rows_per_shard=4))
    assert resumed["skipped"] == len(kept["shards"]) and resumed["written"] == 0
