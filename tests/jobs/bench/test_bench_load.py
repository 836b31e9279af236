"""Bounded-time load with everything at once (8 producers, a trainer, SQL, compaction): every
audit stays empty and nothing is lost (the benchmark job `replaylake dev bench load` reports rates)."""
from __future__ import annotations

import pytest

from jobs.bench.load import run_load
from pipeline import ReplayBuffer


@pytest.mark.slow
def test_eight_producers_a_trainer_sql_and_compaction_leave_every_audit_empty(tmp_path):
    res = run_load(tmp_path / "lake", seconds=6.0, producers=8)
    assert res.batches > 0 and res.trajectories > 0 and res.queries > 0 and res.compactions > 0
    assert res.audits and all(n == 0 for n in res.audits.values()), res.audits
    with ReplayBuffer.async_(lake=tmp_path / "lake", max_off_policy_threshold=3,
                             filter_groups_metric="reward", refill_fn=lambda n: None) as buf:
        counts = buf.counts("train")
    assert counts["sampled"] == 0            # every batch was released; the rest is accounted
    assert sum(counts.values()) <= res.groups
