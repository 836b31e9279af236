"""Smoke test of `replaylake dev bench verl`: tiny sizes through the session's TransferQueue, and the
JSON report carries every implementation's figures and the ratios."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jobs.bench import tq_systems
from jobs.bench.tq_systems import Systems
from jobs.bench.verl import IMPLS, STEP_IMPLS
from jobs.bench.verl import _stop as stop
from jobs.bench.verl_floor import FLOOR_PARTS
from jobs.cli import app

pytestmark = pytest.mark.verl


def test_bench_verl_writes_every_figure(tq, rollout, tmp_path: Path) -> None:
    out = tmp_path / "verl.json"
    result = CliRunner().invoke(app, ["dev", "bench", "verl", "--sizes", "12", "--repeats", "2",
                                      "--batch", "4", "--step-s", "0.3", "--lag-s", "0.4",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    (row,) = report["results"]
    assert row["groups"] == 12 and row["trajectories"] == 48
    for impl in IMPLS:
        figures = row["impls"][impl]
        assert figures["median_ms"] > 0 and figures["first_ms"] > 0
        assert figures["timed_calls"] == 2
        assert figures["min_ms"] <= figures["p25_ms"] <= figures["median_ms"] \
            <= figures["p75_ms"] <= figures["max_ms"]
        # ours: how long its thread's clears ran past the return (waited for, untimed)
        assert (figures["after_ms"] >= 0) if impl.startswith("ours") else "after_ms" not in figures
    assert row["order"] == "interleaved"
    floor = row["tq_floor"]                 # the bare TransferQueue calls, same run
    assert floor["decisions"]["median_ms"] == floor["list_ms"]     # the clear is after the call
    for mode in ("decisions", "rewards"):
        assert floor[mode]["timed_calls"] == 2 and floor[mode]["median_ms"] > 0
    assert all(floor[f"{p}_ms"] > 0 for p in FLOOR_PARTS)
    assert row["verl_over_floor"] == row["impls"]["verl"]["median_ms"] / floor["decisions"]["median_ms"]
    assert "tq, rewards" in result.output and "tq, decisions" in result.output
    assert row["verl_over_ours"] == row["impls"]["verl"]["median_ms"] / row["impls"]["ours"]["median_ms"]
    assert (row["step_s"], row["lag_s"]) == (0.3, 0.4)
    for impl in STEP_IMPLS:                 # the phase with a trainer step between calls
        figures = row["stepped"][impl]
        assert figures["median_ms"] > 0 and figures["step_cpu_ms"] >= 0
        assert figures["step_s"] == 0.3
    for impl in ("ours_bg", "ours_rewards_bg"):
        assert 0 <= row["stepped"][impl]["calls_on_background_view"] <= 2
    assert row["stepped_verl_over_ours_bg"] == (row["stepped"]["verl"]["median_ms"]
                                                / row["stepped"]["ours_bg"]["median_ms"])
    assert "mirror_max_lag=0.4" in result.output and "ours_rewards_bg" in result.output


def test_each_implementation_lists_only_its_own_transfer_queue(tq, rollout) -> None:
    """verl lists every partition of its TransferQueue: the benchmark gives each implementation
    one of its own, so that verl's listing holds its partition's keys alone."""
    systems = Systems()
    try:
        for part in ("train-a", "train-b"):
            systems.of(part)
            tq.kv_batch_put(keys=[f"{part}-k"], partition_id=part, tags=[{"is_prompt": False}])
        for part, other in (("train-a", "train-b"), ("train-b", "train-a")):
            systems.of(part)
            listing = tq.kv_list()
            assert list(listing.get(part, {})) == [f"{part}-k"] and other not in listing
        systems.of("train-a")
        assert tq_systems.current() is systems.main     # the first partition's is init's
    finally:
        stop(tq, False, systems)          # clears both partitions, closes the added system
    assert tq_systems.current() is systems.main
