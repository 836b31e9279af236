"""Retention: old released/evicted/discarded groups lose their token payload and nothing else;
the decision log and lineage answer as before, a restart gives the same batches, and a second run
changes nothing."""
from __future__ import annotations

import shutil

import pyarrow.compute as pc
import pytest

from pipeline.analysis.views import connect
from pipeline.errors import ConfigError
from pipeline.lake.retention import retain
from pipeline.lake.writer import read_table
from tests.lake.test_compact import second_phase
from tests.support.lake import lake_history
from tests.support.sql_runs import simulate_async

# a retained trajectory's response length reads 0; everything else of its fate stays
FATES = "select * exclude (response_len) from trajectory_fates order by all"


def without_payload(rows: list[tuple]) -> list[tuple]:
    return [r[:8] + r[12:] for r in rows]     # trajectories columns 8..11 are the payload


def test_retention_drops_only_old_gone_payload_and_a_restart_gives_the_same_batches(tmp_path):
    plain, kept = tmp_path / "plain", tmp_path / "kept"
    simulate_async(plain, steps=8, surplus=1)
    shutil.copytree(plain, kept)
    before = lake_history(kept)
    lineage = connect(kept).sql(FATES).fetchall()

    report = retain(kept, older_than=3)

    assert report.horizon == 8 - 3 and report.groups > 0 and report.rows > 0
    assert report.bytes_after < report.bytes_before
    after = lake_history(kept)
    assert {k: v for k, v in after.items() if k != "trajectories"} == \
        {k: v for k, v in before.items() if k != "trajectories"}
    assert without_payload(after["trajectories"]) == without_payload(before["trajectories"])
    dec = read_table(kept, "decisions")
    old = dec.filter(pc.less_equal(dec["step"], 5))
    gone = {u for k, u in zip(old["kind"].to_pylist(), old["uid"].to_pylist())
            if k in ("release", "evict", "discard")}
    t = read_table(kept, "trajectories")
    for uid, ids, probs in zip(t["uid"].to_pylist(), t["response_ids"].to_pylist(),
                               t["rollout_log_probs"].to_pylist()):
        if uid in gone:
            assert ids == [] and probs is None
    young = [u for u in t["uid"].to_pylist() if u not in gone]
    assert young and all(len(r[9]) > 0 for r in after["trajectories"] if r[1] in young)
    assert connect(kept).sql(FATES).fetchall() == lineage     # every fate and reason, as before
    assert second_phase(kept) == second_phase(plain)


def test_retaining_twice_rewrites_nothing(tmp_path):
    lake = tmp_path / "lake"
    simulate_async(lake, steps=6)
    assert retain(lake, older_than=1).rewritten
    again = retain(lake, older_than=1)
    assert again.rewritten == [] and again.rows == 0


def test_a_negative_horizon_is_refused(tmp_path):
    lake = tmp_path / "lake"
    simulate_async(lake, steps=2)
    with pytest.raises(ConfigError, match="older_than"):
        retain(lake, older_than=-1)
