"""The lake records its configuration and refuses a reopen that would decide differently."""
from __future__ import annotations

import json

import pytest

from pipeline import LakeError, ReplayBuffer
from pipeline.lake import config as lake_config
from tests.support.lake import add_group


def test_a_new_lake_records_the_configuration_and_the_library_version(tmp_path):
    with ReplayBuffer.async_(lake=tmp_path / "lake", max_off_policy_threshold=3):
        pass
    rec = json.loads((tmp_path / "lake" / "_config.json").read_text())
    (entry,) = rec["versions"]
    assert entry["replaylake"] and entry["from_seq"] == 0
    cfg = lake_config.current(tmp_path / "lake")
    assert (cfg["preset"], cfg["max_off_policy_threshold"], cfg["max_off_policy_strategy"]) == \
        ("async", 3, "drop")
    assert cfg["rules"] == {"stale": {"threshold": 3, "tightest": 3}, "failure": {"evict_all": True}}


@pytest.mark.parametrize(("kw", "key"), [
    ({"max_off_policy_threshold": 4}, "max_off_policy_threshold"),
    ({"max_off_policy_strategy": "wait"}, "max_off_policy_strategy"),
    ({"filter_groups_metric": "acc", "refill_fn": print}, "filter_groups_metric"),
    ({"max_response_length": 9}, "rules"),
])
def test_a_reopen_with_other_decision_settings_is_refused_naming_them(tmp_path, kw, key):
    with ReplayBuffer.async_(lake=tmp_path / "lake", max_off_policy_threshold=3) as buf:
        add_group(buf, "a", 1)
    args = {"max_off_policy_threshold": 3, **kw}
    with pytest.raises(LakeError, match=key):
        ReplayBuffer.async_(lake=tmp_path / "lake", **args)
    with ReplayBuffer.async_(lake=tmp_path / "lake", max_off_policy_threshold=3) as buf:
        assert buf.counts("train")["finished"] == 1     # the refusal gave the lock back


def test_another_preset_is_refused_too(tmp_path):
    with ReplayBuffer.async_(lake=tmp_path / "lake"):
        pass
    with pytest.raises(LakeError, match="preset"):
        ReplayBuffer.sync(lake=tmp_path / "lake")


def test_an_allowed_change_is_recorded_with_the_seq_it_holds_from(tmp_path):
    with ReplayBuffer.async_(lake=tmp_path / "lake", max_off_policy_threshold=3) as buf:
        add_group(buf, "a", 1)
    with ReplayBuffer.async_(lake=tmp_path / "lake", max_off_policy_threshold=5,
                             allow_changes=("max_off_policy_threshold",)):
        pass
    versions = lake_config.read(tmp_path / "lake")["versions"]
    assert [v["config"]["max_off_policy_threshold"] for v in versions] == [3, 5]
    assert versions[1]["from_seq"] > 0
    assert lake_config.current(tmp_path / "lake")["max_off_policy_threshold"] == 5


def test_one_allowed_key_may_be_named_alone(tmp_path):
    """A bare string is that one key (not a tuple of its letters, refused as unknown keys)."""
    with ReplayBuffer.async_(lake=tmp_path / "lake", max_off_policy_threshold=3):
        pass
    with ReplayBuffer.async_(lake=tmp_path / "lake", max_off_policy_threshold=5,
                             allow_changes="max_off_policy_threshold"):
        pass
    assert lake_config.current(tmp_path / "lake")["max_off_policy_threshold"] == 5
    with pytest.raises(LakeError, match=r"unknown key\(s\) \['treshold'\]"):
        ReplayBuffer.async_(lake=tmp_path / "lake", allow_changes="treshold")


def test_refill_settings_may_change_freely(tmp_path):
    with ReplayBuffer.async_(lake=tmp_path / "lake", poll_interval=1.0):
        pass
    with ReplayBuffer.async_(lake=tmp_path / "lake", poll_interval=0.05, max_num_gen_batches=3):
        pass


def test_unknown_allowed_keys_are_an_error(tmp_path):
    with pytest.raises(LakeError, match="allow_changes"):
        ReplayBuffer.async_(lake=tmp_path / "lake", allow_changes=("treshold",))


MALFORMED = ["null", "[]", "{}", '{"versions": []}', '{"versions": [{"config": null}]}',
             '{"versions": [{"from_seq": 0, "config": {"rules": [1]}}]}', '"text"']


@pytest.fixture(scope="module")
def recorded_lake(tmp_path_factory):
    lake = tmp_path_factory.mktemp("config") / "lake"
    with ReplayBuffer.async_(lake=lake, max_off_policy_threshold=3) as buf:
        add_group(buf, "a", 1)
        buf.release(buf.sample(1, "train", 1))
    return lake


@pytest.mark.parametrize("text", MALFORMED)
def test_a_malformed_config_record_is_refused_naming_the_file_and_never_overwritten(
        recorded_lake, tmp_path, text):
    import shutil
    lake = tmp_path / "lake"
    shutil.copytree(recorded_lake, lake)
    (lake / "_config.json").write_text(text)
    for read in (lake_config.read, lake_config.current,
                 lambda p: ReplayBuffer.async_(lake=p, max_off_policy_threshold=3)):
        with pytest.raises(LakeError, match=rf"{lake / '_config.json'} is not a lake "
                                            r"configuration record: .*restore it from a backup"):
            read(lake)
    assert (lake / "_config.json").read_text() == text


