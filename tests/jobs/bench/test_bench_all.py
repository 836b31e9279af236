"""Smoke tests of `replaylake dev bench all --quick`, the markdown table and `bench memory` (no timing
is asserted: only that every figure is produced, with its reference, from one run)."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from jobs.bench.table import (
    BEGIN,
    END,
    RAY_BEGIN,
    RAY_END,
    SUMMARY_BEGIN,
    SUMMARY_END,
    render,
    write_doc,
)
from jobs.cli import app
from tests.support.extras import need
from tests.support.lake import ROOT, python_env

SECTIONS = {"ingest", "to_torch", "decide", "verl", "memory", "ray"}


def test_bench_all_quick_writes_every_section_with_its_reference_and_a_markdown_table(
        tmp_path: Path) -> None:
    for extra in ("verl", "transfer_queue"):   # the verl section measures against verl itself
        need(extra, "verl")       # bench all's verl section measures against verl itself
    out = tmp_path / "all.json"
    doc = tmp_path / "performance.md"
    doc.write_text(f"# Performance\n\nprose before\n\n{BEGIN}\nold\n{END}\n\nprose after\n")
    # in a process of its own: the verl section starts Ray and TransferQueue and shuts them down,
    # and objects of theirs left in this process would be collected later, after the shutdown,
    # in the middle of unrelated tests (a segfault, once every few full runs)
    result = subprocess.run([sys.executable, "-m", "jobs.cli", "dev", "bench", "all", "--quick",
                             "--out", str(out), "--doc", str(doc)], capture_output=True,
                            text=True, timeout=900, env=python_env(), cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    assert report["quick"] is True
    assert set(report["sections"]) == SECTIONS
    md = out.with_suffix(".md").read_text()
    for name, body in report["sections"].items():
        assert "error" not in body, (name, body)
        assert body["figures"], name
        for f in body["figures"]:
            assert math.isfinite(f["value"]) and f["value"] >= 0, f
            assert math.isfinite(f["reference_value"]) and f["reference_value"] > 0, f
            assert f["path"] in md
    paths = [f["path"] for b in report["sections"].values() for f in b["figures"]]
    assert any("lake (no fsync)" in p for p in paths) and any("large puts" in p for p in paths)
    assert any("packed" in p for p in paths) and any("rewards mirror" in p for p in paths)
    assert any("through the Ray actor" in p for p in paths) and any("saturat" in p for p in paths)
    text = doc.read_text()
    assert text.startswith("# Performance\n\nprose before\n") and text.endswith("prose after\n")
    assert "old" not in text and md in text


def test_the_table_is_regenerated_from_the_json_alone(tmp_path: Path) -> None:
    report = {"quick": False, "cpus": 2, "machine": "m", "sections": {
        "to_torch": {"figures": [{"path": "to_torch packed, B=8", "value": 3.0, "unit": "ms",
                                  "reference": "memcpy ms", "reference_value": 2.0,
                                  "ratio": 1.5, "ratio_label": "x memcpy",
                                  "goal": "<= 1.5x memcpy", "meets_goal": True}]},
        "verl": {"error": "RuntimeError: no TransferQueue"}}}
    src = tmp_path / "all.json"
    src.write_text(json.dumps(report))
    doc = tmp_path / "perf.md"
    result = CliRunner().invoke(app, ["dev", "bench", "table", str(src), "--doc", str(doc)])
    assert result.exit_code == 0, result.output
    assert doc.read_text() == f"{BEGIN}\n{render(report)}{END}\n"
    assert "| to_torch | to_torch packed, B=8 | 3.00 ms | 2.00 (memcpy ms) | 1.50 x memcpy | " \
           "<= 1.5x memcpy | yes |" in doc.read_text()
    assert "| verl | failed: RuntimeError: no TransferQueue |" in doc.read_text()
    write_doc(doc, render(report))   # idempotent: one table, not two
    assert doc.read_text().count(BEGIN) == 1


def test_the_readme_summary_holds_only_the_figures_with_a_goal(tmp_path: Path) -> None:
    fig = {"unit": "ms", "reference": "memcpy ms", "reference_value": 2.0, "ratio": 1.5,
           "ratio_label": "x memcpy"}
    report = {"quick": False, "cpus": 2, "machine": "m", "sections": {"to_torch": {"figures": [
        {**fig, "path": "packed, B=8", "value": 3.0, "goal": "<= 1.5x memcpy", "meets_goal": True},
        {**fig, "path": "pooled, B=8", "value": 3.1, "goal": "", "meets_goal": None},
        {**fig, "path": "padded, B=8", "value": 4.0, "goal": "<= 1.3x memcpy",
         "meets_goal": False}]}}}
    src = tmp_path / "all.json"
    src.write_text(json.dumps(report))
    readme = tmp_path / "README.md"
    readme.write_text(f"# r\n\n{SUMMARY_BEGIN}\nold\n{SUMMARY_END}\n\nafter\n")
    perf = tmp_path / "perf.md"
    perf.write_text(f"# p\n\n{BEGIN}\nold\n{END}\n")
    result = CliRunner().invoke(app, ["dev", "bench", "table", str(src), "--doc", str(perf),
                                      "--doc", str(readme)])
    assert result.exit_code == 0, result.output
    summary = readme.read_text()
    assert summary == f"# r\n\n{SUMMARY_BEGIN}\n{render(report, goals_only=True)}{SUMMARY_END}\n\nafter\n"
    assert "packed, B=8" in summary and "padded, B=8 | 4.00 ms" in summary
    assert "pooled, B=8" not in summary and BEGIN not in summary
    assert "pooled, B=8" in perf.read_text() and SUMMARY_BEGIN not in perf.read_text()


def test_the_scaling_doc_gets_only_the_ray_figures_between_its_markers(tmp_path: Path) -> None:
    fig = {"unit": "ms", "reference": "in-process buffer ms", "reference_value": 0.3,
           "ratio": 12.0, "ratio_label": "x in-process", "goal": "", "meets_goal": None}
    report = {"quick": False, "cpus": 2, "machine": "m", "sections": {
        "ingest": {"figures": [{**fig, "path": "put, in memory", "value": 1.0}]},
        "ray": {"figures": [{**fig, "path": "put through the Ray actor (median)", "value": 3.6}]}}}
    src = tmp_path / "all.json"
    src.write_text(json.dumps(report))
    scaling = tmp_path / "scaling.md"
    scaling.write_text(f"# s\n\nprose 1\n\n{RAY_BEGIN}\nold\n{RAY_END}\n\nprose 2\n")
    result = CliRunner().invoke(app, ["dev", "bench", "table", str(src), "--doc", str(scaling)])
    assert result.exit_code == 0, result.output
    text = scaling.read_text()
    assert text == (f"# s\n\nprose 1\n\n{RAY_BEGIN}\n{render(report, sections=('ray',))}"
                    f"{RAY_END}\n\nprose 2\n")
    assert "| ray | put through the Ray actor (median) | 3.60 ms |" in text
    assert "put, in memory" not in text and BEGIN not in text


def test_bench_memory_reports_rss_growth_against_the_payload_and_what_release_returns(
        tmp_path: Path) -> None:
    out = tmp_path / "memory.json"
    result = CliRunner().invoke(app, ["dev", "bench", "memory", "--sizes", "400,800", "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["results"]
    assert [r["trajectories"] for r in rows] == [400, 800]
    for r in rows:
        assert r["payload_bytes"] > 0 and r["groups"] == r["trajectories"] // 4
        assert r["rss_over_payload"] == r["rss_growth_bytes"] / r["payload_bytes"]
        assert r["arrow_pool_after_release_bytes"] <= r["arrow_pool_growth_bytes"]


def test_a_bench_out_names_a_directory_when_it_is_one_or_has_no_suffix(tmp_path: Path) -> None:
    from jobs.bench.out import result_path
    assert result_path(tmp_path / "new" / "bench", "all.json") == tmp_path / "new/bench/all.json"
    assert (tmp_path / "new" / "bench").is_dir()
    (tmp_path / "there.d").mkdir()
    assert result_path(tmp_path / "there.d", "ray.json") == tmp_path / "there.d" / "ray.json"
    assert result_path(tmp_path / "r.json", "all.json") == tmp_path / "r.json"
    (tmp_path / "plain").write_text("{}")             # an existing file is written over
    assert result_path(tmp_path / "plain", "all.json") == tmp_path / "plain"
