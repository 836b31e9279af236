"""The main job (`replaylake demo`): a few real steps, its run directory, its outputs.

The longer run that shows learning and evictions is in test_demo_learning.py.
"""
from __future__ import annotations

import io
import json
import re
from collections import Counter, defaultdict
from dataclasses import replace

import pytest
from rich.console import Console
from typer.testing import CliRunner

from jobs.cli import app
from jobs.demo.config import MARKER, DemoConfig, RunDirError, make_run_dir
from jobs.demo.main import _intro, run
from jobs.demo.policy import DIGIT0, SEP, dataset_index
from jobs.demo.summary import render, summarize, try_commands
from pipeline import ConfigError
from pipeline.adapters.wandb.offline import read_run
from pipeline.adapters.wandb.tracker import TABLE_KEY, format_reward_counts
from pipeline.analysis.views import connect
from sql.loader import load
from sql.loader import run as run_query
from tests.support.extras import need


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """Six real steps of the demo with W&B offline; returns (run directory, console text)."""
    need("wandb", "wandb")
    out = tmp_path_factory.mktemp("demo") / "run"
    console = Console(file=io.StringIO(), width=80)
    cfg = replace(DemoConfig(), steps=6)
    run(cfg, out=out, use_wandb=True, console=console)
    return out, console.file.getvalue()


def test_smoke_run_trains_every_step_and_writes_its_own_run_directory(smoke):
    out, text = smoke
    assert (out / MARKER).exists()
    config = json.loads((out / "config.json").read_text())
    assert config["steps"] == 6 and config["threshold"] == 2 and config["strategy"] == "drop"
    con = connect(out / "lake")
    steps = [r[0] for r in con.sql("select step from batches order by step").fetchall()]
    assert steps == [1, 2, 3, 4, 5, 6]
    sizes = {r[0] for r in con.sql("select n_groups from batches").fetchall()}
    assert sizes == {32}
    assert json.loads((out / "summary.json").read_text())["steps"] == 6
    assert "What happened" in text and "replaylake sql --lake" in text


def test_wandb_run_holds_each_step_and_the_filter_table_matches_the_lake(smoke):
    out, _ = smoke
    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    wb = read_run(runs[0])
    assert wb.finished and wb.config["steps"] == 6
    assert sorted(wb.values("train/loss")) == [1, 2, 3, 4, 5, 6]
    con = connect(out / "lake")
    per_step: dict[int, Counter] = defaultdict(Counter)
    for step, value in con.sql("select step, value from decisions where kind = 'evict' "
                               "and reason = 'zero_variance'").fetchall():
        per_step[step][value] += 1
    expected = [[g, format_reward_counts(c)] for g, c in sorted(per_step.items())]
    assert expected and wb.table_rows(TABLE_KEY) == expected
    logged = wb.values("training/filter_groups/evicted_samples")
    assert logged == {g: sum(c.values()) for g, c in per_step.items()}


def test_the_demo_lake_says_which_prompts_keep_getting_evicted(smoke):
    out, _ = smoke
    con = connect(out / "lake")
    rows = run_query(con, load("evicted_prompts")).to_pylist()
    assert rows
    assert all(0 <= r["prompt_id"] < 1110 and r["evicted"] >= 1 and r["evicted_by_reason"]
               for r in rows)
    # every group names the prompt its trajectories answer, as that prompt's dataset index
    pairs = con.sql("select distinct g.uid, g.prompt_id, t.prompt_ids from groups as g "
                    "join trajectories as t using (partition, uid)").fetchall()
    assert pairs
    wrong = [(u, p, ids) for u, p, ids in pairs
             if p != dataset_index([t - DIGIT0 for t in ids if t != SEP])]
    assert not wrong
    ((unnamed,),) = con.sql("select count(*) from groups where prompt_id is null").fetchall()
    assert unnamed == 0


def test_the_commands_the_summary_suggests_run_against_the_lake(smoke):
    out, _ = smoke
    summary = summarize(out / "lake")
    runner = CliRunner()
    for what, argv in try_commands(out / "lake", summary.example_uid):
        res = runner.invoke(app, argv)
        assert res.exit_code == 0, (what, res.output)
        assert re.search(r"\(\d+ rows?\)", res.output), (what, res.output)


def test_the_summary_fits_an_80_column_terminal(smoke, tmp_path):
    out, _ = smoke
    summary = summarize(out / "lake")
    # seen from the directory above the run, as a default run (runs/demo/<timestamp>) is: the
    # printed paths are relative to where the user stands
    lines = render(summary, run_dir=out, lake=out / "lake",
                   wandb_dir=next((out / "wandb").glob("offline-run-*")), wall_s=12.0,
                   cwd=out.parent)
    lines += [*DemoConfig().lines(), *_intro(DemoConfig()).splitlines()]
    too_wide = [str(x) for x in lines if len(str(x)) > 80]
    assert not too_wide


