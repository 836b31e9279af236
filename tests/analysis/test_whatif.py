"""What-if replays: the recorded settings reproduce every recorded batch (scripted run and a real
demo lake); other settings change evictions and the CLI prints the comparison."""
from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pyarrow.compute as pc
import pytest
from typer.testing import CliRunner

from jobs.cli import app
from pipeline import ReplayBuffer
from pipeline.analysis.views import read_lake
from pipeline.analysis.whatif.rerun import recorded, replay
from tests.support.sql_runs import shared_run

ROOT = Path(__file__).resolve().parents[2]


def test_replaying_a_scripted_run_with_its_settings_reproduces_every_batch(tmp_path: Path) -> None:
    lake = shared_run("async").lake
    got = replay(lake, tmp_path)
    want = recorded(lake)
    assert len(want.batches) > 5
    assert got.batches == want.batches and got.unfilled == [] and got.refill_shortfall == 0


def test_a_lower_threshold_evicts_more_as_stale_and_the_cli_says_so(tmp_path: Path) -> None:
    lake = shared_run("async").lake
    res = CliRunner().invoke(app, ["whatif", "--lake", str(lake), "--threshold", "1",
                                   "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if x.startswith("evicted: stale"))
    recorded_n, whatif_n = (int(v) for v in line.split()[-2:])
    assert whatif_n > recorded_n


@pytest.mark.slow
def test_replaying_a_demo_lake_reproduces_every_batch(tmp_path: Path) -> None:
    run = tmp_path / "demo"
    subprocess.run([sys.executable, "-m", "jobs.cli", "demo", "--steps", "8", "--out", str(run)],
                   cwd=ROOT, check=True, capture_output=True, timeout=600)
    got = replay(run / "lake", tmp_path / "replay")
    want = recorded(run / "lake")
    assert len(want.batches) == 8
    assert got.batches == want.batches


def _pipelined_run(lake: Path, steps: int = 8) -> Path:
    """A recorded async run whose rollouts were dispatched two steps before they are trained,
    each generated with the newest weights (version step - 1): no eviction at threshold 3."""
    buf = ReplayBuffer.async_(lake=lake, max_off_policy_threshold=3, filter_groups_metric=None,
                              poll_interval=0.001)
    with buf:
        for g in range(1, steps + 1):
            uids = [f"s{g}g{i}" for i in range(2)]
            buf.register(partition="train", uids=uids, global_steps=max(g - 2, 0), n=2)
            buf.put([{"partition": "train", "uid": u, "session_id": s, "index": 0,
                      "min_global_steps": g - 1, "max_global_steps": g - 1,
                      "reward": float(s), "prompt_ids": [1, 2], "response_ids": [3, 4, 5],
                      "is_padding": False} for u in uids for s in range(2)])
            buf.update_status(partition="train", uids=uids, status="finished")
            buf.release(buf.sample(g, "train", 2, timeout=10))
    return lake


def test_a_replay_reaching_later_rollouts_sums_up_their_future_versions_in_one_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    lake = _pipelined_run(tmp_path / "recorded")
    with caplog.at_level(logging.WARNING, logger="replaylake"):
        res = CliRunner().invoke(app, ["whatif", "--lake", str(lake), "--threshold", "1",
                                       "--out", str(tmp_path / "replay")])
    assert res.exit_code == 0, res.output
    assert not [r for r in caplog.records if "from the future" in r.getMessage()]
    lines = [x for x in res.output.splitlines() if "from the future" in x]
    assert len(lines) == 1 and res.output.splitlines()[-1] == lines[0]
    got = replay(lake, tmp_path / "again", max_off_policy_threshold=1)
    steps = sorted(got.future_rows)
    assert len(steps) >= 2 and all(n > 0 for n in got.future_rows.values())
    assert f"{len(steps)} of 8 sample calls (steps {steps[0]} to {steps[-1]})" in lines[0]


def test_future_warnings_of_a_live_buffer_are_left_alone_by_a_replay(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="replaylake"):
        _pipelined_run(tmp_path / "recorded")
        replay(tmp_path / "recorded", tmp_path / "replay", max_off_policy_threshold=1)
        buf = ReplayBuffer.async_(lake=tmp_path / "live", max_off_policy_threshold=None,
                                  filter_groups_metric=None, poll_interval=0.001)
        with buf:
            buf.register(partition="train", uids=["u"], global_steps=1, n=1)
            buf.put([{"partition": "train", "uid": "u", "session_id": 0, "index": 0,
                      "min_global_steps": 3, "max_global_steps": 3, "reward": 1.0,
                      "prompt_ids": [1], "response_ids": [2], "is_padding": False}])
            buf.update_status(partition="train", uids=["u"], status="finished")
            buf.sample(2, "train", 1, timeout=10)
    future = [r for r in caplog.records if "from the future" in r.getMessage()]
    assert len(future) == 1 and "sample(step=2, train)" in future[0].getMessage()


def test_replaying_validation_calls_does_not_warn_of_an_unknown_partition(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    lake = shared_run("async").lake
    dec = read_lake(lake, tables=("decisions",))["decisions"]
    assert "val" in dec.filter(pc.equal(dec["kind"], "select"))["partition"].to_pylist()
    with caplog.at_level(logging.WARNING, logger="replaylake"):
        got = replay(lake, tmp_path)
    assert got.batches == recorded(lake).batches
    assert not [r for r in caplog.records if "has no group yet" in r.getMessage()]


def test_a_replay_under_admit_is_refused_naming_the_strategies_it_can_replay(tmp_path: Path
                                                                            ) -> None:
    from pipeline.errors import ConfigError
    lake = shared_run("async").lake
    with pytest.raises(ConfigError, match="cannot replay max_off_policy_strategy='admit'"):
        replay(lake, tmp_path, max_off_policy_strategy="admit")
    res = CliRunner().invoke(app, ["whatif", "--lake", str(lake), "--strategy", "admit",
                                   "--out", str(tmp_path / "cli")])
    assert res.exit_code != 0 and "--strategy drop or wait" in res.output
