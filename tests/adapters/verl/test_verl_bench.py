"""Smoke test of `replaylake dev bench verl`: tiny sizes through the session's TransferQueue, and the
JSON report carries every implementation's figures and the ratios."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jobs.bench.verl import IMPLS, STEP_IMPLS
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
    assert row["order"] == "interleaved"
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
