"""A path that is not a lake is refused by every command and API entry that reads one, naming what
it expected and the lake nearby; a writer never puts its files among someone else's; and a lake a
buffer opened but never wrote to is a lake."""
from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from jobs.cli import app
from pipeline import LakeError, ReplayBuffer
from pipeline.analysis.views import connect, read_lake
from pipeline.errors import LakeDamageError
from pipeline.lake.compaction import compact
from pipeline.lake.retention import retain
from tests.support.lake import add_group

# every command that reads a lake, with {lake} and {tmp} to fill in
READERS = {
    "audit": ["audit", "--lake", "{lake}"],
    "lake check": ["lake", "check", "--lake", "{lake}"],
    "lake salvage": ["lake", "salvage", "--lake", "{lake}"],
    "sql": ["sql", "--lake", "{lake}", "select count(*) from trajectories"],
    "sql shell": ["sql", "--lake", "{lake}"],
    "report": ["report", "{lake}", "-o", "{tmp}/report.html", "--no-progress"],
    "export": ["export", "--lake", "{lake}", "--out", "{tmp}/export", "--no-progress"],
    "whatif": ["whatif", "--lake", "{lake}"],
    "compact": ["compact", "--lake", "{lake}", "--no-progress"],
    "retain": ["retain", "--lake", "{lake}", "--older-than", "1", "--no-progress"],
}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory as `replaylake demo` leaves one: its files, and the lake in `lake/`."""
    run = tmp_path_factory.mktemp("runs") / "latest"
    with ReplayBuffer.sync(lake=run / "lake", poll_interval=0.01) as buf:
        add_group(buf, "g0", 1)
        buf.release(buf.sample(1, "train", 1))
    (run / "config.json").write_text("{}\n")
    (run / "summary.json").write_text("{}\n")
    return run


def _files(root: Path) -> set[Path]:
    return {p.relative_to(root) for p in root.rglob("*")}


def _invoke(command: str, lake: Path, tmp: Path) -> tuple[int, list[str]]:
    args = [a.format(lake=lake, tmp=tmp) for a in READERS[command]]
    result = CliRunner().invoke(app, args, input="")
    return result.exit_code, [line for line in result.output.splitlines() if line.strip()]


@pytest.mark.parametrize("command", READERS)
def test_a_run_directory_is_not_a_lake_and_the_error_points_at_its_lake(command, run_dir,
                                                                        tmp_path) -> None:
    before = _files(run_dir)
    code, lines = _invoke(command, run_dir, tmp_path)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0] == (f"error: {run_dir} is not a replaylake lake: no _config.json, "
                        "_writer.lock, _log/ or table directory (trajectories/, group_events/, "
                        f"decisions/, metrics/); did you mean {run_dir / 'lake'}?")
    assert _files(run_dir) == before            # no lock file, report or export left behind
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("command", READERS)
def test_a_missing_path_is_refused_in_one_line_suggesting_the_lake_of_a_typo(command, run_dir,
                                                                             tmp_path) -> None:
    code, lines = _invoke(command, run_dir / "lak", tmp_path)
    assert (code, lines) == (2, [f"error: no lake at {run_dir / 'lak'}: no such directory; "
                                 f"did you mean {run_dir / 'lake'}?"])
    assert not (run_dir / "lak").exists()


@pytest.mark.parametrize("command", READERS)
def test_a_file_instead_of_a_directory_is_refused_in_one_line(command, run_dir, tmp_path) -> None:
    code, lines = _invoke(command, run_dir / "config.json", tmp_path)
    assert (code, lines) == (2, [f"error: {run_dir / 'config.json'} is a file, not a lake "
                                 "directory"])


def test_a_table_directory_named_instead_of_its_lake_points_at_the_lake(run_dir,
                                                                        tmp_path) -> None:
    code, lines = _invoke("audit", run_dir / "lake" / "trajectories", tmp_path)
    assert code == 2 and lines[0].endswith(f"did you mean {run_dir / 'lake'}?")


def test_an_empty_directory_is_not_a_lake(tmp_path) -> None:
    (tmp_path / "empty").mkdir()
    code, lines = _invoke("lake check", tmp_path / "empty", tmp_path / "empty")
    assert (code, lines) == (2, [f"error: {tmp_path / 'empty'} is not a replaylake lake: an "
                                 "empty directory"])


def test_a_lake_a_buffer_opened_but_never_wrote_to_is_a_lake(tmp_path) -> None:
    ReplayBuffer.sync(lake=tmp_path / "new").close()
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == ["_config.json",
                                                                    "_writer.lock"]
    assert _invoke("audit", tmp_path / "new", tmp_path)[0] == 0
    assert _invoke("lake check", tmp_path / "new", tmp_path)[0] == 0
    assert connect(tmp_path / "new").sql("select count(*) from groups").fetchall() == [(0,)]


def test_a_lake_copied_without_its_underscore_files_is_a_damaged_lake_not_a_stranger(
        run_dir, tmp_path) -> None:
    """Its table directories make it a lake; its missing writer log makes it damaged (the log
    is what tells an uncommitted call and a missing segment), named as such."""
    import shutil
    shutil.copytree(run_dir / "lake", tmp_path / "copy",
                    ignore=shutil.ignore_patterns("_*"))     # a sync tool skipping "hidden" files
    with pytest.raises(LakeDamageError, match=r"writer's log .* is missing.*copy the lake's _log"):
        connect(tmp_path / "copy")


def test_the_python_readers_refuse_a_directory_that_is_not_a_lake(run_dir) -> None:
    before = _files(run_dir)
    for read in (connect, read_lake, compact, lambda p: retain(p, 1)):
        with pytest.raises(LakeError, match="is not a replaylake lake.*did you mean"):
            read(run_dir)
    assert _files(run_dir) == before            # compact used to leave _compact.lock here


def test_a_buffer_refuses_a_directory_of_other_files_and_writes_nothing_there(tmp_path) -> None:
    (tmp_path / "notes.txt").write_text("mine\n")
    with pytest.raises(LakeError, match=rf"{tmp_path} holds files but is not a replaylake lake"):
        ReplayBuffer.sync(lake=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_a_buffer_makes_a_lake_in_a_new_or_empty_directory_and_reopens_it(tmp_path) -> None:
    (tmp_path / "empty").mkdir()
    for where in (tmp_path / "empty", tmp_path / "new" / "lake"):
        with ReplayBuffer.sync(lake=where) as buf:
            add_group(buf, "g0", 1)
        with ReplayBuffer.sync(lake=where) as buf:
            assert buf.counts("train")["finished"] == 1
