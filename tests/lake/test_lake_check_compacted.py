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


def test_a_flipped_bit_in_a_compacted_file_is_damage_not_other_values(tmp_path):
    """A compacted file records the checksum of its rows (and Parquet's per page): a bit flipped
    in them, or in the footer's column names or types, is found by `lake check` and refused by
    every reader, never decoded to other values. Every single-bit flip across the file either
    fails the read or leaves every value as it was (a byte of the statistics, say)."""
    import random

    import pyarrow.parquet as pq

    from pipeline.errors import LakeDamageError
    from pipeline.lake.read import read_parquet
    lake = tmp_path / "lake"
    simulate_async(lake, steps=4)
    compact(lake)
    path = sorted(lake.glob("trajectories/**/*.parquet"))[0]
    original = path.read_bytes()
    before = pq.read_table(path)
    assert pq.ParquetFile(path).metadata.row_group(0).column(0).total_compressed_size > 0
    rng, failed = random.Random(0), 0
    for _ in range(60):
        damaged = bytearray(original)
        damaged[rng.randrange(4, len(damaged) - 8)] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(damaged))
        try:
            after = read_parquet(path)
        except LakeDamageError:
            failed += 1
            assert path in [f.path for f in check(lake).damaged]
            continue
        assert after.equals(before)         # a bit that no value depends on (padding, stats)
    path.write_bytes(original)
    assert failed >= 20     # most flips land in the rows, the column names or their types
    assert check(lake).damaged == []
