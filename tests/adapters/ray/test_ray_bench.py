"""Smoke test of `replaylake dev bench ray`: every figure is produced (tiny sizes, shared cluster),
and `bench all`'s ray section turns them into figures beside their same-run references."""
from __future__ import annotations

import math

import pytest

from jobs.bench.all import QUICK, ray_figures
from jobs.bench.ray import run

pytestmark = pytest.mark.usefixtures("ray_cluster")


def test_bench_ray_reports_latency_both_ways_and_throughput_per_producer_count():
    res = run(put_calls=3, sample_calls=2, batches=2, producers=(2, 1))
    for path in ("in_process", "ray_actor"):
        for op in ("put", "sample"):
            assert res[path][op]["calls"] == (3 if op == "put" else 2)
            assert res[path][op]["median_ms"] > 0
    sweep = res["ray_actor_throughput"]
    assert [t["producers"] for t in sweep] == [1, 2]              # sorted, one row a count
    assert [t["processes"] for t in sweep] == [1, 2]              # a process per producer
    assert all(t["batches"] == 2 and t["trajectories_per_s"] > 0 for t in sweep)
    assert set(res["saturation"]["growth"]) == {2}
    assert set(res) >= {"put_overhead_ms", "sample_overhead_ms", "seconds"}


def test_bench_alls_ray_section_gives_every_figure_with_its_reference():
    figs = ray_figures(QUICK)
    paths = [f["path"] for f in figs]
    assert paths[:2] == ["put of 16 trajectories through the Ray actor (median)",
                         "sample of 64 groups through the Ray actor (median)"]
    assert paths[2:4] == ["actor sample throughput, 1 producer process",
                          "actor sample throughput, 2 producer processes"]
    assert "saturat" in paths[4] and len(figs) == 5
    for f in figs:
        assert math.isfinite(f["value"]) and f["value"] > 0, f
        assert math.isfinite(f["reference_value"]) and f["reference_value"] > 0, f
