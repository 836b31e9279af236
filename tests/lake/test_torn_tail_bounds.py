"""A torn tail is at most the one write a crash interrupted: bytes past a stream's last checksum
record that hold more than one write, or follow its end-of-stream marker, are a checksum file
that lost records, and every reader (restore, `lake check`, SQL, compaction) refuses them alike.

A copy of a lake taken while its buffer is open is what `kill -9` at that moment leaves (the
writer keeps nothing in user space), so the crash states below are built from such copies."""
from __future__ import annotations

import shutil
import threading

import pytest
from typer.testing import CliRunner

from jobs.cli import app
from pipeline import ReplayBuffer
from pipeline.lake.compaction import compact
from pipeline.lake.damage import check
from pipeline.lake.files import sum_path
from pipeline.lake.read import LakeDamageError
from pipeline.lake.recovery import salvage
from pipeline.lake.verify import verify
from pipeline.lake.writer import read_table, segment_files
from tests.support.lake import add_group
from tests.support.lake_damage import cut_records, write_ends

cli = CliRunner()


def fifty_groups(lake) -> None:
    with ReplayBuffer.sync(lake=lake) as buf:
        for i in range(50):
            add_group(buf, f"g{i:02d}", 1, [0.0, 1.0], n=2)


def crash_image(tmp_path, groups: int):
    """The lake as a kill -9 after ``groups`` groups leaves it (streams open, no end marker)."""
    lake, image = tmp_path / "live", tmp_path / "image"
    buf = ReplayBuffer.sync(lake=lake)
    try:
        for i in range(groups):
            add_group(buf, f"g{i}", 1, [0.0, 1.0], n=2)
        shutil.copytree(lake, image)
    finally:
        buf.close()
    return image


def test_a_checksum_file_cut_to_nothing_is_damage_not_a_torn_tail(lake):
    fifty_groups(lake)
    [seg] = segment_files(lake, "group_events")
    cut_records(seg)                                 # 151 acknowledged writes, no record left
    with pytest.raises(LakeDamageError) as err:
        ReplayBuffer.sync(lake=lake)
    assert (err.value.path, err.value.offset) == (seg, 0)
    assert f"its checksum file {sum_path(seg).name} lost records" in str(err.value)
    del err
    res = cli.invoke(app, ["lake", "check", "--lake", str(lake)])
    assert res.exit_code == 1 and f"damage  {seg} @ byte 0: the " in res.output
    res = cli.invoke(app, ["sql", "--lake", str(lake), "select count(*) from trajectories"])
    assert res.exit_code == 2 and "lost records" in res.output
    with pytest.raises(LakeDamageError):
        compact(lake)                               # would have made the loss permanent
    assert segment_files(lake, "group_events") == [seg]

    report = salvage(lake)                          # the writes cannot be verified: lost
    assert (report.kept_writes, report.lost_writes) == (0, 150)
    assert check(lake).damaged == []


def test_bytes_after_the_end_of_stream_marker_are_damage(lake):
    fifty_groups(lake)
    [seg] = segment_files(lake, "trajectories")
    size = seg.stat().st_size
    with open(seg, "ab") as f:
        f.write(b"\xff\xff\xff\xff\x10\x00\x00\x00torn")
    with pytest.raises(LakeDamageError, match="follow the end-of-stream marker") as err:
        read_table(lake, "trajectories")
    assert (err.value.path, err.value.offset) == (seg, size)


def test_the_end_of_stream_marker_alone_past_the_records_is_a_torn_tail(lake):
    fifty_groups(lake)                              # as if killed as close() wrote its marker
    [seg] = segment_files(lake, "group_events")
    cut_records(seg, 1)
    assert [f.kind for f in check(lake).findings] == ["torn"]
    with ReplayBuffer.sync(lake=lake) as buf:
        assert buf.counts("train")["finished"] == 50


def test_one_whole_write_past_the_last_record_is_a_torn_tail(tmp_path):
    image = crash_image(tmp_path, 3)                # killed between a write and its record:
    [seg] = segment_files(image, "group_events")    # g2's `finished` is on disk, unrecorded
    cut_records(seg, 1)
    v = verify(seg)
    assert v.torn == seg.stat().st_size - write_ends(seg)[-1] and not v.closed
    assert [f.kind for f in check(image).findings] == ["torn"]
    with ReplayBuffer.sync(lake=image) as buf:
        assert buf.lookup("train", "g2").status == "running"


def test_a_first_write_past_an_empty_checksum_file_is_a_torn_tail(tmp_path):
    image = crash_image(tmp_path, 1)                # killed before the first put's record:
    [seg] = segment_files(image, "trajectories")    # schema and batch, one write
    assert len(write_ends(seg)) == 1
    cut_records(seg)
    assert verify(seg).torn == seg.stat().st_size
    assert read_table(image, "trajectories").num_rows == 0


def test_two_writes_past_the_last_record_are_damage(tmp_path):
    image = crash_image(tmp_path, 3)
    [seg] = segment_files(image, "group_events")
    ends = write_ends(seg)
    cut_records(seg, 2)
    with pytest.raises(LakeDamageError, match="hold 2 whole write") as err:
        ReplayBuffer.sync(lake=image)
    assert (err.value.path, err.value.offset) == (seg, ends[-3])


def test_readers_beside_a_writer_never_take_its_writes_in_flight_for_damage(tmp_path):
    lake = tmp_path / "lake"
    buf = ReplayBuffer.sync(lake=lake)
    stop = threading.Event()
    groups = 0

    def produce() -> None:
        nonlocal groups
        while not stop.is_set():
            add_group(buf, f"w{groups}", 1, [0.0, 1.0])
            groups += 1

    producer = threading.Thread(target=produce)
    producer.start()
    checked = 0
    try:
        while checked < 300 or groups < 100:
            for seg in segment_files(lake, "group_events"):
                verify(seg)                          # raises on damage
                checked += 1
    finally:
        stop.set()
        producer.join()
        buf.close()
    assert check(lake).damaged == []
