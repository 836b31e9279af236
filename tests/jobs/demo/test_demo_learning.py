"""A longer demo run (about half a minute): the policy learns and the buffer does its real job.

Everything is read back from the lake with SQL -- not from the demo's own counters.
"""
from __future__ import annotations

import io
from dataclasses import replace

import pytest
from rich.console import Console
from typer.testing import CliRunner

from jobs.cli import app
from jobs.demo.config import DemoConfig
from jobs.demo.main import run
from pipeline.analysis.views import connect

STEPS = 150


@pytest.fixture(scope="module")
def lake_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo-long") / "run"
    run(replace(DemoConfig(), steps=STEPS), out=out, use_wandb=False,
        console=Console(file=io.StringIO(), width=80))
    return out / "lake"


@pytest.fixture(scope="module")
def lake(lake_dir):
    return connect(lake_dir)


def _one(con, sql: str):
    return con.sql(sql).fetchall()[0]


@pytest.mark.slow
def test_reward_of_the_rollouts_rises_well_above_its_starting_level(lake):
    first, last = _one(lake, f"""
        select avg(reward) filter (where max_global_steps < 10),
               avg(reward) filter (where max_global_steps >= {STEPS - 20})
        from trajectories""")
    assert first < 0.2
    assert last > first + 0.2


@pytest.mark.slow
def test_groups_are_evicted_for_at_least_two_reasons_stale_among_them(lake):
    reasons = dict(lake.sql("select reason, count(*) from decisions where kind = 'evict' "
                            "group by reason").fetchall())
    assert reasons.get("stale", 0) > 0
    assert reasons.get("zero_variance", 0) > 0
    assert len(reasons) >= 2


@pytest.mark.slow
def test_some_trajectories_were_written_by_two_weight_versions_and_were_trained_on(lake):
    (written,) = _one(lake, "select count(*) from trajectories "
                            "where min_global_steps < max_global_steps")
    (trained,) = _one(lake, "select count(*) from trajectory_fates "
                            "where fate = 'sampled' and min_global_steps < max_global_steps")
    assert written > 0 and trained > 0
    # the per-token version spans say the same as the min/max columns
    (mismatch,) = _one(lake, """
        select count(*) from trajectories
        where min_global_steps <> version_spans[1].version
           or max_global_steps <> version_spans[len(version_spans)].version
           or list_sum([s.n_tokens for s in version_spans]) <> len(response_ids)""")
    assert mismatch == 0


@pytest.mark.slow
def test_no_trained_group_is_older_than_the_threshold(lake):
    (steps, worst) = _one(lake, "select count(*), max(group_span_max) from batches")
    assert steps == STEPS
    assert worst <= DemoConfig().threshold


@pytest.mark.slow
def test_the_lake_of_a_demo_run_passes_every_audit(lake_dir):
    res = CliRunner().invoke(app, ["audit", "--lake", str(lake_dir), "--threshold",
                                   str(DemoConfig().threshold)])
    assert res.exit_code == 0, res.output
    assert "0 failed" in res.output
