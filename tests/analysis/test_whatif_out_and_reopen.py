"""Where a what-if writes, and what it says of a run reopened under other settings: an `--out`
that already holds a lake is refused before anything opens it (the recorded lake above all,
which a replay once appended a configuration to), and a record whose settings changed at a
reopen says so among what the replay approximates."""
from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jobs.cli import app
from pipeline import ConfigError, ReplayBuffer
from pipeline.analysis.whatif import compare_policies, recorded, replay
from tests.support.sql_runs import Rollout, simulate_async


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    lake = tmp_path_factory.mktemp("recorded") / "lake"
    simulate_async(lake, steps=5, seed=2)
    return lake


def _digest(lake: Path) -> str:
    return hashlib.sha256(b"".join(p.read_bytes() for p in sorted(lake.rglob("*"))
                                   if p.is_file())).hexdigest()


def test_an_out_whose_lake_is_the_recorded_one_is_refused_and_the_record_untouched(
        lake: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(lake, run / "lake")
    before = _digest(run / "lake")
    with pytest.raises(ConfigError, match="is the recorded lake"):
        replay(run / "lake", run)
    res = CliRunner().invoke(app, ["whatif", "--lake", str(run / "lake"), "--out", str(run)])
    assert res.exit_code == 2 and "is the recorded lake" in res.output
    assert _digest(run / "lake") == before


def test_the_same_out_twice_is_refused_before_anything_runs(lake: Path, tmp_path: Path) -> None:
    out = tmp_path / "w"
    assert replay(lake, out).batches == recorded(lake).batches
    before = _digest(out / "lake")
    with pytest.raises(ConfigError, match="already holds a lake"):
        replay(lake, out)
    assert _digest(out / "lake") == before
    cmp_out = tmp_path / "c"
    compare_policies(lake, ["threshold=1"], cmp_out)
    with pytest.raises(ConfigError, match=r"replays/p1/lake already holds a lake"):
        compare_policies(lake, ["threshold=1"], cmp_out)


def test_a_run_reopened_under_other_settings_says_so_in_what_the_replay_approximates(
        tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    ro = Rollout(seed=5)
    for threshold, steps, allow in ((1, range(1, 4), ()), (4, range(4, 7),
                                                         ("max_off_policy_threshold",))):
        buf = ReplayBuffer.async_(lake=lake, max_off_policy_threshold=threshold,
                                  refill_fn=ro.refill, poll_interval=0.01, allow_changes=allow)
        ro.buf = buf
        with buf:
            for g in steps:
                ro.step = g
                ro.dispatch(3)
                ro.dispatch(1, settle=False)      # settles never: ages past the bound
                buf.release(buf.sample(g, "train", 2, timeout=10))
    out = replay(lake, tmp_path / "replay")
    assert out.settings_changed is not None
    assert "max_off_policy_threshold 1 -> 4" in out.settings_changed
    res = CliRunner().invoke(app, ["whatif", "--lake", str(lake), "--out", str(tmp_path / "cli")],
                             env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())
    assert "settings: the run was reopened under other settings" in said
    assert "max_off_policy_threshold 1 -> 4" in said


def test_a_run_never_reopened_has_no_such_note(lake: Path, tmp_path: Path) -> None:
    assert replay(lake, tmp_path / "r").settings_changed is None


def test_compare_refuses_a_record_it_cannot_follow_before_it_announces_any_replay(
        tmp_path: Path) -> None:
    from pipeline import LakeError
    from tests.support.sql_runs import simulate_sync_dapo
    lake = tmp_path / "lake"
    simulate_sync_dapo(lake)                  # a restart re-issues a group: no replay follows it
    announced: list[str] = []
    with pytest.raises(LakeError, match="re-issued"):
        compare_policies(lake, ["threshold=1"], tmp_path / "out", progress=announced.append)
    assert announced == [] and not (tmp_path / "out" / "replays").exists()
