"""Rows of a group whose registration is not in the lake are damage (no crash leaves them), read
the same way by restore, `lake check` and SQL; only where `lake salvage` set group events aside
does a restore skip them, and then the `no_orphan_rows` audit still lists them."""
from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from jobs.audit import run_audits
from jobs.cli import app
from pipeline import ReplayBuffer
from pipeline.analysis.views import connect, read_lake
from pipeline.lake.damage import check
from pipeline.lake.files import QUARANTINE_DIR, sum_path
from pipeline.lake.read import LakeDamageError
from pipeline.lake.recovery import salvage
from pipeline.lake.writer import segment_files
from sql.loader import run
from tests.support.lake import add_group, traj
from tests.support.lake_damage import write_ends, zero_bytes

cli = CliRunner()


def copied_mid_write(buf: ReplayBuffer, lake, copy) -> None:
    """Copy ``lake`` as a copy tool beside a running buffer may: the train group events copied
    before `late` was registered, the trajectories after `late` sent its two."""
    seg = max(segment_files(lake, "group_events", ["train"]))
    early = {p: p.read_bytes() for p in (seg, sum_path(seg))}
    buf.register(partition="train", uids=["late"], global_steps=1, n=2)
    buf.put([traj("late", 0), traj("late", 1)])
    shutil.copytree(lake, copy)
    for p, data in early.items():
        (copy / p.relative_to(lake)).write_bytes(data)


def test_rows_of_a_group_whose_registration_is_gone_are_damage_outside_a_salvage(tmp_path):
    lake, copy = tmp_path / "lake", tmp_path / "copy"
    with ReplayBuffer.sync(lake=lake) as buf:
        add_group(buf, "a", 1, [0.0, 1.0], n=2)
        copied_mid_write(buf, lake, copy)
    where = copy / "group_events" / "partition=train"
    with pytest.raises(LakeDamageError, match="2 trajectories row") as err:
        ReplayBuffer.sync(lake=copy)
    assert err.value.path == where and "group 'late', trajectories seq" in str(err.value)
    del err
    with pytest.raises(LakeDamageError, match="registration is not in the lake"):
        connect(copy)
    with pytest.raises(LakeDamageError, match="registration is not in the lake"):
        read_lake(copy)                             # the in-memory reader (what-if) too
    res = cli.invoke(app, ["lake", "check", "--lake", str(copy)])
    assert res.exit_code == 1 and f"orphans  {where} @ byte 0" in res.output

    res = cli.invoke(app, ["lake", "salvage", "--lake", str(copy)])
    assert res.exit_code == 0 and "set aside 2 row(s)" in res.output
    [listing] = (copy / QUARANTINE_DIR).rglob("orphans.json")
    assert json.loads(listing.read_text())["rows"]["trajectories"] == [
        {"uid": "late", "seq": s} for s in (6, 7)]
    assert check(copy).damaged == []
    with ReplayBuffer.sync(lake=copy) as buf:
        assert buf.lookup("train", "late") is None and buf.counts("train")["finished"] == 1
    audits = {a.name: a for a in run_audits(copy, 1)}
    assert audits["no_orphan_rows"].status == "FAIL"
    assert [r["uid"] for r in audits["no_orphan_rows"].rows] == ["late"]


def test_a_salvage_in_one_partition_does_not_excuse_orphans_in_another(tmp_path):
    lake, copy = tmp_path / "lake", tmp_path / "copy"
    with ReplayBuffer.sync(lake=lake) as buf:
        add_group(buf, "x", 1, [0.0, 1.0], partition="val")
    [val] = segment_files(lake, "group_events", ["val"])
    zero_bytes(val, write_ends(val)[0] + 5, 4)      # x's `running`: salvaged in val
    salvage(lake)
    with ReplayBuffer.sync(lake=lake) as buf:
        add_group(buf, "a", 1, [0.0, 1.0])
        copied_mid_write(buf, lake, copy)
    with pytest.raises(LakeDamageError, match="of partition 'train'"):
        ReplayBuffer.sync(lake=copy)


def test_sql_reads_a_salvaged_partition_the_way_a_restore_does(tmp_path):
    lake = tmp_path / "lake"
    with ReplayBuffer.sync(lake=lake) as buf:
        for uid in ("a", "b"):
            add_group(buf, uid, 1, [0.0, 1.0], n=2)
    [seg] = segment_files(lake, "group_events")
    zero_bytes(seg, write_ends(seg)[2] + 5, 4)      # b's registration
    assert salvage(lake).lost_writes == 1
    con = connect(lake)                             # read on, as a restore does ...
    assert con.sql("select uid from groups").fetchall() == [("a",)]
    lost = run(con, "no_orphan_rows").select(["uid", "table_name"]).to_pylist()
    assert lost == [{"uid": "b", "table_name": "trajectories"},      # ... and the audit says
                    {"uid": "b", "table_name": "group_events"}]      # what is lost
