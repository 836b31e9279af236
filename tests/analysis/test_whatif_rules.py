"""What-if replays take the `rules=` mapping: the recorded opt-in rules are replayed as recorded,
and a replay changes them one by one (switch one off, switch another on, change a knob)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jobs.cli import app
from pipeline import ConfigError
from pipeline.analysis import connect
from pipeline.analysis.whatif import recorded, recorded_settings, replay
from tests.support.sql_runs import simulate_async

OVERLONG = {"overlong": {"max_response_length": 3}}


@pytest.fixture(scope="module")
def overlong_lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A recorded async run with the overlong rule on (responses are 1 to 5 tokens long)."""
    lake = tmp_path_factory.mktemp("recorded") / "lake"
    simulate_async(lake, max_response_length=3, seed=4, surplus=2)
    assert _evicted(lake).get("overlong", 0) > 0, "the recorded run never evicted as overlong"
    return lake


def _evicted(lake: Path) -> dict[str, int]:
    rows = connect(lake).sql("select reason, count(*) from decisions where kind = 'evict' "
                             "group by reason").fetchall()
    return dict(rows)


def test_the_recorded_opt_in_rules_come_back_as_the_mapping(overlong_lake: Path):
    assert recorded_settings(overlong_lake)["rules"] == OVERLONG


def test_replaying_with_the_recorded_mapping_reproduces_every_batch(overlong_lake: Path,
                                                                    tmp_path: Path):
    got = replay(overlong_lake, tmp_path)
    assert got.batches == recorded(overlong_lake).batches and got.unfilled == []
    assert _evicted(got.lake)["overlong"] == _evicted(overlong_lake)["overlong"]


def test_a_replay_switches_a_recorded_rule_off_and_another_on(overlong_lake: Path,
                                                              tmp_path: Path):
    got = replay(overlong_lake, tmp_path, rules={"overlong": None,
                                                 "short_response": {"min_response_length": 2}})
    evicted = _evicted(got.lake)
    assert "overlong" not in evicted and evicted["short_response"] > 0
    config = json.loads((got.lake / "_config.json").read_text())["versions"][-1]["config"]
    assert config["rules"]["short_response"] == {"min_response_length": 2}
    assert "overlong" not in config["rules"]


def test_a_replay_keeps_the_recorded_rules_it_does_not_name(overlong_lake: Path, tmp_path: Path):
    got = replay(overlong_lake, tmp_path, rules={"short_response": {"min_response_length": 2}})
    assert set(_evicted(got.lake)) >= {"overlong", "short_response"}


def test_the_keyword_changes_the_recorded_overlong_knob(overlong_lake: Path, tmp_path: Path):
    got = replay(overlong_lake, tmp_path, max_response_length=5)   # no mean exceeds 5 tokens
    assert "overlong" not in _evicted(got.lake)


def test_a_replay_checks_the_mapping_as_the_presets_do(overlong_lake: Path, tmp_path: Path):
    with pytest.raises(ConfigError, match="did you mean 'short_response'"):
        replay(overlong_lake, tmp_path, rules={"short_respons": {"min_response_length": 2}})


def test_the_cli_takes_rules_as_options(overlong_lake: Path, tmp_path: Path):
    res = CliRunner().invoke(app, ["whatif", "--lake", str(overlong_lake), "--out", str(tmp_path),
                                   "--rule", "short_response.min_response_length=2",
                                   "--rule", "overlong=off"])
    assert res.exit_code == 0, res.output
    counts = {line.split()[1]: [int(v) for v in line.split()[-2:]]
              for line in res.output.splitlines() if line.startswith("evicted: ")}
    assert counts["overlong"][1] == 0 < counts["overlong"][0]
    assert counts["short_response"][0] == 0 < counts["short_response"][1]


def test_a_lake_recorded_before_rules_were_kept_replays_without_opt_in_rules(
        overlong_lake: Path, tmp_path: Path):
    lake = tmp_path / "old"
    shutil.copytree(overlong_lake, lake)
    rec = json.loads((lake / "_config.json").read_text())
    for v in rec["versions"]:
        del v["config"]["rules"]
    (lake / "_config.json").write_text(json.dumps(rec))
    assert recorded_settings(lake)["rules"] == {}
