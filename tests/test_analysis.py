"""SQL over the lake (pipeline/analysis.py): the views tell the same story as the live buffer, the
connection cannot modify anything, and reading while a buffer writes is safe."""
from __future__ import annotations

import hashlib
import re
import threading
import time
from pathlib import Path

import duckdb
import pytest

from pipeline import ReplayBuffer
from pipeline.analysis import BASE_TABLES, DERIVED_VIEWS, RELATIONS, connect, refresh
from pipeline.errors import ConfigError, LakeError
from pipeline.lake import segment_files
from sql.loader import run
from tests._sql_fixtures import Run, shared_run


@pytest.fixture
def async_run() -> Run:
    return shared_run("async")


@pytest.fixture
def sync_run() -> Run:
    return shared_run("sync")


def one(con: duckdb.DuckDBPyConnection, query: str, params: dict | None = None) -> tuple:
    """The first row of a query (DuckDB 2 relations have no fetchone)."""
    return con.sql(query, params=params).fetchall()[0]


def _digest(lake: Path) -> dict[str, str]:
    return {str(p.relative_to(lake)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(lake.rglob("*")) if p.is_file()}


# --- the views agree with what the live buffer did ---------------------------------------------

@pytest.mark.parametrize("which", ["async_run", "sync_run"])
def test_every_batch_is_rebuilt_from_the_lake_row_for_row(which: str, request) -> None:
    r: Run = request.getfixturevalue(which)
    con = connect(r.lake)
    for b in r.batches:
        rebuilt = run(con, "batch_contents", batch_id=b.batch_id)
        live = b.table.select(["partition", "uid", "session_id", "index", "seq"]).to_pylist()
        assert rebuilt.select(["partition", "uid", "session_id", "index", "seq"]).to_pylist() == live
        assert rebuilt["staleness"].to_pylist() == b.table["staleness"].to_pylist()


@pytest.mark.parametrize("which", ["async_run", "sync_run"])
def test_batches_view_matches_the_batches_handed_out(which: str, request) -> None:
    r: Run = request.getfixturevalue(which)
    rows = {x["batch_id"]: x for x in run(connect(r.lake), "batches").to_pylist()}
    assert sorted(rows) == sorted(b.batch_id for b in r.batches)
    for b in r.batches:
        row = rows[b.batch_id]
        assert (row["partition"], row["step"], row["n_groups"], row["n_trajectories"]) == \
            (b.partition, b.step, len(b.uids), b.table.num_rows)
        mean = b.metrics.get(f"{'training' if b.partition == 'train' else 'validation'}"
                             "/off_policy/trajectory_staleness/mean")
        if mean is not None:
            assert row["staleness_mean"] == pytest.approx(mean)


def test_decision_log_selects_reproduce_each_batch_in_order(async_run: Run) -> None:
    con = connect(async_run.lake)
    sel = con.sql("select batch_id, list(uid order by seq) as uids from decisions "
                  "where kind = 'select' group by batch_id order by batch_id").fetchall()
    assert sel == [(b.batch_id, b.uids) for b in sorted(async_run.batches, key=lambda b: b.batch_id)]


def test_eviction_counts_match_the_metrics_the_buffer_reported(async_run: Run) -> None:
    con = connect(async_run.lake)
    by_reason = {(r["step"], r["reason"]): r["n_groups"]
                 for r in run(con, "evictions_by_reason").to_pylist() if r["partition"] == "train"}
    keys = {"stale": "training/off_policy/evicted_samples",
            "zero_variance": "training/filter_groups/evicted_samples",
            "failure": "training/rollout_failure/evicted_samples"}
    reported = {}
    for b in async_run.batches:
        for reason, key in keys.items():
            if b.partition == "train" and key in b.metrics:
                reported[(b.step, reason)] = reported.get((b.step, reason), 0) + b.metrics[key]
    assert by_reason == reported
    assert {reason for _, reason in by_reason} == set(keys)   # the run exercises every reason


@pytest.mark.parametrize("which", ["async_run", "sync_run"])
def test_off_policy_view_equals_the_metrics_of_each_batch(which: str, request) -> None:
    """The lake runs the off-policy declaration over rows it rebuilt itself; the live buffer
    computed the batch's metrics when it handed the batch out: they agree key for key."""
    r: Run = request.getfixturevalue(which)
    rows = {(x["partition"], x["step"]): x for x in run(connect(r.lake), "off_policy").to_pylist()}
    per_step: dict[tuple, list] = {}
    for b in r.batches:
        per_step.setdefault((b.partition, b.step), []).append(b)
    checked = 0
    for key, batches in per_step.items():
        if len(batches) != 1:
            continue   # several calls in one step: the lake row merges them
        live = batches[0].off_policy_metrics
        prefix = "training" if key[0] == "train" else "validation"
        row = rows.get(key)
        if row is None:
            assert live == {}
            continue
        for column, value in row.items():
            m = re.fullmatch(r"(.+)_(mean|max|min)", column)
            if m is None:
                continue
            name = f"{prefix}/off_policy/{m.group(1)}/{m.group(2)}"
            if value is None:
                assert name not in live
            else:
                assert live[name] == pytest.approx(value), name
                checked += 1
    assert checked > 0


def test_exact_token_staleness_is_reported_where_versions_were(async_run: Run) -> None:
    con = connect(async_run.lake)
    n = one(con, "select count(*) from off_policy where token_staleness_exact_mean is not null")
    assert n[0] > 0


def test_derived_relations_have_the_declared_types(async_run: Run) -> None:
    con = connect(async_run.lake)
    for name, schema in RELATIONS.items():
        got = con.sql(f"select * from {name}").to_arrow_table().schema
        assert [(f.name, f.type) for f in got] == [(f.name, f.type) for f in schema], name
    assert one(con, "select count(*) from candidates")[0] > 0


def test_the_filter_metric_is_chosen_at_connect(sync_run: Run) -> None:
    by_reward = connect(sync_run.lake)
    by_acc = connect(sync_run.lake, filter_metric="acc")
    none = connect(sync_run.lake, filter_metric=None)
    q = "select count(metric), count(*) from group_trajectories"
    n_reward, total = one(by_reward, q)
    assert n_reward == total > 0
    assert one(by_acc, q) == (total, total)   # every simulated trajectory reports acc
    assert one(none, q) == (0, total)
    assert one(by_acc, "select getvariable('filter_metric')") == ("acc",)
    none.execute("set variable filter_metric = 'reward'")   # a variable, not locked configuration
    assert one(none, q) == (total, total)
    with pytest.raises(ConfigError, match="filter_metric=3"):
        connect(sync_run.lake, filter_metric=3)


def test_groups_view_accounts_for_every_group(sync_run: Run) -> None:
    con = connect(sync_run.lake)
    fates = dict(con.sql("select fate, count(*) from groups group by fate").fetchall())
    registered = one(con, "select count(distinct uid) from group_events "
                             "where event = 'registered'")[0]
    assert sum(fates.values()) == registered
    assert fates["sampled"] == sum(len(b.uids) for b in sync_run.batches)
    assert fates["discarded"] > 0 and fates["evicted"] > 0
    # the re-issued group's partial trajectory is in the lake but not counted for the group
    dropped = con.sql("select uid from trajectory_fates where fate = 'dropped'").fetchall()
    assert len(dropped) == 1
    n = one(con, "select n_traj from groups where uid = $u", {"u": dropped[0][0]})
    assert n == (4,)


def test_state_as_of_the_last_step_agrees_with_the_groups_view(async_run: Run) -> None:
    con = connect(async_run.lake)
    now = con.sql("select partition, uid, fate, batch_id from groups order by all").fetchall()
    then = run(con, "state_as_of", step=10_000)
    assert sorted((r["partition"], r["uid"], r["fate"], r["batch_id"])
                  for r in then.to_pylist()) == now
    for step in (2, 5):
        sampled = {r["uid"] for r in run(con, "state_as_of", step=step).to_pylist()
                   if r["fate"] == "sampled"}
        assert sampled == {u for b in async_run.batches if b.step <= step for u in b.uids}


def test_lineage_ends_with_the_verdict(async_run: Run) -> None:
    b = async_run.batches[0]
    rows = run(connect(async_run.lake), "lineage", uid=b.uids[0]).to_pylist()
    assert rows[0]["stage"] == "dispatch"
    assert rows[-1]["stage"] == "verdict"
    assert rows[-1]["detail"] == f"trained at step {b.step} in batch {b.batch_id}"


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
    with pytest.raises(LakeError, match="no lake directory"):
        connect(tmp_path / "nope")


def test_an_empty_lake_has_empty_views(tmp_path: Path) -> None:
    con = connect(tmp_path)
    assert one(con, "select count(*) from groups") == (0,)
    assert run(con, "conservation").num_rows == 0


# --- reading while the buffer writes --------------------------------------------------------

def test_a_torn_segment_tail_is_skipped(sync_run: Run, tmp_path: Path) -> None:
    import shutil
    lake = tmp_path / "lake"
    shutil.copytree(sync_run.lake, lake)
    n = one(connect(lake), "select count(*) from trajectories")[0]
    seg = next(p for p in segment_files(lake, "trajectories") if p.suffix == ".arrow")
    with open(seg, "ab") as f:
        f.write(b"\xff\xff\xff\xff\x10\x00\x00\x00torn")   # a record batch cut off mid-write
    assert one(connect(lake), "select count(*) from trajectories")[0] == n


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
                assert run(con, audit).num_rows == 0
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
    from pipeline.analysis import _consistent
    # trajectories were read first (up to seq 5); seq 7 was written to them after that read
    t = _consistent(_seq_tables(trajectories=[0, 5], group_events=[1, 2, 3, 4, 6],
                                decisions=[8, 9]), "trajectories")
    assert {n: x["seq"].to_pylist() for n, x in t.items()} == \
        {"trajectories": [0, 5], "group_events": [1, 2, 3, 4, 6], "decisions": []}


def test_old_gaps_are_kept_and_a_complete_lake_is_not_cut() -> None:
    from pipeline.analysis import _consistent
    # seqs 2..4 are gone for good (e.g. retention); everything after the first table is dense
    t = _consistent(_seq_tables(trajectories=[0, 9], group_events=[1, 5, 6],
                                decisions=[7, 8, 10]), "trajectories")
    assert t["decisions"]["seq"].to_pylist() == [7, 8, 10]
    t = _consistent(_seq_tables(trajectories=[], group_events=[3, 4], decisions=[5]),
                    "trajectories")
    assert t["decisions"]["seq"].to_pylist() == [5]
