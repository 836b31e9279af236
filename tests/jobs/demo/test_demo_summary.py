"""The demo's summary counts evicted groups and evictions apart: a lake where one group is evicted
for two reasons (stale and zero variance in the same poll) shows 2 groups in 3 evictions, and the
suggested query says it counts evictions."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jobs.cli import app
from jobs.demo.summary import render, summarize, try_commands
from pipeline import ReplayBuffer
from pipeline.analysis.views import connect


def _settle(buf: ReplayBuffer, uid: str, step: int, rewards: list[float]) -> None:
    buf.register(partition="train", uids=[uid], global_steps=step, n=len(rewards))
    buf.put([{"partition": "train", "uid": uid, "session_id": s, "min_global_steps": step,
              "max_global_steps": step, "reward": r, "prompt_ids": [2, 1],
              "response_ids": [3]} for s, r in enumerate(rewards)])
    buf.update_status(partition="train", uids=[uid], status="finished")


@pytest.fixture
def two_reason_lake(tmp_path: Path) -> Path:
    """At step 4 (threshold 2): `old` is stale and all-zero (two reasons), `flat` all-zero but
    fresh (one reason), `mixed` is trained."""
    lake = tmp_path / "lake"
    with ReplayBuffer.async_(lake=lake, max_off_policy_threshold=2,
                             filter_groups_metric="reward", refill_fn=lambda k: None,
                             poll_interval=0.05) as buf:
        _settle(buf, "old", 0, [0.0, 0.0])
        _settle(buf, "flat", 3, [0.0, 0.0])
        _settle(buf, "mixed", 3, [0.0, 1.0])
        batch = buf.sample(4, "train", 1, timeout=30)
        assert batch.table.column("uid").unique().to_pylist() == ["mixed"]
        buf.release(batch)
    return lake


def test_the_lake_holds_two_evictions_of_one_group(two_reason_lake):
    rows = connect(two_reason_lake).sql(
        "select uid, reason from decisions where kind = 'evict' order by uid, reason").fetchall()
    assert rows == [("flat", "zero_variance"), ("old", "stale"), ("old", "zero_variance")]


def test_the_summary_counts_distinct_evicted_groups_apart_from_evictions_per_reason(
        two_reason_lake):
    s = summarize(two_reason_lake)
    assert s.evicted_groups == 2
    assert s.evictions == {"stale": 1, "zero_variance": 2, "failure": 0}
    text = [str(x) for x in render(s, run_dir=two_reason_lake.parent, lake=two_reason_lake,
                                   wandb_dir=None, wall_s=1.0, cwd=two_reason_lake.parent)]
    assert "  evicted groups       2 distinct (a group may be evicted for two reasons)" in text
    assert "  evictions by reason  stale 1, zero-variance 2, failure 0" in text
    assert not [x for x in text if len(x) > 80]


def test_the_suggested_eviction_query_says_it_counts_evictions_and_counts_them(two_reason_lake):
    (what, argv), *_ = try_commands(two_reason_lake, None)
    assert what.startswith("evictions per reason") and "counts under both" in what
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 0, res.output
    header = res.output.splitlines()[0]
    assert re.fullmatch(r"reason\s*\|\s*evictions", header.strip()), res.output
    counts = dict(re.findall(r"^\s*(\w+)\s*\|\s*(\d+)\s*$", res.output, re.M))
    assert counts == {"zero_variance": "2", "stale": "1"}
