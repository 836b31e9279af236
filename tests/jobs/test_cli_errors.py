"""What the operating system refuses (an unreadable file, a read-only directory, a full disk or a
file-size limit) is one `error:` line and exit 2 in every command, never a traceback; a file this
user may not read is never taken for damage; a benchmark's --out may name a directory. Every
refusal is real (mode bits, RLIMIT_FSIZE, /dev/full: see tests/support/os_refusals.py)."""
from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from pipeline.lake.compaction import compact
from tests.support.lake import lake_counts, small_trained_lake
from tests.support.os_refusals import (
    bound_by_permissions,
    file_size_limit,
    one_error_line,
    replaylake,
)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small lake: 3 groups of 2 trajectories, 2 of them trained and released."""
    return small_trained_lake(tmp_path_factory.mktemp("source") / "lake")


@pytest.fixture
def lake(source: Path, tmp_path: Path):
    """A copy of the source lake; every permission given back afterwards (for the clean-up)."""
    copy = tmp_path / "lake"
    shutil.copytree(source, copy)
    yield copy
    for p in [tmp_path, *tmp_path.rglob("*")]:
        if not p.is_symlink():
            p.chmod(p.stat().st_mode | stat.S_IRWXU)


def _trajectory_file(lake: Path, suffix: str) -> Path:
    (path,) = (lake / "trajectories").rglob(f"*{suffix}")
    return path


@pytest.mark.parametrize("args", [
    ["lake", "check", "--lake", "{lake}"],
    ["sql", "--lake", "{lake}", "select count(*) from trajectories"],
    ["export", "--lake", "{lake}", "--out", "{tmp}/export", "--no-progress"],
    ["audit", "--lake", "{lake}"],
], ids=lambda a: " ".join(a[:2]))
def test_an_unreadable_segment_is_one_error_line_naming_it(lake, tmp_path, args) -> None:
    segment = _trajectory_file(lake, ".arrow")
    segment.chmod(0)
    proc = replaylake(*(a.format(lake=lake, tmp=tmp_path) for a in args),
                      preexec=bound_by_permissions())
    assert one_error_line(proc) == (f"error: permission denied: {segment}; change its "
                                    "permissions, or run as a user who may")


def test_an_unreadable_compacted_file_is_not_damage_and_salvage_keeps_it(lake) -> None:
    compact(lake)
    parquet = _trajectory_file(lake, ".parquet")
    before = lake_counts(lake)
    parquet.chmod(0)
    for command in ("check", "salvage"):     # "damage" before: exit 1, then quarantined
        proc = replaylake("lake", command, "--lake", str(lake), preexec=bound_by_permissions())
        line = one_error_line(proc)
        assert line.startswith("error: permission denied (Failed to open local file "
                               f"'{parquet}')"), line
    assert not (lake / "_quarantine").exists()
    parquet.chmod(0o644)
    assert lake_counts(lake) == before


def test_compact_on_a_read_only_lake_is_one_error_line_and_changes_nothing(lake) -> None:
    files = sorted(lake.rglob("*"))
    for d in [lake, *(p for p in files if p.is_dir())]:
        d.chmod(0o555)
    proc = replaylake("compact", "--lake", str(lake), "--no-progress",
                      preexec=bound_by_permissions())
    assert one_error_line(proc).startswith("error: permission denied: ")
    assert sorted(lake.rglob("*")) == files


@pytest.mark.parametrize("args", [
    ["report", "{lake}", "-o", "{out}/report.html", "--no-progress"],
    ["export", "--lake", "{lake}", "--out", "{out}/export", "--no-progress"],
    ["sql", "--lake", "{lake}", "select 1", "--format", "csv", "--output", "{out}/one.csv"],
], ids=lambda a: a[0])
def test_a_read_only_output_directory_is_one_error_line(lake, tmp_path, args) -> None:
    out = tmp_path / "out"
    out.mkdir(mode=0o555)
    proc = replaylake(*(a.format(lake=lake, out=out) for a in args),
                      preexec=bound_by_permissions())
    line = one_error_line(proc)
    assert line.startswith(f"error: permission denied: {out}/"), line
    assert list(out.iterdir()) == []


def test_compact_past_a_file_size_limit_is_one_error_line_and_the_lake_reads_the_same(
        lake) -> None:
    before = lake_counts(lake)
    proc = replaylake("compact", "--lake", str(lake), "--no-progress",
                      preexec=file_size_limit(1024))     # every Parquet file is larger
    assert one_error_line(proc) == (
        "error: file too large; the file would pass the file-size limit: raise it (ulimit -f) "
        "or write somewhere else")
    assert not list(lake.rglob("*.tmp"))
    assert lake_counts(lake) == before
    check = replaylake("lake", "check", "--lake", str(lake))
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="/dev/full is Linux's")
def test_a_full_disk_under_sql_output_is_one_error_line(lake) -> None:
    proc = replaylake("sql", "--lake", str(lake), "select * from trajectories", "--format",
                      "csv", "--output", "/dev/full")
    assert one_error_line(proc).startswith("error: no space left on device")


def test_bench_out_may_name_a_directory_and_a_bad_one_fails_before_measuring(tmp_path) -> None:
    proc = replaylake("dev", "bench", "all", "--quick", "--only", "decide", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "all.json").is_file() and (tmp_path / "all.md").is_file()
    (tmp_path / "a-file").write_text("")
    proc = replaylake("dev", "bench", "decide", "--sizes", "400", "--repeats", "1", "--out",
                      str(tmp_path / "a-file" / "decide.json"))
    assert one_error_line(proc) == f"error: file exists: {tmp_path / 'a-file'}"
    assert "ms" not in proc.stdout                     # nothing was measured


def test_bench_all_refuses_an_unknown_section_before_running_or_writing_anything(tmp_path):
    proc = replaylake("dev", "bench", "all", "--quick", "--only", "decide,nope", "--out",
                      str(tmp_path / "out"))
    assert one_error_line(proc) == ("error: --only decide,nope: no section nope; the sections "
                                    "are ingest, decide, to_torch, verl, memory, ray")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["_log", "window"])
def test_a_directory_this_user_may_not_list_is_an_error_not_an_empty_one(lake, where) -> None:
    # pathlib's glob skips such a directory: an unreadable _log/ read as a lake without commit
    # records (every multi-partition call dropped), an unreadable window as one without files
    d = lake / "_log" if where == "_log" else _trajectory_file(lake, ".arrow").parent
    d.chmod(0)
    for args in (["sql", "--lake", str(lake), "select count(*) from trajectories"],
                 ["lake", "check", "--lake", str(lake)]):
        proc = replaylake(*args, preexec=bound_by_permissions())
        assert one_error_line(proc).startswith(f"error: permission denied: {d}"), proc.stderr


# Every command over a read-only lake: a reader answers, a writer refuses in one line and changes
# nothing (a lake on a read-only mount, or one owned by another user).
READ_ONLY_LAKE = {
    "audit": (0, ["audit", "--lake", "{lake}"]),
    "lake check": (0, ["lake", "check", "--lake", "{lake}"]),
    "sql": (0, ["sql", "--lake", "{lake}", "select count(*) from trajectories"]),
    "report": (0, ["report", "{lake}", "-o", "{tmp}/report.html", "--no-progress"]),
    "export": (0, ["export", "--lake", "{lake}", "--out", "{tmp}/export", "--no-progress"]),
    "whatif": (0, ["whatif", "--lake", "{lake}"]),
    "compact": (2, ["compact", "--lake", "{lake}", "--no-progress"]),
    "retain": (2, ["retain", "--lake", "{lake}", "--older-than", "0", "--no-progress"]),
    "lake salvage": (2, ["lake", "salvage", "--lake", "{lake}"]),
}


@pytest.mark.parametrize("name", sorted(READ_ONLY_LAKE))
def test_every_command_over_a_read_only_lake_answers_or_refuses_in_one_line(name, lake,
                                                                            tmp_path) -> None:
    code, args = READ_ONLY_LAKE[name]
    files = {p: p.stat().st_mtime_ns for p in lake.rglob("*")}
    for p in [lake, *files]:
        p.chmod(0o555 if p.is_dir() else 0o444)
    out = tmp_path / "out"
    out.mkdir()
    proc = replaylake(*(a.format(lake=lake, tmp=out) for a in args),
                      preexec=bound_by_permissions())
    if code == 0:
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr and proc.stdout.strip()
    else:
        line = one_error_line(proc)
        assert line.startswith("error: "), line
    assert {p: p.stat().st_mtime_ns for p in lake.rglob("*")} == files
