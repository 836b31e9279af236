"""Smoke test of `replaylake dev bench torch`: tiny sizes, and the JSON report has every figure."""
from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from jobs.cli import app

FIELDS = {"batch_size", "layout", "tokens", "shape", "output_bytes", "ours_ms", "memcpy_ms",
          "ours_over_memcpy", "meets_goal", "pooled_ms", "memcpy_warm_ms",
          "pooled_over_memcpy_warm", "pooled_meets_goal", "padding_bytes", "memcpy_all_ms",
          "ours_over_memcpy_all"}


def test_bench_torch_writes_every_figure_for_each_size_and_layout(tmp_path: Path) -> None:
    out = tmp_path / "bench" / "torch.json"
    result = CliRunner().invoke(app, [
        "dev", "bench", "torch", "--out", str(out), "--batch-sizes", "3,8", "--prompt-lengths", "0:5",
        "--response-lengths", "1:9", "--repeats", "2"])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    rows = report["results"]
    assert [(r["batch_size"], r["layout"]) for r in rows] == [
        (3, "padded"), (3, "packed"), (8, "padded"), (8, "packed")]
    for r in rows:
        assert FIELDS <= set(r)
        assert r["ours_ms"] > 0 and r["memcpy_ms"] > 0
        assert r["ours_over_memcpy"] == r["ours_ms"] / r["memcpy_ms"]
        assert r["pooled_ms"] > 0 and r["memcpy_warm_ms"] > 0
        assert r["pooled_over_memcpy_warm"] == r["pooled_ms"] / r["memcpy_warm_ms"]
    assert report["goals"] == {"padded": {"batch_size": 1024, "max_over_memcpy": 1.3},
                               "packed": {"max_over_memcpy": 1.5}}
    assert "Batch -> torch" in result.output


def test_the_reference_copies_the_data_and_fills_only_the_padding() -> None:
    """The memcpy reference writes each tensor's data bytes by copy and its padding by memset:
    [B, L] tensors hold prompt + response tokens, the responses layout its response tokens,
    per-row and packed tensors are all data."""
    from jobs.bench.to_torch import real_bytes, synthetic_batch
    from pipeline.to_torch import batch_to_torch

    table = synthetic_batch(5, (2, 6), (3, 9), seed=3)
    padded = batch_to_torch(table, layout="padded")
    p = padded["prompt_lengths"].numpy()
    r = padded["response_lengths"].numpy()
    real = dict(zip(padded, real_bytes(padded)))
    assert real["input_ids"] == int((p + r).sum()) * 8
    assert real["rollout_log_probs"] == int((p + r).sum()) * 4
    assert real["responses"] == int(r.sum()) * 8
    assert real["responses_log_probs"] == int(r.sum()) * 4
    assert real["rewards"] == 5 * 4
    assert real["input_ids"] < padded["input_ids"].numel() * 8      # the batch has padding
    packed = batch_to_torch(table, layout="packed")
    assert real_bytes(packed) == [t.numel() * t.element_size() for t in packed.values()]


def test_the_report_fits_80_columns_without_cutting_a_cell() -> None:
    from rich.console import Console

    from jobs.bench.to_torch import views
    row = {"batch_size": 1024, "layout": "packed", "shape": [1, 12345678],
           "output_bytes": 1234 * 2**20, "ours_ms": 1234.5, "memcpy_ms": 1234.5,
           "ours_over_memcpy": 12.34, "meets_goal": False, "pooled_ms": 1234.5,
           "memcpy_warm_ms": 1234.5, "pooled_over_memcpy_warm": 12.34,
           "pooled_meets_goal": None}
    console = Console(width=80, record=True)
    for view in views([row]):
        console.print(view)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    for cell in ("1x12345678", "1234", "1234.5", "12.34x", "MISSED", "memcpy warm"):
        assert cell in text, cell
    assert "…" not in text
