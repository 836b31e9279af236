"""`replaylake demo --ray` on the session's cluster: the buffer a Ray actor on the lake's node,
the rollout workers Ray actors on the rollout node, the trainer the test process. It learns as
the threaded demo does (its learning test, over a shorter run), its lake passes every audit, and
its summary says where each piece ran."""
from __future__ import annotations

import io
import json
import os
import time
from dataclasses import replace

import pytest
from rich.console import Console
from typer.testing import CliRunner

from jobs.cli import app
from jobs.demo.config import DemoConfig
from jobs.demo.main import run
from pipeline.analysis.views import connect

STEPS = 80


def _node_with(ray, resource: str) -> str:
    [node] = [n["NodeID"] for n in ray.nodes() if n["Alive"] and resource in n["Resources"]]
    return node


@pytest.fixture(scope="module")
def ray_run(tmp_path_factory, ray_cluster):
    out = tmp_path_factory.mktemp("demo-ray") / "run"
    console = Console(file=io.StringIO(), width=80)
    started = time.monotonic()
    run(replace(DemoConfig(), steps=STEPS, whatif_calls=0), out=out, use_wandb=False,
        console=console, on_ray=True)
    print(f"\ndemo --ray, {STEPS} steps: {time.monotonic() - started:.1f} s")
    return out, console.file.getvalue()


def test_the_demo_over_ray_learns_and_its_lake_passes_every_audit(ray_run):
    out, _ = ray_run
    con = connect(out / "lake")
    first, last = con.sql(f"""
        select avg(reward) filter (where max_global_steps < 10),
               avg(reward) filter (where max_global_steps >= {STEPS - 20})
        from trajectories""").fetchall()[0]
    assert first < 0.2                  # the threaded demo's learning test, over STEPS steps
    assert last > first + 0.2
    steps, worst = con.sql("select count(*), max(group_span_max) from batches").fetchall()[0]
    assert steps == STEPS and worst <= DemoConfig().threshold
    # the workers' versions are the weights that reached them: some responses straddle two,
    # the per-token spans say the same as the min/max tags, and no trained row was written by
    # weights of its own step or later (version g exists only after step g's update)
    (written,) = con.sql("select count(*) from trajectories "
                         "where min_global_steps < max_global_steps").fetchall()[0]
    assert written > 0
    (mismatch,) = con.sql("""
        select count(*) from trajectories
        where min_global_steps <> version_spans[1].version
           or max_global_steps <> version_spans[len(version_spans)].version
           or list_sum([s.n_tokens for s in version_spans]) <> len(response_ids)""").fetchall()[0]
    assert mismatch == 0
    (trained, ahead) = con.sql("select count(*), count(*) filter (where max_global_steps >= "
                               "fate_step) from trajectory_fates where fate = 'sampled' "
                               "and not is_padding").fetchall()[0]
    assert trained == STEPS * DemoConfig().batch_size * DemoConfig().n and ahead == 0
    res = CliRunner().invoke(app, ["audit", "--lake", str(out / "lake"), "--threshold",
                                   str(DemoConfig().threshold)])
    assert res.exit_code == 0, res.output
    assert "0 failed" in res.output


def test_the_summary_says_where_each_piece_ran(ray_run, ray_cluster):
    out, text = ray_run
    assert json.loads((out / "config.json").read_text())["ray"] is True
    placement = json.loads((out / "summary.json").read_text())["placement"]
    driver, buffer, rollout = placement["driver"], placement["buffer"], placement["rollout"]
    assert driver["pid"] == os.getpid()
    assert driver["node_id"] == ray_cluster.get_runtime_context().get_node_id()
    assert buffer["node_id"] == _node_with(ray_cluster, "lake")
    assert len(rollout) == DemoConfig().workers
    assert {w["node_id"] for w in rollout} == {_node_with(ray_cluster, "rollout")}
    pids = [w["pid"] for w in rollout]
    assert len(set(pids)) == len(pids)                     # a process per worker
    assert not set(pids) & {driver["pid"], buffer["pid"]} and driver["pid"] != buffer["pid"]
    assert "Where it ran" in text and f"pid {buffer['pid']}" in text
    assert "Rollout workers (Ray actors)" in text