def test_the_mask_intro_states_the_staleness_bound_it_speaks_of(tmp_path):
    # without the DAPO filter nothing before it names the bound: the sentence must say it itself
    res = CliRunner().invoke(app, ["demo", "--strategy", "mask", "--filter-metric", "none",
                                   "--steps", "1", "--no-wandb", "--whatif-calls", "0",
                                   "--out", str(tmp_path / "run")], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert ("replaylake evicts failed groups, and asks for new prompts to replace them. With "
            "strategy 'mask' a group dispatched 2 or more steps before the step that would "
            "train it is not evicted but trained with its loss switched off") in text, text


def test_a_non_empty_directory_the_demo_did_not_make_is_refused_and_left_alone(tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("keep me")
    res = CliRunner().invoke(app, ["demo", "--out", str(notes), "--steps", "1", "--no-wandb"])
    assert res.exit_code == 2
    assert "not empty" in res.output
    assert sorted(p.name for p in notes.iterdir()) == ["todo.txt"]
    assert (notes / "todo.txt").read_text() == "keep me"


def test_an_earlier_demo_run_is_refused_too_never_overwritten(tmp_path):
    first = make_run_dir(tmp_path / "run")
    (first / "lake").mkdir()
    with pytest.raises(RunDirError, match="earlier demo run"):
        make_run_dir(tmp_path / "run")
    assert (first / "lake").is_dir()


def test_default_run_directories_are_fresh_and_latest_points_at_the_newest(tmp_path):
    a = make_run_dir(None, root=tmp_path)
    b = make_run_dir(None, root=tmp_path)
    assert a != b and a.parent == b.parent == tmp_path
    assert (tmp_path / "latest").resolve() == b.resolve()


def test_a_real_latest_directory_is_never_replaced(tmp_path):
    (tmp_path / "latest").mkdir()
    (tmp_path / "latest" / "mine.txt").write_text("x")
    make_run_dir(None, root=tmp_path)
    assert (tmp_path / "latest" / "mine.txt").read_text() == "x"


def test_bad_flags_are_refused_before_anything_is_written(tmp_path):
    runner = CliRunner()
    for argv in (["--threshold", "two"], ["--threshold", "0"], ["--strategy", "later"],
                 ["--failure-rate", "1.5"], ["--steps", "0"]):
        out = tmp_path / argv[0].strip("-") / "run"
        res = runner.invoke(app, ["demo", "--out", str(out), "--no-wandb", *argv])
        assert res.exit_code == 2, (argv, res.output)
        assert not out.exists(), argv
    with pytest.raises(ConfigError, match="n=1"):
        DemoConfig(n=1)


def test_the_run_ends_with_a_what_if_of_its_own_lake(smoke):
    out, text = smoke
    tail = text.split("What if (this run's lake replayed under other settings")[1]
    rows = {line.split()[0]: line.split()[1:] for line in tail.splitlines()
            if line.split() and line.split()[0] in ("recorded", "threshold=1", "threshold=4",
                                                     "strategy=admit")}
    assert list(rows) == ["recorded", "threshold=1", "threshold=4", "strategy=admit"]
    # the six steps are inside the 40-call window: the recorded row trains what the run trained
    trained = json.loads((out / "summary.json").read_text())["trained_trajectories"]
    assert rows["recorded"][0] == f"{trained:,}"
    assert rows["recorded"][-1] == "0"          # nothing trained over its bound
    command = " ".join(tail.replace("\\\n", " ").split())   # continued lines joined
    assert "whatif --lake" in command and "--compare threshold=1 threshold=4" in command
    assert max(len(line) for line in text.splitlines()) <= 80


@pytest.mark.parametrize(("changes", "why"), [
    ({"threshold": None}, "no staleness bound"),
    ({"strategy": "admit"}, "made under admit, which a replay cannot pace"),
    ({"whatif_calls": 0}, "--whatif-calls 0"),
    ({"resumed": True}, "resumed: a replay cannot re-issue groups")])
def test_a_run_the_closing_what_if_cannot_replay_says_why(tmp_path, changes, why):
    from jobs.demo.whatif import closing_whatif
    changes = dict(changes)
    resumed = changes.pop("resumed", False)
    lines = closing_whatif(replace(DemoConfig(), **changes), tmp_path / "lake", tmp_path,
                           resumed=resumed)
    assert lines == [f"What-if: none for this run ({why})."]


def test_the_closing_what_if_compares_a_tighter_and_a_looser_bound_and_admit():
    from jobs.demo.whatif import policies
    assert policies(2) == ["threshold=1", "threshold=4", "strategy=admit"]
    assert policies(1) == ["threshold=2", "strategy=admit"]     # nothing tighter than 1
    with pytest.raises(ConfigError, match="whatif_calls=-1: give a number of steps >= 0"):
        replace(DemoConfig(), whatif_calls=-1)


def test_the_summary_says_what_the_importance_ratios_did(smoke):
    out, text = smoke
    r = json.loads((out / "summary.json").read_text())["ratios"]
    assert set(r) == {"ratio_mean", "ratio_std", "ratio_std_max", "clip_fraction"}
    assert 0.0 <= r["clip_fraction"] <= 1.0 and 0.0 <= r["ratio_std"] <= r["ratio_std_max"]
    assert (f"Importance ratios: mean {r['ratio_mean']:.3f}, std {r['ratio_std']:.3f} "
            f"(max step {r['ratio_std_max']:.3f}), {r['clip_fraction']:.1%} clipped") in text
