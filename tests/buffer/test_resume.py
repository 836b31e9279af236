"""Sibling reuse after a restart: `resume` keeps every completed session of an in-flight group
and returns the sessions still missing; the group finishes when they arrive, with the kept
siblings' older versions in its min/max; the lake's views agree with the live buffer; `reissue`
keeps dropping partial trajectories."""
from __future__ import annotations

import pytest

from pipeline import ConfigError, IngestError, ReplayBuffer
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
