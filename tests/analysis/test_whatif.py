"""What-if replays: the recorded settings reproduce every recorded batch (scripted run and a real
demo lake); other settings change evictions and the CLI prints the comparison."""
from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pyarrow.compute as pc
import pytest
from typer.testing import CliRunner

from jobs.cli import app
from pipeline import ReplayBuffer
from pipeline.analysis.views import read_lake
from pipeline.analysis.whatif import step_ranges
from pipeline.analysis.whatif.rerun import recorded, replay
from tests.support.sql_runs import shared_run

ROOT = Path(__file__).resolve().parents[2]


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


def _pipelined_run(lake: Path, steps: int = 8) -> Path:
    """A recorded async run whose rollouts were dispatched two steps before they are trained,
    each generated with the newest weights (version step - 1): no eviction at threshold 3."""
    buf = ReplayBuffer.async_(lake=lake, max_off_policy_threshold=3, filter_groups_metric=None,
                              poll_interval=0.001)
    with buf:
        for g in range(1, steps + 1):
            uids = [f"s{g}g{i}" for i in range(2)]
            buf.register(partition="train", uids=uids, global_steps=max(g - 2, 0), n=2)
            buf.put([{"partition": "train", "uid": u, "session_id": s, "index": 0,
                      "min_global_steps": g - 1, "max_global_steps": g - 1,
                      "reward": float(s), "prompt_ids": [1, 2], "response_ids": [3, 4, 5],
                      "is_padding": False} for u in uids for s in range(2)])
            buf.update_status(partition="train", uids=uids, status="finished")
            buf.release(buf.sample(g, "train", 2, timeout=10))
    return lake


def test_a_floor_with_nothing_to_floor_is_a_dash(tmp_path: Path) -> None:
    lake = _pipelined_run(tmp_path / "recorded")          # its rows report no version spans
    res = CliRunner().invoke(app, ["whatif", "--lake", str(lake), "--threshold", "1",
                                   "--out", str(tmp_path / "replay")])
    assert res.exit_code == 0, res.output
    got = cells(res.output)
    assert got["future_rows"][1] != "0" and got["staleness_mean"][1].startswith(">= ")
    assert got["token_staleness_exact_mean"] == ("-", "-")


def test_a_replay_reaching_later_rollouts_sums_up_their_future_versions_in_one_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    lake = _pipelined_run(tmp_path / "recorded")
    with caplog.at_level(logging.WARNING, logger="replaylake"):
        res = CliRunner().invoke(app, ["whatif", "--lake", str(lake), "--threshold", "1",
                                       "--out", str(tmp_path / "replay")])
    assert res.exit_code == 0, res.output
    assert not [r for r in caplog.records if "from the future" in r.getMessage()]
    future = [n for n in notes(res.output) if "from the future" in n]
    assert len(future) == 1 and notes(res.output)[-1] == future[0]
    got = replay(lake, tmp_path / "again", max_off_policy_threshold=1)
    steps = sorted(got.future_rows)
    assert len(steps) >= 2 and all(n > 0 for n in got.future_rows.values())
    assert f"{len(steps)} of 8 sample calls (steps {step_ranges(steps)})" in future[0]


def notes(output: str) -> list[str]:
    """The approximations printed under the table, each note's wrapped lines joined."""
    lines = output.splitlines()
    if "what the replay approximates:" not in lines:
        return []
    out: list[str] = []
    for line in lines[lines.index("what the replay approximates:") + 1:]:
        if line.startswith("  - "):
            out.append(line[4:])
        else:
            out[-1] += " " + line.strip()
    return out


def cells(output: str) -> dict[str, tuple[str, str]]:
    """The table's rows: figure -> (recorded cell, what-if cell)."""
    out = {}
    for line in output.splitlines():
        key, rest = line[:28].strip(), line[28:]
        if key and len(rest) == 24:
            out[key] = (rest[:12].strip(), rest[12:].strip())
    return out