@pytest.mark.parametrize("command", [["whatif", "--lake"], ["audit", "--lake"], ["report", "--no-progress"],
                                     ["sql", "-c", "select 1", "--lake"]])
@pytest.mark.parametrize("text", ["[]", '{"versions": []}'])
def test_commands_over_a_malformed_config_print_one_error_line(recorded_lake, tmp_path, command,
                                                               text):
    import shutil

    from typer.testing import CliRunner

    from jobs.cli import app
    lake = tmp_path / "lake"
    shutil.copytree(recorded_lake, lake)
    (lake / "_config.json").write_text(text)
    result = CliRunner().invoke(app, [*command, str(lake)] + (
        ["-o", str(tmp_path / "report.html")] if command[0] == "report" else []))
    lines = [line for line in result.output.splitlines() if line.strip()]
    if command[0] == "sql":               # reads no configuration: answers as before
        assert result.exit_code == 0, result.output
        return
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith(f"error: {lake / '_config.json'} is not a lake configuration")


def test_whatif_over_a_config_without_its_decision_settings_names_them(recorded_lake, tmp_path):
    import shutil

    from pipeline.analysis.whatif.rerun import recorded_settings
    lake = tmp_path / "lake"
    shutil.copytree(recorded_lake, lake)
    (lake / "_config.json").write_text('{"versions": [{"from_seq": 0, "config": {}}]}')
    with pytest.raises(LakeError, match="records no preset, max_off_policy_threshold, "
                                        "max_off_policy_strategy, filter_groups_metric"):
        recorded_settings(lake)


def _newer(recorded_lake, tmp_path, fmt: int = 3):
    """A copy of the recorded lake as a newer replaylake would have left it: its layout's format
    (and the version that wrote it) recorded in `_config.json`."""
    import shutil
    lake = tmp_path / "lake"
    shutil.copytree(recorded_lake, lake)
    rec = json.loads((lake / "_config.json").read_text())
    rec["format"] = fmt
    rec["versions"][-1]["replaylake"] = "9.9.0"
    (lake / "_config.json").write_text(json.dumps(rec))
    return lake


def test_a_lake_records_its_format_and_an_older_lake_gets_it_at_its_first_reopen(
        recorded_lake, tmp_path):
    import shutil

    from pipeline.lake.identity import LAKE_FORMAT
    assert json.loads((recorded_lake / "_config.json").read_text())["format"] == LAKE_FORMAT == 2
    lake = tmp_path / "lake"
    shutil.copytree(recorded_lake, lake)
    rec = json.loads((lake / "_config.json").read_text())
    del rec["format"]                     # as a lake written before 2026-12 records it
    (lake / "_config.json").write_text(json.dumps(rec))
    with ReplayBuffer.async_(lake=lake, max_off_policy_threshold=3) as buf:
        assert buf.held_batches("train") == {}       # restored: read as format 1
    after = json.loads((lake / "_config.json").read_text())
    assert after == {**rec, "format": 2}             # the same configurations, now format 2


def test_a_lake_of_a_newer_format_is_refused_by_every_reader_and_left_untouched(
        recorded_lake, tmp_path):
    from pipeline.lake import read_table
    from pipeline.lake.writer import LakeWriter
    lake = _newer(recorded_lake, tmp_path)
    before = {p: p.read_bytes() for p in lake.rglob("*") if p.is_file()}
    said = (rf"{lake} is written in lake format 3 \(by replaylake 9\.9\.0\), newer than this "
            r"replaylake reads \(format 2 at most\): read and write it with that replaylake or a "
            r"newer one")
    for open_it in (lambda: ReplayBuffer.async_(lake=lake, max_off_policy_threshold=3),
                    lambda: LakeWriter(lake),
                    lambda: read_table(lake, "decisions")):
        with pytest.raises(LakeError, match=said):
            open_it()
    assert {p: p.read_bytes() for p in lake.rglob("*") if p.is_file()} == before
    # no lock was left held: with the format this replaylake reads, the same lake opens
    _newer(recorded_lake, tmp_path / "again", fmt=2)
    with ReplayBuffer.async_(lake=tmp_path / "again" / "lake", max_off_policy_threshold=3):
        pass


@pytest.mark.parametrize("command", [["whatif", "--lake"], ["audit", "--lake"], ["report"],
                                     ["sql", "-c", "select count(*) from decisions", "--lake"],
                                     ["export", "--lake"], ["compact"], ["lake", "check"],
                                     ["lake", "salvage"], ["retain"]])
def test_commands_over_a_lake_of_a_newer_format_print_one_error_line(recorded_lake, tmp_path,
                                                                     command):
    from typer.testing import CliRunner

    from jobs.cli import app
    lake = _newer(recorded_lake, tmp_path)
    extra = {"report": ["--no-progress", "-o", str(tmp_path / "r.html")],
             "export": ["--out", str(tmp_path / "out")],
             "retain": ["--older-than", "1"]}.get(command[0], [])
    result = CliRunner().invoke(app, [*command, str(lake), *extra])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith(f"error: {lake} is written in lake format 3"), lines
