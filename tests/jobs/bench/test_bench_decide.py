"""Smoke test of `replaylake dev bench decide` under each staleness policy: tiny sizes, every
policy's row in the report, and the buffer and the reference agreeing on what each call marks
(the benchmark raises otherwise); a policy it does not know is refused naming it."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from jobs.bench.decide import BATCH, POLICIES, STALE_PER_CALL, ReferenceBuffer, run_size
from jobs.cli import app


def test_every_policy_has_its_row(tmp_path: Path) -> None:
    out = tmp_path / "decide.json"
    result = CliRunner().invoke(app, ["dev", "bench", "decide", "--sizes", "800", "--repeats",
                                      "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["results"]
    assert list(POLICIES) == ["drop", "mask", "per-dataset"]
    # each policy under oldest-first, then each declared order asked (spread_first) under drop
    assert [(r["policy"], r["order"]) for r in rows] == [
        ("drop", "oldest"), ("mask", "oldest"), ("per-dataset", "oldest"), ("drop", "spread_first")]
    assert all(r["ours_sample_ms"] > 0 and r["reference_ms"] > 0 for r in rows)


def test_an_unknown_policy_is_refused_naming_it(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["dev", "bench", "decide", "--sizes", "800", "--policies",
                                      "drop,bogus", "--out", str(tmp_path / "d.json")])
    assert result.exit_code != 0
    assert "unknown ['bogus']" in result.output
    assert not (tmp_path / "d.json").exists()


def test_the_reference_marks_under_mask_and_judges_each_dataset_by_its_bound() -> None:
    ref = ReferenceBuffer(POLICIES["per-dataset"])
    # at step 10: math (bound 4) at span 5 goes, code (8) at 5 stays, web (the '*' 6) at 7 goes
    for uid, gs, d in (("m", 6, "math"), ("c", 6, "code"), ("w", 4, "web"), ("w6", 5, "web")):
        ref.groups[uid] = {"status": "finished", "global_steps": gs, "dataset": d}
    assert ref.sample(10, 8) == ["w6", "c"]
    mask = ReferenceBuffer(POLICIES["mask"])
    mask.groups = {"old": {"status": "finished", "global_steps": 5, "dataset": None},
                   "new": {"status": "finished", "global_steps": 9, "dataset": None}}
    assert (mask.sample(10, 8), mask.marked) == (["old", "new"], ["old"])


def test_mask_trains_each_calls_stale_groups_marked_and_the_others_evict_them() -> None:
    rng = np.random.default_rng(0)
    masked = {p: run_size(800, 1, rng, p)["masked_per_call"] for p in POLICIES}
    assert masked == {"drop": 0, "mask": STALE_PER_CALL, "per-dataset": 0}
    assert STALE_PER_CALL < BATCH          # the batch takes the stale groups and fresh ones


def test_the_report_fits_80_columns_without_cutting_a_cell() -> None:
    from rich.console import Console

    from jobs.bench.decide import tables
    row = {"trajectories": 1_000_000, "policy": "drop", "order": "oldest_version",
           "ours_decision_ms": 12.34, "ours_capacity_ms": 12.34, "ours_sample_ms": 123.45,
           "ours_sample_alone_ms": 123.45, "reference_ms": 1234.56, "speedup_decision": 10.0,
           "speedup_sample": 10.0, "speedup_sample_alone": 10.0}
    console = Console(width=80, record=True)
    for t in tables([row, {**row, "policy": "per-dataset", "order": "oldest"}]):
        console.print(t)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    for cell in ("1,000,000", "oldest_version", "per-dataset", "capacity", "123.45", "1234.56",
                 "10.0x"):
        assert cell in text, cell
    assert "…" not in text
