"""The W&B tracker (pipeline/adapters/wandb/tracker.py) on real offline runs, read back from their files."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pipeline import ConfigError, ReplayBuffer
from pipeline.adapters.wandb.offline import read_run
from pipeline.adapters.wandb.tracker import TABLE_KEY, WandbTracker, format_reward_counts
from tests.support.extras import need
from tests.support.lake import ROOT, add_group

need("wandb", "wandb")


@pytest.fixture(autouse=True)
def _no_user_wandb_mode(monkeypatch):
    """The tracker's default must be tested without whatever the shell exported."""
    monkeypatch.delenv("WANDB_MODE", raising=False)


def test_reward_counts_cell_lists_values_ascending_as_value_colon_count():
    assert format_reward_counts({1.0: 2, 0.0: 3}) == "0:3, 1:2"
    assert format_reward_counts({0.5: 1, -1.0: 4, 2.25: 7}) == "-1:4, 0.5:1, 2.25:7"
    assert format_reward_counts({}) == ""
    # two values that agree in 6 digits stay two values (`:g` printed both as 0.123456)
    assert format_reward_counts({0.1234561: 1, 0.1234564: 2}) == "0.1234561:1, 0.1234564:2"
    assert format_reward_counts({1e16: 1, -0.0001: 2, 100.0: 3}) == "-0.0001:2, 100:3, 1e+16:1"


def test_importing_the_tracker_module_does_not_import_wandb():
    code = "import sys, pipeline.adapters.wandb.tracker; print('wandb' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_offline_run_holds_the_step_metrics_and_a_table_row_only_for_filtering_steps(tmp_path):
    with WandbTracker(dir=tmp_path, config={"threshold": 2}) as tracker:
        assert tracker.mode == "offline"
        tracker.log_step(1, {"loss": 0.5, "training/filter_groups/evicted_samples": 5},
                         {1.0: 2, 0.0: 3})
        tracker.log_step(2, {"loss": 0.25})
        tracker.log_step(4, {"loss": 0.125}, {0.0: 4})
        run_dir = tracker.run_dir
    assert run_dir.parent == tmp_path / "wandb" and run_dir.name.startswith("offline-run-")
    run = read_run(run_dir)
    assert run.finished
    assert run.config == {"threshold": 2}
    assert run.values("loss") == {1: 0.5, 2: 0.25, 4: 0.125}
    assert run.values("training/filter_groups/evicted_samples") == {1: 5}
    assert run.table_rows(TABLE_KEY) == [[1, "0:3, 1:2"], [4, "0:4"]]
    # the table is logged at step=global_steps: each row sits in the history row of its step
    steps_with_table = [row["_step"] for row in run.history if f"{TABLE_KEY}/path" in row]
    assert steps_with_table == [1, 4]
    assert {row[f"{TABLE_KEY}/_type"] for row in run.history if f"{TABLE_KEY}/_type" in row} \
        == {"incremental-table-file"}


def test_each_table_increment_holds_only_the_rows_added_since_the_previous_log(tmp_path):
    with WandbTracker(dir=tmp_path) as tracker:
        for g in range(1, 8):
            tracker.log_step(g, {"x": g}, {0.0: g})
        run_dir = tracker.run_dir
    run = read_run(run_dir)
    files = [row[f"{TABLE_KEY}/path"] for row in run.history if f"{TABLE_KEY}/path" in row]
    assert len(files) == 7
    for g, path in enumerate(files, start=1):
        table = json.loads((run_dir / "files" / path).read_text())
        assert table == {"columns": ["step", "reward_counts"], "data": [[g, f"0:{g}"]]}


def test_a_fresh_table_starts_after_increments_per_table_so_late_steps_cost_no_more(tmp_path):
    with WandbTracker(dir=tmp_path, increments_per_table=3) as tracker:
        for g in range(1, 11):
            tracker.log_step(g, {"x": g}, {1.0: 1})
        run_dir = tracker.run_dir
    run = read_run(run_dir)
    listed = [len(row[f"{TABLE_KEY}/previous_increments_paths"]) for row in run.history
              if f"{TABLE_KEY}/previous_increments_paths" in row]
    assert listed == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]
    assert run.table_rows(TABLE_KEY) == [[g, "1:1"] for g in range(1, 11)]


def test_finish_closes_the_run_once_however_often_it_is_called(tmp_path):
    tracker = WandbTracker(dir=tmp_path)
    tracker.log_step(1, {"x": 1.0})
    run_dir = tracker.run_dir
    tracker.finish()
    tracker.finish()
    with tracker:
        pass
    assert tracker.run is None
    with pytest.raises(ConfigError, match="finished"):
        tracker.log_step(2, {"x": 2.0})
    assert read_run(run_dir).finished


def test_steps_must_increase(tmp_path):
    with WandbTracker(dir=tmp_path) as tracker:
        tracker.log_step(3, {"x": 1.0})
        with pytest.raises(ConfigError, match="steps must increase"):
            tracker.log_step(3, {"x": 2.0})