def test_figures_a_replay_cannot_stand_behind_are_floors_and_each_approximation_is_named(
        tmp_path: Path) -> None:
    from pipeline.analysis import connect
    from sql import loader
    lake = shared_run("async").lake
    res = CliRunner().invoke(app, ["whatif", "--lake", str(lake), "--strategy", "wait",
                                   "--threshold", "1", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert max(len(x) for x in res.output.splitlines()) <= 80
    con = connect(tmp_path / "lake")
    trained, future, mean_floor, max_floor = con.sql(
        "select count(*), count(*) filter (where staleness < 0), "
        "avg(greatest(staleness, 0)), max(greatest(staleness, 0)) "
        "from provenance where not is_padding").fetchall()[0]
    over = loader.run(con, "certificate_holds").num_rows        # the audit, run on its own
    assert future > 0 and over > 0
    got = cells(res.output)
    assert got["trained_rows"][1] == str(trained)
    assert got["future_rows"] == ("0", str(future))
    assert got["staleness_mean"][1] == f">= {mean_floor:.3f}"
    assert got["staleness_max"][1] == f">= {max_floor}"
    assert not got["staleness_mean"][0].startswith(">=")     # the recorded run has none
    assert got["over_bound_rows"] == ("0", str(over))
    said = notes(res.output)
    # without stale evictions the replay asks for fewer refills than the recorded run did, and
    # those it asks for at other steps; the gate holds calls past the recorded call's polls
    assert [n.split(":", 1)[0] for n in said] == ["arrivals", "wait", "refills", "refill timing",
                                                  "waited", "weight versions from the future"]
    assert f"wait: {over} of {trained} trained rows were trained above the bound (group " \
        "span > 1)" in said[1]


def test_a_replay_under_mask_names_the_masked_rows_the_audit_lists(tmp_path: Path) -> None:
    from pipeline.analysis import connect
    from sql import loader
    res = CliRunner().invoke(app, ["whatif", "--lake", str(shared_run("async").lake),
                                   "--strategy", "mask", "--threshold", "1", "--out",
                                   str(tmp_path)])
    assert res.exit_code == 0, res.output
    masked = loader.run(connect(tmp_path / "lake"), "certificate_holds").num_rows
    assert masked > 0
    assert cells(res.output)["over_bound_rows"][1] == str(masked)
    assert cells(res.output)["evicted: stale"][1] == "0"
    assert any(n.startswith(f"mask: {masked} of ") for n in notes(res.output))


def test_the_recorded_settings_print_no_approximation(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["whatif", "--lake", str(shared_run("async").lake),
                                   "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert notes(res.output) == [] and ">=" not in res.output
    assert "identical batches: 10 of 10" in res.output


def test_future_warnings_of_a_live_buffer_are_left_alone_by_a_replay(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="replaylake"):
        _pipelined_run(tmp_path / "recorded")
        replay(tmp_path / "recorded", tmp_path / "replay", max_off_policy_threshold=1)
        buf = ReplayBuffer.async_(lake=tmp_path / "live", max_off_policy_threshold=None,
                                  filter_groups_metric=None, poll_interval=0.001)
        with buf:
            buf.register(partition="train", uids=["u"], global_steps=1, n=1)
            buf.put([{"partition": "train", "uid": "u", "session_id": 0, "index": 0,
                      "min_global_steps": 3, "max_global_steps": 3, "reward": 1.0,
                      "prompt_ids": [1], "response_ids": [2], "is_padding": False}])
            buf.update_status(partition="train", uids=["u"], status="finished")
            buf.sample(2, "train", 1, timeout=10)
    future = [r for r in caplog.records if "from the future" in r.getMessage()]
    assert len(future) == 1 and "sample(step=2, train)" in future[0].getMessage()


def test_replaying_validation_calls_does_not_warn_of_an_unknown_partition(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    lake = shared_run("async").lake
    dec = read_lake(lake, tables=("decisions",))["decisions"]
    assert "val" in dec.filter(pc.equal(dec["kind"], "select"))["partition"].to_pylist()
    with caplog.at_level(logging.WARNING, logger="replaylake"):
        got = replay(lake, tmp_path)
    assert got.batches == recorded(lake).batches
    assert not [r for r in caplog.records if "has no group yet" in r.getMessage()]


def test_a_replay_under_admit_is_refused_naming_the_strategies_it_can_replay(tmp_path: Path
                                                                            ) -> None:
    from pipeline.errors import ConfigError
    lake = shared_run("async").lake
    with pytest.raises(ConfigError, match="cannot replay max_off_policy_strategy='admit'"):
        replay(lake, tmp_path, max_off_policy_strategy="admit")
    res = CliRunner().invoke(app, ["whatif", "--lake", str(lake), "--strategy", "admit",
                                   "--out", str(tmp_path / "cli")])
    assert res.exit_code != 0 and "--strategy drop or wait" in res.output


def test_filter_metric_none_switches_the_filter_off_in_the_replay(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["whatif", "--lake", str(shared_run("async").lake),
                                   "--filter-metric", "none", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    recorded_n, whatif_n = cells(res.output)["evicted: zero_variance"]
    assert int(recorded_n) > 0 and whatif_n == "0"
    # evicting nothing, the replay asks for none of the recorded refills: their groups are
    # not in it, and the approximations say how many (and how they were attributed)
    got = replay(shared_run("async").lake, tmp_path / "again", filter_groups_metric=None)
    assert got.refill_undrawn > 0
    assert f"refills: {got.refill_undrawn:,} group(s) the recorded refills registered were " \
           "never asked for" in " ".join(res.output.split())


def test_the_token_figure_is_named_as_the_exact_per_token_mean_it_is(tmp_path: Path) -> None:
    """`token_staleness_mean` is the response-length weighted mean elsewhere (report_headline,
    off_policy); what whatif prints is the exact per-token mean, so it carries off_policy's
    name for that figure."""
    from pipeline.analysis import connect
    lake = shared_run("async").lake
    exact, weighted = connect(lake).sql(
        "select sum(token_staleness_sum) / sum(span_tokens), "
        "sum(staleness * n_response_tokens) / sum(n_response_tokens) "
        "from provenance where not is_padding").fetchall()[0]
    assert f"{float(exact):.3f}" != f"{float(weighted):.3f}"      # two figures on this lake
    res = CliRunner().invoke(app, ["whatif", "--lake", str(lake), "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    got = cells(res.output)
    assert got["token_staleness_exact_mean"][0] == f"{float(exact):.3f}"
    assert "token_staleness_mean" not in got


def test_a_replay_that_trains_nothing_prints_dashes_and_its_unfilled_steps_as_a_range(
        tmp_path: Path) -> None:
    lake = _pipelined_run(tmp_path / "recorded")             # 8 calls, 3-token responses
    res = CliRunner().invoke(app, ["whatif", "--lake", str(lake), "--rule",
                                   "short_response.min_response_length=100",
                                   "--out", str(tmp_path / "replay")])
    assert res.exit_code == 0, res.output
    assert recorded(tmp_path / "replay" / "lake").batches == []
    got = cells(res.output)
    assert got["batches"] == ("8", "0")
    for key in ("staleness_mean", "staleness_max", "token_staleness_exact_mean"):
        assert got[key][1] == "-", key
    assert "NULL" not in res.output
    assert "unfilled steps: 1-8;" in res.output


def test_steps_are_summed_up_as_runs() -> None:
    from pipeline.analysis.whatif import step_ranges
    assert step_ranges([]) == "none"
    assert step_ranges([4]) == "4"
    assert step_ranges([8, 1, 2, 3, 5, 7, 3]) == "1-3, 5, 7-8"
    assert step_ranges(list(range(1, 151))) == "1-150"


def test_threshold_none_replays_without_a_staleness_bound(tmp_path: Path) -> None:
    from pipeline.analysis.whatif import recorded_settings
    lake = shared_run("async").lake
    assert recorded_settings(lake)["max_off_policy_threshold"] is not None
    res = CliRunner().invoke(app, ["whatif", "--lake", str(lake), "--threshold", "none",
                                   "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert recorded_settings(tmp_path / "lake")["max_off_policy_threshold"] is None
    recorded_n, whatif_n = cells(res.output)["evicted: stale"]
    assert int(recorded_n) > 0 and whatif_n == "0"
    bad = CliRunner().invoke(app, ["whatif", "--lake", str(lake), "--threshold", "two"])
    assert bad.exit_code == 2 and isinstance(bad.exception, SystemExit)
    assert "--threshold 'two': give a whole number of steps" in bad.output


def test_every_help_line_reads_whole_at_80_columns() -> None:
    import os
    proc = subprocess.run([sys.executable, "-m", "jobs.cli", "whatif", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "80", "TERMINAL_WIDTH": "80"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert max(len(x) for x in lines) <= 80
    assert not [x for x in lines if "…" in x]
    text = " ".join(x.strip("│ ") for x in lines)
    assert "max_off_policy_threshold:" in text and "oldest_version" in text
