"""A segment whose writer's log is gone is damage, not a pile of uncommitted calls: copy and sync
tools that skip `_`-prefixed paths leave `_log/` behind, and without it every multi-partition
call would read as never made. Restore, `lake check`, SQL and compaction refuse it alike."""
from __future__ import annotations

import shutil

import pytest
from typer.testing import CliRunner

from jobs.cli import app
from pipeline import ReplayBuffer
from pipeline.analysis.views import connect
from pipeline.lake.compaction import compact
from pipeline.lake.damage import check
from pipeline.lake.files import LOG_DIR
from pipeline.lake.read import LakeDamageError
from pipeline.lake.recovery import salvage
from pipeline.lake.writer import read_table, segment_files
from tests.support.lake import add_group, traj

cli = CliRunner()


def two_partition_puts(lake, groups: int = 50) -> None:
    """Each call spans train and val: tagged batches, committed in the writer's log."""
    with ReplayBuffer.sync(lake=lake) as buf:
        for i in range(groups):
            buf.register({"partition": ["train", "val"], "uid": [f"t{i}", f"v{i}"],
                          "global_steps": [1, 1], "n": [1, 1]})
            buf.put([traj(f"t{i}", 0), traj(f"v{i}", 0, partition="val")])


def test_a_lake_copied_without_its_log_is_refused_not_read_as_uncommitted(tmp_path):
    lake, copy = tmp_path / "lake", tmp_path / "copy"
    two_partition_puts(lake)
    shutil.copytree(lake, copy, ignore=shutil.ignore_patterns("_*"))   # a hidden-file habit
    first = segment_files(copy, "trajectories")[0]
    with pytest.raises(LakeDamageError, match=f"{LOG_DIR} directory back") as err:
        ReplayBuffer.sync(lake=copy)
    assert err.value.path == first
    del err
    with pytest.raises(LakeDamageError):
        connect(copy)
    res = cli.invoke(app, ["lake", "check", "--lake", str(copy)])
    assert res.exit_code == 1 and f"unlogged  {first} @ byte 0" in res.output
    with pytest.raises(LakeDamageError):
        compact(copy)                               # would have dropped every tagged batch
    assert all(p.suffix == ".arrow" for t in ("trajectories", "group_events")
               for p in segment_files(copy, t))

    shutil.copytree(lake / LOG_DIR, copy / LOG_DIR)  # copied back: everything is there
    assert read_table(copy, "trajectories").num_rows == 100
    assert connect(copy).sql("select count(*) from trajectories").fetchall() == [(100,)]


def test_only_the_writer_whose_log_is_gone_is_refused(tmp_path):
    lake = tmp_path / "lake"
    two_partition_puts(lake, 2)
    first_logs = sorted((lake / LOG_DIR).iterdir())
    with ReplayBuffer.sync(lake=lake) as buf:       # a second writer: single-partition calls
        add_group(buf, "later", 1, [0.0, 1.0])
    for p in first_logs:
        p.unlink()
    found = check(lake).damaged
    first_writer = first_logs[0].name[len("log-"):len("log-") + 12]
    assert {f.kind for f in found} == {"unlogged"} and len(found) == 4
    assert {f.path.name.split("-")[2][:12] for f in found} == {first_writer}


def test_salvage_of_a_lost_log_reads_that_writers_open_calls_as_lost_and_counts_them(tmp_path):
    lake = tmp_path / "lake"
    two_partition_puts(lake, 3)                     # 3 registers, 3 puts: 12 tagged batches
    first_logs = sorted((lake / LOG_DIR).iterdir())
    with ReplayBuffer.sync(lake=lake) as buf:
        add_group(buf, "single", 1, [0.0, 1.0])
    for p in first_logs:
        p.unlink()
    report = salvage(lake)
    assert report.lost_writes == 12                 # its calls' batches, in both partitions
    assert check(lake).damaged == []
    with ReplayBuffer.sync(lake=lake) as buf:
        assert buf.partitions() == ["train"] and buf.lookup("train", "single") is not None
