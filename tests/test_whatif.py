"""What-if replays: the recorded settings reproduce every recorded batch (scripted run and a real
demo lake); other settings change evictions and the CLI prints the comparison."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jobs.cli import app
from pipeline.whatif import recorded, replay
from tests.support.sql_runs import shared_run

ROOT = Path(__file__).resolve().parents[1]


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