def test_a_value_that_is_not_a_number_is_refused_by_key_and_the_step_can_be_retried(tmp_path):
    with WandbTracker(dir=tmp_path) as tracker:
        tracker.log_step(1, {"train/loss": 1.0})
        with pytest.raises(ConfigError, match=r"metrics\['train/loss'\]=None is not a number"):
            tracker.log_step(2, {"train/reward": 0.5, "train/loss": None})
        with pytest.raises(ConfigError, match=r"filtered_reward_counts\[0.0\]='many' is not"):
            tracker.log_step(2, {"train/loss": 0.5}, {0.0: "many"})
        tracker.log_step(2, {"train/reward": 0.5, "train/loss": 0.5}, {0.0: 3})
        run_dir = tracker.run_dir
    run = read_run(run_dir)
    assert run.values("train/loss") == {1: 1.0, 2: 0.5}
    assert run.values("train/reward") == {2: 0.5}         # nothing of the refused calls
    assert run.table_rows(TABLE_KEY) == [[2, "0:3"]]


def test_a_step_or_a_count_with_a_fraction_or_a_negative_count_is_refused_not_rounded(tmp_path):
    import numpy as np
    with WandbTracker(dir=tmp_path) as tracker:
        with pytest.raises(ConfigError, match=r"step=1.9 is not a whole number"):
            tracker.log_step(1.9, {"x": 1.0})
        with pytest.raises(ConfigError, match=r"filtered_reward_counts\[0.5\]=2.7 is not a whole"):
            tracker.log_step(1, {"x": 1.0}, {0.5: 2.7})
        with pytest.raises(ConfigError, match=r"filtered_reward_counts\[0.0\]=-3: a count"):
            tracker.log_step(1, {"x": 1.0}, {0.0: -3})
        tracker.log_step(np.int64(1), {"x": 1.0}, {0.5: 2.0, 1.0: np.int64(1)})   # whole: taken
        run_dir = tracker.run_dir
    run = read_run(run_dir)
    assert run.values("x") == {1: 1.0} and run.table_rows(TABLE_KEY) == [[1, "0.5:2, 1:1"]]


def test_the_run_config_reads_back_as_given_dict_values_included(tmp_path):
    config = {"opt": {"lr": 1e-6}, "w": {"value": 3, "x": 1}, "n": 5, "name": "grpo"}
    with WandbTracker(dir=tmp_path, config=config) as tracker:
        tracker.log_step(1, {"x": 1.0})
        run_dir = tracker.run_dir
    assert read_run(run_dir).config == config


def test_wandb_mode_set_by_the_user_is_respected_and_an_explicit_mode_wins(tmp_path,
                                                                            monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    with WandbTracker(dir=tmp_path / "env") as tracker:
        assert tracker.mode == "disabled" and tracker.run_dir is None
        tracker.log_step(1, {"x": 1.0}, {0.0: 1})
    assert not (tmp_path / "env" / "wandb").exists()
    with WandbTracker(dir=tmp_path / "explicit", mode="offline") as tracker:
        assert tracker.mode == "offline"
        tracker.log_step(1, {"x": 1.0})
        assert tracker.run_dir.is_dir()


def test_a_bad_increments_per_table_is_refused_before_a_run_starts(tmp_path):
    with pytest.raises(ConfigError, match="increments_per_table"):
        WandbTracker(dir=tmp_path, increments_per_table=0)
    assert not (tmp_path / "wandb").exists()


def test_log_batch_records_what_a_real_buffer_filtered_at_that_step(tmp_path):
    """Driving the buffer directly: the async preset with DAPO filtering evicts two all-zero
    groups and one all-one group; the tracker logs the batch's metrics and table row."""
    refills: list[int] = []
    buf = ReplayBuffer.async_(lake=tmp_path / "lake", max_off_policy_threshold=4,
                              filter_groups_metric="reward", refill_fn=refills.append,
                              poll_interval=0.05)
    with buf:
        add_group(buf, "z0", 1, (0.0, 0.0))
        add_group(buf, "z1", 1, (0.0, 0.0))
        add_group(buf, "o1", 1, (1.0, 1.0))
        add_group(buf, "m1", 1, (0.0, 1.0))
        batch = buf.sample(1, "train", 1, timeout=10)
        assert batch.filtered_reward_counts == {0.0: 2, 1.0: 1}
        with WandbTracker(dir=tmp_path) as tracker:
            tracker.log_batch(batch, extra={"train/loss": 0.75})
            run_dir = tracker.run_dir
        buf.release(batch)
    run = read_run(run_dir)
    assert run.values("training/filter_groups/evicted_samples") == {1: 3}
    assert run.values("train/loss") == {1: 0.75}
    assert run.table_rows(TABLE_KEY) == [[1, "0:2, 1:1"]]
    assert refills == [3]
