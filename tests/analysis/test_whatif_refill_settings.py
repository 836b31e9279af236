"""A what-if replays a run under the refill knobs it was recorded with: sync DAPO's batch sizes
(its credit counts with them), sync's failure refill (`sync_refill_failed_groups`), and async's
refill limit. A replay with nothing changed reproduces every recorded batch."""
from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from jobs.cli import app
from pipeline import ReplayBuffer
from pipeline.analysis.whatif import recorded, recorded_settings, replay
from tests.support.sql_runs import Rollout


def _sync_run(lake: Path, steps: int = 4, **kw) -> None:
    """A sync run: each step dispatches 3 groups (mixed, all-equal rewards, some failures, as
    `Rollout` settles them) and samples 2; refills dispatch new groups the same way."""
    ro = Rollout(seed=3)
    buf = ReplayBuffer.sync(lake=lake, refill_fn=ro.refill, poll_interval=0.01, **kw)
    ro.buf = buf
    with buf:
        for g in range(1, steps + 1):
            ro.step = g
            ro.dispatch(3)
            b = buf.sample(g, "train", 2, timeout=10)
            buf.release(b)


def test_a_sync_dapo_run_replays_with_its_batch_sizes(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    _sync_run(lake, filter_groups_metric="acc", train_batch_size=2, gen_batch_size=1,
              max_inflight_gen_batches=2)
    assert "zero_variance" in _evictions(lake), "the run filtered no group"
    got = recorded_settings(lake)
    assert {k: got[k] for k in ("train_batch_size", "gen_batch_size",
                                "max_inflight_gen_batches", "max_num_gen_batches")} == {
        "train_batch_size": 2, "gen_batch_size": 1, "max_inflight_gen_batches": 2,
        "max_num_gen_batches": 0}
    assert "sync_refill_failed_groups" not in got
    out = replay(lake, tmp_path / "replay")
    assert out.batches == recorded(lake).batches and out.unfilled == []
    # the command line too (it refused the lake: train_batch_size=None with a filter metric)
    res = CliRunner().invoke(app, ["whatif", "--lake", str(lake), "--out", str(tmp_path / "cli")])
    assert res.exit_code == 0, res.output
    assert f"identical batches: {len(out.batches)} of {len(out.batches)}" in res.output


def test_a_sync_run_that_replaced_failures_replays_replacing_them(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    _sync_run(lake, steps=8, sync_refill_failed_groups=True, gen_batch_size=1)
    rec = recorded(lake)
    assert "failure" in _evictions(lake), "the run evicted no failure"
    got = recorded_settings(lake)
    assert got["sync_refill_failed_groups"] is True and got["gen_batch_size"] == 1
    assert "failure" not in got["rules"]          # its switch is the keyword, not the mapping
    out = replay(lake, tmp_path / "replay")
    assert out.batches == rec.batches and out.unfilled == []
    assert _evictions(out.lake) == _evictions(lake)


def _evictions(lake: Path) -> list[str]:
    from pipeline.analysis import connect
    return [r for (r,) in connect(lake).sql(
        "select reason from decisions where kind = 'evict' order by seq").fetchall()]


@pytest.mark.parametrize("preset", ["sync", "async"])
def test_a_run_without_a_refill_policy_records_no_refill_knobs(preset: str, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    with getattr(ReplayBuffer, "sync" if preset == "sync" else "async_")(lake=lake):
        pass
    got = recorded_settings(lake)
    assert not {"train_batch_size", "gen_batch_size", "max_inflight_gen_batches",
                "max_num_gen_batches", "sync_refill_failed_groups"} & set(got)


def test_an_async_dapo_run_replays_with_its_refill_limit(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    with ReplayBuffer.async_(lake=lake, filter_groups_metric="reward", refill_fn=lambda n: None,
                             max_num_gen_batches=3, train_batch_size=4):
        pass
    got = recorded_settings(lake)
    assert (got["max_num_gen_batches"], got["train_batch_size"]) == (3, 4)


def test_staleness_settings_on_a_sync_run_are_said_to_change_nothing(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    _sync_run(lake, steps=3)
    res = CliRunner().invoke(app, ["whatif", "--lake", str(lake), "--threshold", "1",
                                   "--out", str(tmp_path / "w")], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())
    assert "identical batches: 3 of 3" in said
    assert "the sync preset ignores max_off_policy_threshold" in said
    res = CliRunner().invoke(app, ["whatif", "--lake", str(lake), "--out", str(tmp_path / "r")])
    assert "sync preset ignores" not in res.output        # nothing given: nothing to say
