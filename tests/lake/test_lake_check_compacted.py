"""`lake check` on a compacted lake: a segment whose Parquet copy is in place (a compaction
stopped before it deleted the segment, or that is deleting it right now) is a leftover, never
damage, and is not read twice; the next compaction removes every such leftover."""
from __future__ import annotations

import shutil
import threading
from pathlib import Path

from typer.testing import CliRunner

from jobs.cli import app
from pipeline.lake.compaction import compact
from pipeline.lake.damage import check
from pipeline.lake.files import sum_path
from pipeline.lake.writer import segment_files
from schemas import LAKE_TABLES
from tests.support.lake import lake_history
from tests.support.sql_runs import simulate_async

cli = CliRunner()


def segments(lake: Path) -> list[Path]:
    return [p for t in LAKE_TABLES for p in segment_files(lake, t) if p.suffix == ".arrow"]


def compacted_with_leftovers(tmp_path: Path) -> tuple[Path, list[Path]]:
    """A compacted lake with its segments put back beside their Parquet copies, as a
    compaction killed after its renames leaves it."""
    lake, keep = tmp_path / "lake", tmp_path / "keep"
    simulate_async(lake, steps=4)
    shutil.copytree(lake, keep)
    compact(lake)
    back = []
    for p in segments(keep):
        dest = lake / p.relative_to(keep)
        shutil.copy(p, dest)
        shutil.copy(sum_path(p), sum_path(dest))
        back.append(dest)
    return lake, back


def test_a_segment_beside_its_parquet_copy_is_a_leftover_not_read_twice(tmp_path):
    lake, back = compacted_with_leftovers(tmp_path)
    clean = tmp_path / "clean"
    shutil.copytree(lake, clean)
    for p in segments(clean):
        p.unlink()
        sum_path(p).unlink()
    report = check(lake)
    assert report.damaged == []
    assert sorted(f.path for f in report.findings if f.kind == "compacted") == sorted(back)
    baseline = check(clean)
    assert (report.streams, report.acknowledged_bytes) == (baseline.streams,
                                                           baseline.acknowledged_bytes)
    res = cli.invoke(app, ["lake", "check", "--lake", str(lake)])
    assert res.exit_code == 0, res.output
    assert "compacted" in res.output


def test_a_checksum_file_left_by_a_compaction_stopped_mid_delete_is_not_damage(tmp_path):
    lake, back = compacted_with_leftovers(tmp_path)
    before = lake_history(lake)
    for p in back:
        p.unlink()                     # the segment went, its checksum file did not
    report = check(lake)
    assert report.damaged == [], report.findings
    assert len([f for f in report.findings if f.kind == "compacted"]) == len(back)
    assert compact(lake).cleaned == len(back)
    assert [p for p in lake.rglob("*.crc") if "_log" not in p.parts] == []
    assert check(lake).findings == []
    assert lake_history(lake) == before


def test_check_while_a_compaction_runs_never_reports_damage(tmp_path):
    lake = tmp_path / "lake"
    simulate_async(lake, steps=8, surplus=1)
    found: list = []
    done = threading.Event()

    def run() -> None:
        try:
            compact(lake)
        finally:
            done.set()

    t = threading.Thread(target=run)
    t.start()
    rounds = 0
    while not done.is_set() or rounds == 0:
        found += check(lake).damaged
        rounds += 1
    t.join()
    assert found == []
    assert segments(lake) == [] and check(lake).findings == []
