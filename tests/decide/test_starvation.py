"""The starvation signal on a real buffer and lake: a dataset with a group in flight and no
trained row is named after exactly `starvation_steps` consecutive steps (not one before), counted
in `<prefix>/dataset/starved` while the stretch lasts, and the lake's `starved_stretches` view
lists the same stretch."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest

from pipeline import ConfigError, ReplayBuffer, async_config
from pipeline.analysis.views import connect
from pipeline.decide.metrics import StepAggregator, declared_metric
from tests.support.policies import group

KEY = "training/dataset/starved"
N = 3


def _step(buf: ReplayBuffer, step: int) -> dict:
    """A math group finishes and is trained at ``step``; the batch's metrics."""
    group(buf, f"m{step}", step, [0.0, 1.0], dataset="math")
    batch = buf.sample(global_steps=step, partition_id="train", batch_size=1)
    buf.release(batch)
    return batch.metrics


def test_a_dataset_is_starved_after_exactly_n_steps_not_one_before(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    buf = ReplayBuffer.async_(max_off_policy_threshold=100, starvation_steps=N,
                              lake=tmp_path / "lake")
    group(buf, "slow", 0, status="running", dataset="code")       # in flight throughout
    group(buf, "plain", 0, status="running")                      # no dataset: never counted
    with caplog.at_level(logging.WARNING, logger="replaylake"):
        before = [_step(buf, s) for s in range(1, N)]
        assert all(KEY not in m for m in before)                   # N - 1 steps: not yet
        assert not [r for r in caplog.records if "starv" in r.getMessage()]
        at_n = _step(buf, N)
        assert at_n[KEY] == 1
        named = [r for r in caplog.records if getattr(r, "replaylake_event", "") ==
                 "starved_datasets"]
        assert len(named) == 1 and "dataset(s) code had groups in flight" in named[0].getMessage()
        assert _step(buf, N + 1)[KEY] == 1                         # still starved, not re-warned
        assert len([r for r in caplog.records if "starv" in r.getMessage()]) == 1
    # the slow group finishes and trains: the stretch ends
    buf.put([{"partition": "train", "uid": "slow", "session_id": 0, "min_global_steps": 0,
              "max_global_steps": 0, "reward": 1.0, "prompt_ids": [1], "response_ids": [2]}])
    buf.update_status(partition="train", uids=["slow"], status="finished")
    batch = buf.sample(global_steps=N + 2, partition_id="train", batch_size=1)
    assert batch.uids == ["slow"] and KEY not in batch.metrics
    buf.close()
    rows = connect(tmp_path / "lake").sql("select * from starved_stretches").fetchall()
    assert rows == [("train", "code", 1, N + 1, N + 1)]
    recorded = connect(tmp_path / "lake").sql(
        f"select step, value from metrics where name = '{KEY}' order by step").fetchall()
    assert recorded == [(N, 1.0), (N + 1, 1.0)]


def test_the_same_step_sampled_twice_counts_once() -> None:
    buf = ReplayBuffer.async_(max_off_policy_threshold=100, starvation_steps=2)
    group(buf, "slow", 0, status="running", dataset="code")
    _step(buf, 1)
    group(buf, "again", 1, [0.0, 1.0], dataset="math")
    assert KEY not in buf.sample(global_steps=1, partition_id="train", batch_size=1).metrics
    assert _step(buf, 2)[KEY] == 1


def test_the_signal_is_off_by_default_and_checked() -> None:
    buf = ReplayBuffer.async_(max_off_policy_threshold=100)
    group(buf, "slow", 0, status="running", dataset="code")
    assert all(KEY not in _step(buf, s) for s in range(1, 6))
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ConfigError, match=f"starvation_steps={bad!r} must be a positive int"):
            async_config(starvation_steps=bad)


def test_the_metric_is_declared_and_reduced_by_its_maximum() -> None:
    assert declared_metric(KEY).reduction == "max"
    agg = StepAggregator()
    agg.add({KEY: 1})
    agg.add({KEY: 2})
    assert agg.result()[KEY] == 2
