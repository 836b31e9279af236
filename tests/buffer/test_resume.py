"""Sibling reuse after a restart: `resume` keeps every completed session of an in-flight group
and returns the sessions still missing; the group finishes when they arrive, with the kept
siblings' older versions in its min/max; the lake's views agree with the live buffer; `reissue`
keeps dropping partial trajectories."""
from __future__ import annotations

import pytest

from pipeline import ConfigError, IngestError, ReplayBuffer, UnknownBatchError
from pipeline.analysis.views import connect
from pipeline.lake.writer import read_table
from tests.support.lake import add_group, traj

_VERSIONS = ["uid", "n_traj", "min_version", "max_version"]


def crashed(lake, preset=ReplayBuffer.sync, **kw) -> None:
    """A run that left groups in flight: `full` (all 3 sessions), `part` (sessions 0 and 2),
    `empty` (none), `free` (n unknown, session 0) and `done` (finished)."""
    with preset(lake=lake, **kw) as buf:
        add_group(buf, "done", 1, [0.0, 1.0, 1.0], n=3)
        buf.register(partition="train", uids=["full", "part", "empty"], global_steps=1, n=3)
        buf.register(partition="train", uids=["free"], global_steps=1)
        buf.update_status(partition="train", uids=["full", "part", "free"], status="running")
        buf.put([traj("full", s, min_gs=0, max_gs=1, reward=float(s)) for s in range(3)]
                + [traj("part", s, min_gs=0, max_gs=0, reward=1.0) for s in (0, 2)]
                + [traj("free", 0, min_gs=1, max_gs=1)])


def lake_candidates(lake) -> list[tuple]:
    return connect(lake).sql(f"select {', '.join(_VERSIONS)} from candidates order by uid"
                             ).fetchall()


def test_resume_keeps_completed_sessions_and_returns_the_missing_ones(lake):
    crashed(lake)
    with ReplayBuffer.sync(lake=lake) as buf:
        with pytest.raises(ConfigError):
            buf.resume(-1)
        assert buf.resume(5) == {"train": [("empty", [0, 1, 2]), ("free", None),
                                           ("full", []), ("part", [1])]}
        assert buf.counts("train")["pending"] == 4
        assert buf.lookup("train", "part").sessions == {0, 2}
        assert buf.lookup("train", "part").global_steps == 5
        with pytest.raises(IngestError, match="differs in"):
            buf.put([traj("part", 0, min_gs=4, max_gs=4)])          # a kept sibling stays
        buf.put([traj("part", 1, min_gs=4, max_gs=4, reward=0.0)])  # the missing one
        buf.update_status(partition="train", uids=["part", "full"], status="running")
        buf.update_status(partition="train", uids=["part", "full"], status="finished")
        live = sorted(tuple(r[c] for c in _VERSIONS) for r in buf.candidates("train").to_pylist())
        # part: siblings of weights 0, the new one of 4; full kept whole
        assert live == [("done", 3, 0, 0), ("full", 3, 0, 1), ("part", 3, 0, 4)]
        assert lake_candidates(lake) == live                # the lake agrees with memory
        batch = buf.sample(5, "train", 3)
        part = [r for r in batch.table.to_pylist() if r["uid"] == "part"]
        assert sorted((r["session_id"], r["max_global_steps"], r["global_steps"]) for r in part) == [
            (0, 0, 5), (1, 4, 5), (2, 0, 5)]
    with ReplayBuffer.sync(lake=lake) as buf:              # the resume survives a restart
        assert buf.lookup("train", "free").sessions == {0}
        assert buf.resume(6) == {"train": [("empty", [0, 1, 2]), ("free", None)]}


def test_reissue_still_drops_partial_trajectories(lake):
    crashed(lake)
    with ReplayBuffer.sync(lake=lake) as buf:
        assert buf.reissue(5) == {"train": ["empty", "free", "full", "part"]}
        assert buf.lookup("train", "part").sessions == frozenset()
        buf.put([traj("part", 0, min_gs=4, max_gs=4)])             # sent again, new content


