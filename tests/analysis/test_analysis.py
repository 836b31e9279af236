"""SQL over the lake (pipeline/analysis/views.py): the views tell the same story as the live buffer.

That the connection cannot modify anything, and that reading while a buffer writes is safe, is
tested in test_analysis_safety.py."""
from __future__ import annotations

import re

import pytest

from pipeline.analysis.views import RELATIONS, connect
from pipeline.errors import ConfigError
from sql.loader import run
from tests.support.sql_runs import Run, one, shared_run


@pytest.fixture
def async_run() -> Run:
    return shared_run("async")


@pytest.fixture
def sync_run() -> Run:
    return shared_run("sync")


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
