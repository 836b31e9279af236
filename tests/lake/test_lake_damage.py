"""Damage is refused, never read as a torn tail: a restore names the file and offset, `replaylake
lake check` lists it, and `salvage` sets it aside keeping every write that still verifies."""
from __future__ import annotations

import logging
import os

import pytest
from typer.testing import CliRunner

from jobs.cli import app
from pipeline import LakeError, ReplayBuffer
from pipeline.lake.damage import check
from pipeline.lake.files import QUARANTINE_DIR, sum_path
from pipeline.lake.read import LakeDamageError
from pipeline.lake.recovery import salvage
from pipeline.lake.writer import read_table, segment_files
from tests.support.lake import add_group
from tests.support.lake_damage import tear_last_write, write_ends, zero_bytes

cli = CliRunner()


def refusal(lake) -> LakeDamageError:
    """The error opening a damaged lake raises, without the failed buffer's frames (which would
    keep its writer, and so the lake's lock, alive as long as the error is)."""
    try:
        ReplayBuffer.sync(lake=lake)
    except LakeDamageError as exc:
        exc.__traceback__ = None
        return exc
    raise AssertionError(f"the damaged lake {lake} was opened")


def hundred_groups(lake, rewards=(0.0, 1.0)):
    with ReplayBuffer.sync(lake=lake) as buf:
        for i in range(100):
            add_group(buf, f"g{i:03d}", 1, rewards)


def test_zeroed_bytes_inside_a_segment_are_refused_naming_the_file_and_offset(lake):
    hundred_groups(lake)
    [seg] = segment_files(lake, "group_events")
    at = seg.stat().st_size // 10
    zero_bytes(seg, at, 16)
    err = refusal(lake)
    assert isinstance(err, LakeError) and err.path == seg
    start = max(e for e in [0, *write_ends(seg)] if e <= at)   # the damaged write's first byte
    assert err.offset == start
    assert f"{seg} is damaged at byte {start}: checksum mismatch" in str(err)
    with pytest.raises(LakeDamageError):            # every reader refuses, not only restore
        read_table(lake, "group_events")


def test_check_lists_the_damage_and_salvage_keeps_every_write_that_verifies(lake):
    hundred_groups(lake)
    [seg] = segment_files(lake, "group_events")
    ends = write_ends(seg)                          # 3 writes per group: registered, running,
    lost = 3 * 42 + 2                               # finished: damage g042's `finished`
    zero_bytes(seg, ends[lost - 1] + 5, 4)
    res = cli.invoke(app, ["lake", "check", "--lake", str(lake)])
    assert res.exit_code == 1, res.output
    assert f"damage  {seg} @ byte {ends[lost - 1]}: checksum mismatch" in res.output

    res = cli.invoke(app, ["lake", "salvage", "--lake", str(lake)])
    assert res.exit_code == 0, res.output
    assert f"kept {len(ends) - 1} acknowledged write(s) that verify; lost 1" in res.output
    [quarantined] = (lake / QUARANTINE_DIR).glob("*/group_events/partition=train/*/*.arrow")
    assert quarantined.read_bytes()[ends[lost - 1] + 5:ends[lost - 1] + 9] == b"\0" * 4
    assert check(lake).damaged == []
    assert cli.invoke(app, ["lake", "check", "--lake", str(lake)]).exit_code == 0

    events = read_table(lake, "group_events")
    assert events.num_rows == 299                   # only the damaged write is gone
    with ReplayBuffer.sync(lake=lake) as buf:
        assert buf.counts("train") == {"pending": 0, "running": 1, "finished": 99, "failure": 0,
                                       "sampled": 0}
        assert buf.lookup("train", "g042").status == "running"
        buf.update_status(partition="train", uids=["g042"], status="finished")   # sent again
        assert len(buf.sample(2, "train", 100)) == 200


def test_a_missing_segment_is_refused_and_salvage_records_the_loss(lake):
    with ReplayBuffer.sync(lake=lake) as buf:
        add_group(buf, "a", 1, [0.0, 1.0])
        add_group(buf, "b", 1, [0.0, 1.0], partition="val")
    [seg] = segment_files(lake, "trajectories", ["val"])
    seg.unlink()
    sum_path(seg).unlink()
    err = refusal(lake)
    assert err.path == seg and "missing" in str(err)
    assert [(f.kind, f.path) for f in check(lake).findings] == [("missing", seg)]
    report = salvage(lake)
    assert report.quarantined == [] and check(lake).damaged == []
    with ReplayBuffer.sync(lake=lake) as buf:       # b lost its rows: it is an empty group now
        assert buf.counts("train")["finished"] == 1 and buf.counts("val")["finished"] == 1
        assert read_table(lake, "trajectories")["uid"].to_pylist() == ["a", "a"]