def test_a_resumed_group_that_fails_keeps_its_siblings_for_the_failure_rule(lake):
    crashed(lake, ReplayBuffer.async_, max_off_policy_threshold=10)
    with ReplayBuffer.async_(lake=lake, max_off_policy_threshold=10) as buf:
        buf.resume(5)
        buf.update_status(partition="train", uids=["part"], status="running")
        buf.update_status(partition="train", uids=["part"], status="failure")
        row = [r for r in buf.candidates("train").to_pylist() if r["uid"] == "part"]
        assert [(r["status"], r["n_traj"], r["min_version"]) for r in row] == [("failure", 2, 0)]
        assert ("part", 2, 0, 0) in lake_candidates(lake)


def test_dapo_filters_a_resumed_group_on_kept_and_new_rewards(lake):
    """DAPO (filter on reward): `part` kept rewards 1, 1; the missing session decides."""
    asked: list[int] = []
    kw = {"filter_groups_metric": "reward", "poll_interval": 0.05, "refill_fn": asked.append,
          "max_off_policy_threshold": 10}
    crashed(lake, ReplayBuffer.async_, **kw)
    with ReplayBuffer.async_(lake=lake, **kw) as buf:
        assert dict(buf.resume(5)["train"])["part"] == [1]
        buf.put([traj("part", 1, min_gs=4, max_gs=4, reward=1.0)])   # all 1.0: zero variance
        buf.update_status(partition="train", uids=["part", "full"], status="running")
        buf.update_status(partition="train", uids=["part", "full"], status="finished")
        ready = buf.wait_for_sampleable(5, "train", 2, timeout=5)
        assert sorted(ready.uids) == ["done", "full"]
        dec = read_table(lake, "decisions").to_pylist()
        evicted = [(d["uid"], d["reason"], d["value"]) for d in dec if d["kind"] == "evict"]
        assert evicted == [("part", "zero_variance", 1.0)] and asked == [1]   # and replaced


def test_the_reissued_events_count_the_rows_kept_and_each_kept_sibling_has_one_fate(lake):
    crashed(lake)
    with ReplayBuffer.sync(lake=lake) as buf:
        buf.resume(5)
        buf.put([traj("part", 1, min_gs=4, max_gs=4, reward=0.0)])
        buf.update_status(partition="train", uids=["part"], status="finished")
    kept = {r["uid"]: r["kept_rows"] for r in read_table(lake, "group_events").to_pylist()
            if r["event"] == "reissued"}
    assert kept == {"full": 3, "part": 2, "empty": 0, "free": 1}
    con = connect(lake)
    rows = con.sql("select uid, session_id, fate, count(*) from trajectory_fates "
                   "where uid in ('full', 'part', 'free') group by all order by all").fetchall()
    # the lake holds each kept sibling twice (before and after the reissued event): one fate
    assert rows == [("free", 0, "live", 1), ("full", 0, "live", 1), ("full", 1, "live", 1),
                    ("full", 2, "live", 1), ("part", 0, "live", 1), ("part", 1, "live", 1),
                    ("part", 2, "live", 1)]
    assert con.sql("select count(*) from trajectory_fates where fate = 'dropped'"
                   ).fetchall() == [(0,)]


def test_a_plain_reissue_records_no_kept_rows_and_its_rows_read_as_dropped(lake):
    crashed(lake)
    with ReplayBuffer.sync(lake=lake) as buf:
        buf.reissue(5)
    kept = {r["uid"]: r["kept_rows"] for r in read_table(lake, "group_events").to_pylist()
            if r["event"] == "reissued"}
    assert kept == {"full": 0, "part": 0, "empty": 0, "free": 0}
    assert connect(lake).sql("select count(*) from trajectory_fates where fate = 'dropped'"
                             ).fetchall() == [(6,)]


def test_a_batch_held_across_a_restart_comes_back_as_sample_returned_it(lake):
    with ReplayBuffer.async_(lake=lake, max_off_policy_threshold=3) as buf:
        add_group(buf, "a", 1, [0.0, 1.0])
        add_group(buf, "b", 1, [1.0, 0.0, 1.0], min_gs=0, max_gs=1)
        first = buf.sample(2, "train", 2, timeout=5)          # never released: the crash
    with ReplayBuffer.async_(lake=lake, max_off_policy_threshold=3) as buf:
        again = buf.held_batch(first.batch_id)
        assert (again.batch_id, again.step, again.partition, again.uids) == \
            (first.batch_id, first.step, first.partition, first.uids)
        assert again.table.drop_columns(["ts"]).equals(first.table.drop_columns(["ts"]))
        assert again.off_policy_metrics == first.off_policy_metrics
        assert again.eviction_metrics == {}          # those were the first call's
        buf.release(again)
        assert buf.held_batches("train") == {}
        with pytest.raises(UnknownBatchError, match="held_batches"):
            buf.held_batch(first.batch_id)


