"""Smoke test of `replaylake dev bench ray`: every figure is produced (tiny sizes, shared cluster)."""
from __future__ import annotations

import pytest

from jobs.bench.ray import run

pytestmark = pytest.mark.usefixtures("ray_cluster")


def test_bench_ray_reports_latency_both_ways_and_actor_throughput():
    res = run(put_calls=3, sample_calls=2, batches=2, producers=2)
    for path in ("in_process", "ray_actor"):
        for op in ("put", "sample"):
            assert res[path][op]["calls"] == (3 if op == "put" else 2)
            assert res[path][op]["median_ms"] > 0
    t = res["ray_actor_throughput"]
    assert (t["producers"], t["batches"]) == (2, 2) and t["trajectories_per_s"] > 0
    assert set(res) >= {"put_overhead_ms", "sample_overhead_ms"}
