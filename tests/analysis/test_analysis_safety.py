"""SQL over the lake (pipeline/analysis/views.py) is safe: the connection cannot modify anything (every
statement that would touch files or settings fails), and reading while a buffer writes sees
consistent prefixes (torn tails skipped, snapshots cut where an earlier read stopped)."""
from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path

import duckdb
import pytest

from pipeline import ReplayBuffer
from pipeline.analysis.views import BASE_TABLES, DERIVED_VIEWS, connect, refresh
from pipeline.errors import LakeError
from pipeline.lake.writer import read_table, segment_files
from sql.loader import run
from tests.support.lake_damage import tear_last_write
from tests.support.sql_runs import Run, one, shared_run


@pytest.fixture
def sync_run() -> Run:
    return shared_run("sync")


def _digest(lake: Path) -> dict[str, str]:
    return {str(p.relative_to(lake)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(lake.rglob("*")) if p.is_file()}


# --- read-only ------------------------------------------------------------------------------

FORBIDDEN = [
    "copy trajectories to '{d}/out.csv'",
    "copy (select 1) to '{d}/out.parquet' (format parquet)",
    "export database '{d}/export'",
    "attach '{d}/other.duckdb' as other",
    "install httpfs",
    "load httpfs",
    "select * from read_csv('{lake}/decisions/x.csv')",
    "select * from read_parquet('{d}/*.parquet')",
    "select * from read_text('/etc/hostname')",
    "select * from glob('{lake}/*')",
    "set enable_external_access = true",
    "set lock_configuration = false",
    "reset enable_external_access",
]


@pytest.mark.parametrize("statement", FORBIDDEN)
def test_statements_that_touch_files_or_settings_fail(statement: str, sync_run: Run,
                                                      tmp_path: Path) -> None:
    before = _digest(sync_run.lake)
    con = connect(sync_run.lake)
    with pytest.raises(duckdb.Error):
        rel = con.sql(statement.format(d=tmp_path, lake=sync_run.lake))
        if rel is not None:    # a select is lazy: run it
            rel.fetchall()
    assert list(tmp_path.iterdir()) == []
    assert _digest(sync_run.lake) == before
    assert one(con, "select count(*) from groups")[0] > 0   # still usable


def test_selects_over_every_view_work_on_the_locked_connection(sync_run: Run) -> None:
    con = connect(sync_run.lake)
    for view in (*BASE_TABLES, *DERIVED_VIEWS):
        one(con, f"select count(*) from {view}")
    assert one(con, "select current_setting('enable_external_access')") == (False,)


def test_a_missing_lake_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(LakeError, match="no lake at"):
        connect(tmp_path / "nope")


def test_an_empty_lake_has_empty_views(tmp_path: Path) -> None:
    ReplayBuffer.sync(lake=tmp_path / "lake").close()      # opened, nothing written
    con = connect(tmp_path / "lake")
    assert one(con, "select count(*) from groups") == (0,)
    assert run(con, "conservation").num_rows == 0


# --- reading while the buffer writes --------------------------------------------------------

def test_a_torn_segment_tail_is_skipped(sync_run: Run, tmp_path: Path) -> None:
    import shutil
    lake = tmp_path / "lake"
    shutil.copytree(sync_run.lake, lake)
    n = one(connect(lake), "select count(*) from trajectories")[0]
    seg = next(p for p in segment_files(lake, "trajectories") if p.suffix == ".arrow")
    tear_last_write(seg, 8)              # as if killed before the end-of-stream marker ...
    tear_last_write(seg)                 # ... while its last batch was half written
    torn = one(connect(lake), "select count(*) from trajectories")[0]
    assert torn == read_table(lake, "trajectories").num_rows < n


def test_queries_while_a_buffer_appends_see_consistent_prefixes(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    buf = ReplayBuffer.async_(lake=lake, max_off_policy_threshold=4, poll_interval=0.01)
    stop = threading.Event()

    def producer() -> None:
        i = 0
        while not stop.is_set():
            u = f"w{i:05d}"
            buf.register(partition="train", uids=[u], global_steps=1)
            buf.put([{"partition": "train", "uid": u, "session_id": s, "min_global_steps": 0,
                      "max_global_steps": 0, "reward": float(s), "prompt_ids": [1],
                      "response_ids": [2, 3]} for s in range(2)])
            buf.update_status(partition="train", uids=[u], status="finished")
            if i % 3 == 2:
                buf.release(buf.sample(1, "train", 2, timeout=5))
            i += 1

    t = threading.Thread(target=producer)
    t.start()
    try:
        time.sleep(0.05)
        con = connect(lake)
        seen = []
        for _ in range(5):
            refresh(con, lake)
            seen.append(one(con, "select count(*) from trajectories")[0])
            for audit in ("conservation", "no_group_in_two_batches", "no_double_terminal"):
                assert run(con, audit).num_rows == 0, (audit, run(con, audit).to_pylist())
            time.sleep(0.02)
    finally:
        stop.set()
        t.join()
        buf.close()
    assert seen == sorted(seen) and seen[-1] > seen[0]
    final = connect(lake)
    assert one(final, "select count(*) from trajectories")[0] >= seen[-1]


def _seq_tables(**seqs: list[int]) -> dict:
    import pyarrow as pa
    return {name: pa.table({"seq": pa.array(s, pa.int64())}) for name, s in seqs.items()}


def test_a_snapshot_is_cut_at_the_first_row_an_earlier_read_missed() -> None:
    from pipeline.analysis.views import _consistent
    # trajectories were read first (up to seq 5); seq 7 was written to them after that read
    t = _consistent(_seq_tables(trajectories=[0, 5], group_events=[1, 2, 3, 4, 6],
                                decisions=[8, 9]), "trajectories", [], [])
    assert {n: x["seq"].to_pylist() for n, x in t.items()} == \
        {"trajectories": [0, 5], "group_events": [1, 2, 3, 4, 6], "decisions": []}


def test_a_burnt_gap_is_not_a_write_in_flight() -> None:
    """Seq 7 was burnt (a failed write, a call a crash tore, a write a salvage lost: logged as
    never to be written), so the acknowledged rows after it are not cut; a gap the log does not
    name still is."""
    from pipeline.analysis.views import _consistent
    tables = _seq_tables(trajectories=[0, 5], group_events=[1, 2, 3, 4, 6], decisions=[8, 9, 11])
    t = _consistent(tables, "trajectories", [(7, 7)], [])
    assert t["decisions"]["seq"].to_pylist() == [8, 9]          # 10 is not burnt: cut there
    t = _consistent(tables, "trajectories", [(7, 7), (10, 10)], [])
    assert t["decisions"]["seq"].to_pylist() == [8, 9, 11]


def test_a_call_not_committed_when_the_log_was_read_cuts_every_row_after_it() -> None:
    """Seqs 3..4 are a selection written with its metric rows (one call, two tables) whose
    commit record came after the log was read: the readers left them out. The release at seq 5,
    read in the first table, is cut with them (below the first table's highest seq, where a gap
    alone reads as permanent); a call a crash left, burnt by the next writer, cuts nothing."""
    from pipeline.analysis.views import _consistent
    tables = _seq_tables(decisions=[0, 1, 2, 5], metrics=[], group_events=[6])
    t = _consistent(tables, "decisions", [], [3, 4])
    assert {n: x["seq"].to_pylist() for n, x in t.items()} == \
        {"decisions": [0, 1, 2], "metrics": [], "group_events": []}
    assert _consistent(tables, "decisions", [], [])["decisions"]["seq"].to_pylist() == [0, 1, 2, 5]
    t = _consistent(tables, "decisions", [(3, 4)], [3, 4])
    assert t["group_events"]["seq"].to_pylist() == [6]


def test_old_gaps_are_kept_and_a_complete_lake_is_not_cut() -> None:
    from pipeline.analysis.views import _consistent
    # seqs 2..4 are gone for good (e.g. retention); everything after the first table is dense
    t = _consistent(_seq_tables(trajectories=[0, 9], group_events=[1, 5, 6],
                                decisions=[7, 8, 10]), "trajectories", [], [])
    assert t["decisions"]["seq"].to_pylist() == [7, 8, 10]
    t = _consistent(_seq_tables(trajectories=[], group_events=[3, 4], decisions=[5]),
                    "trajectories", [], [])
    assert t["decisions"]["seq"].to_pylist() == [5]