TWO_PARTITIONS = """
    import sys
    from pipeline import ReplayBuffer
    from tests.support.lake import traj
    buf = ReplayBuffer.sync(lake=sys.argv[1])
    for p in ("a", "b"):
        buf.register(partition=p, uids=["g"], global_steps=1, n=3)
        buf.update_status(partition=p, uids=["g"], status="running")
    # one put, two partitions: the lake's trajectory writes 1 and 2
    buf.put([traj("g", s, partition=p) for p in ("a", "b") for s in range(3)])
    if sys.argv[2] == "resume":
        buf.resume(5)
"""
# resume's write: the reissued events of both partitions, then the rows kept in `a` (trajectory
# write 3) and in `b`; killed with `a`'s rows in the file, before their checksum record
KILL_IN_RESUME = "trajectories.data_written:3"


def _two_partitions(tmp_path, how: str, **env: str):
    import subprocess
    import sys

    from tests.support.lake import ROOT, python_env, write_script
    script, lake = write_script(tmp_path, "two.py", TWO_PARTITIONS), tmp_path / "lake"
    proc = subprocess.run([sys.executable, str(script), str(lake), how], cwd=ROOT,
                          capture_output=True, text=True, env=python_env(**env), timeout=120)
    return proc, lake


def _reissued(lake) -> list[tuple]:
    ev = read_table(lake, "group_events").to_pylist()
    return [(r["partition"], r["uid"], r["kept_rows"]) for r in ev if r["event"] == "reissued"]


def test_a_resume_killed_half_written_leaves_every_partition_as_it_was(tmp_path):
    """A resume over two partitions is one write across both tables: killed inside it (with
    the first partition's events and rows in the files), the restart sees no resume at all,
    every partition keeps its rows, and the resume sent again keeps them."""
    import signal
    proc, lake = _two_partitions(tmp_path, "resume", REPLAYLAKE_KILL_AT=KILL_IN_RESUME)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert _reissued(lake) == []
    with ReplayBuffer.sync(lake=lake) as buf:
        for p in ("a", "b"):
            assert buf.lookup(p, "g").sessions == {0, 1, 2} and buf.counts(p)["running"] == 1
        assert buf.resume(5) == {"a": [("g", [])], "b": [("g", [])]}
    assert _reissued(lake) == [("a", "g", 3), ("b", "g", 3)]
    with ReplayBuffer.sync(lake=lake) as buf:
        assert [buf.lookup(p, "g").sessions for p in ("a", "b")] == [{0, 1, 2}, {0, 1, 2}]


def test_a_resume_whose_write_fails_changes_nothing_and_its_retry_keeps_every_row(
        tmp_path, monkeypatch):
    from pipeline.errors import LakeError
    from pipeline.lake import kill as lake_kill
    proc, lake = _two_partitions(tmp_path, "")
    assert proc.returncode == 0, proc.stderr
    with ReplayBuffer.sync(lake=lake) as buf:
        monkeypatch.setenv(lake_kill.ENV, "trajectories.data_written:1")   # `a`'s kept rows
        monkeypatch.setenv(lake_kill.HOW_ENV, "raise")
        lake_kill.arm()
        with pytest.raises(LakeError, match="nothing of this call was written"):
            buf.resume(5)
        assert _reissued(lake) == []
        assert [buf.counts(p)["running"] for p in ("a", "b")] == [1, 1]
        assert buf.lookup("a", "g").sessions == {0, 1, 2}
        assert buf.resume(5) == {"a": [("g", [])], "b": [("g", [])]}
    with ReplayBuffer.sync(lake=lake) as buf:
        assert [buf.lookup(p, "g").sessions for p in ("a", "b")] == [{0, 1, 2}, {0, 1, 2}]
        assert [buf.lookup(p, "g").global_steps for p in ("a", "b")] == [5, 5]