def test_a_segment_without_its_checksum_file_is_refused(lake):
    with ReplayBuffer.sync(lake=lake) as buf:
        add_group(buf, "a", 1, [0.0, 1.0])
    [seg] = segment_files(lake, "trajectories")
    sum_path(seg).unlink()
    assert f"its checksum file {sum_path(seg).name} is missing" in str(refusal(lake))
    salvage(lake)                                   # unverifiable: quarantined whole
    assert list((lake / QUARANTINE_DIR).rglob(seg.name))
    with ReplayBuffer.sync(lake=lake) as buf:
        assert buf.counts("train")["finished"] == 1


def test_a_torn_tail_is_listed_but_is_not_damage(lake):
    with ReplayBuffer.sync(lake=lake) as buf:
        add_group(buf, "a", 1, [0.0, 1.0])
        add_group(buf, "b", 1, [0.0, 1.0])
    [seg] = segment_files(lake, "trajectories")
    tear_last_write(seg, 5)
    res = cli.invoke(app, ["lake", "check", "--lake", str(lake)])
    assert res.exit_code == 0, res.output
    assert "torn" in res.output and "0 damaged or missing" in res.output
    res = cli.invoke(app, ["lake", "salvage", "--lake", str(lake)])
    assert "nothing to salvage" in res.output
    assert not (lake / QUARANTINE_DIR).exists()


def test_salvage_refuses_while_a_buffer_has_the_lake_open(lake):
    with ReplayBuffer.sync(lake=lake) as buf:
        add_group(buf, "a", 1, [0.0, 1.0])
        [seg] = segment_files(lake, "trajectories")
        zero_bytes(seg, 20, 4)
        res = cli.invoke(app, ["lake", "salvage", "--lake", str(lake)])
        assert res.exit_code == 2 and "already open for writing" in res.output


def test_salvage_refuses_while_a_buffer_holds_the_lake_even_undamaged_naming_the_holder(lake):
    with ReplayBuffer.sync(lake=lake) as buf:
        add_group(buf, "a", 1, [0.0, 1.0])
        res = cli.invoke(app, ["lake", "salvage", "--lake", str(lake)])
        assert res.exit_code == 2, res.output
        assert f"already open for writing by pid {os.getpid()} on " in res.output
        assert "nothing to salvage" not in res.output


def test_a_damaged_compacted_file_is_refused_and_salvage_sets_it_aside(lake):
    from pipeline.lake.compaction import compact
    with ReplayBuffer.sync(lake=lake) as buf:
        add_group(buf, "a", 1, [0.0, 1.0])
        add_group(buf, "b", 1, [0.0, 1.0], partition="val")
    compact(lake)
    [pq_file] = segment_files(lake, "trajectories", ["val"])
    assert pq_file.suffix == ".parquet"
    zero_bytes(pq_file, pq_file.stat().st_size - 12, 8)            # the footer
    err = refusal(lake)
    assert err.path == pq_file and "Parquet file cannot be read" in str(err)
    assert [(f.kind, f.path) for f in check(lake).damaged] == [("damage", pq_file)]
    report = salvage(lake)
    assert [p.name for p in report.quarantined] == [pq_file.name]
    assert check(lake).damaged == []
    with ReplayBuffer.sync(lake=lake) as buf:          # b's rows are gone; a's are intact
        assert read_table(lake, "trajectories")["uid"].to_pylist() == ["a", "a"]
        assert buf.counts("val")["finished"] == 1


def test_a_lake_whose_salvage_lost_a_registration_restores_without_that_group(lake, caplog):
    hundred_groups(lake)
    [seg] = segment_files(lake, "group_events")
    ends = write_ends(seg)
    lost = 3 * 42                                   # g042's `registered` write
    zero_bytes(seg, ends[lost - 1] + 5, 4)
    salvage(lake)
    caplog.set_level(logging.WARNING, logger="replaylake")
    with ReplayBuffer.sync(lake=lake) as buf:
        assert buf.lookup("train", "g042") is None     # its later rows cannot be restored
        assert buf.counts("train")["finished"] == 99
    assert any("registration is not in the lake" in r.getMessage() for r in caplog.records)
