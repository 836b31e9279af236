"""The power-loss model itself, on tiny literal strace logs: what a disk may hold after the power
goes (see tests/support/disk_model.py), and how the strace log is read and followed."""
from __future__ import annotations

import os

import pytest

from tests.support.disk_calls import Replay
from tests.support.disk_model import Disk
from tests.support.syscall_trace import parse


def hx(text: str | bytes) -> str:
    raw = text.encode() if isinstance(text, str) else text
    return "".join(f"\\x{b:02x}" for b in raw)


class Log:
    """Builds strace lines (as `strace -f -y -xx -o` writes them) for paths under a root."""

    def __init__(self, root) -> None:
        self.root = os.path.realpath(root)

    def fd(self, n: int, name: str = "") -> str:
        return f"{n}<{hx(os.path.join(self.root, name) if name else self.root)}>"

    def open(self, n: int, name: str, flags: str) -> str:
        path = os.path.join(self.root, name) if name else self.root
        return f'1  openat(AT_FDCWD<{hx("/")}>, "{hx(path)}", {flags}, 0666) = {self.fd(n, name)}'

    def write(self, n: int, name: str, data: str) -> str:
        return f'1  write({self.fd(n, name)}, "{hx(data)}", {len(data)}) = {len(data)}'

    def fsync(self, n: int, name: str = "") -> str:
        return f"1  fsync({self.fd(n, name)}) = 0"

    def rename(self, old: str, new: str) -> str:
        a, b = (hx(os.path.join(self.root, x)) for x in (old, new))
        return f'1  rename("{a}", "{b}") = 0'


def disks_after(root, before: dict, lines: list[str]) -> list[dict]:
    replay = Replay(Disk(root, before), root)
    for call in parse("\n".join(lines)):
        replay.apply(call)
    return sorted((img for _, img in replay.disk.crash_images()), key=lambda i: sorted(i.items()))


def test_an_fsynced_new_file_may_vanish_until_its_directory_is_fsynced(tmp_path):
    log = Log(tmp_path)
    lines = [log.open(3, "a", "O_WRONLY|O_CREAT|O_EXCL|O_CLOEXEC"), log.write(3, "a", "abcd"),
             log.fsync(3, "a")]
    assert disks_after(tmp_path, {}, lines) == [{}, {"a": b"abcd"}]
    lines += [log.open(4, "", "O_RDONLY|O_CLOEXEC|O_DIRECTORY"), log.fsync(4)]
    assert disks_after(tmp_path, {}, lines) == [{"a": b"abcd"}]


def test_writes_since_the_last_fsync_survive_as_a_prefix_in_order_the_last_one_maybe_torn(
        tmp_path):
    log = Log(tmp_path)
    lines = [log.open(3, "a", "O_WRONLY|O_APPEND"), log.write(3, "a", "ab"),
             log.write(3, "a", "cdef")]
    found = [img["a"] for img in disks_after(tmp_path, {"a": b"0"}, lines)]
    assert found == [b"0", b"0ab", b"0abcd", b"0abcdef"]      # never b"0cdef": in order


def test_a_rename_is_atomic_and_durable_only_once_its_directory_is_fsynced(tmp_path):
    log = Log(tmp_path)
    lines = [log.open(3, "x.tmp", "O_WRONLY|O_CREAT|O_TRUNC"), log.write(3, "x.tmp", "new"),
             log.fsync(3, "x.tmp"), log.rename("x.tmp", "x")]
    assert disks_after(tmp_path, {"x": b"old"}, lines) == [
        {"x": b"new"}, {"x": b"old"}, {"x": b"old", "x.tmp": b"new"}]
    lines += [log.open(4, "", "O_RDONLY|O_DIRECTORY"), log.fsync(4)]
    assert disks_after(tmp_path, {"x": b"old"}, lines) == [{"x": b"new"}]


def test_the_parser_joins_a_call_that_another_thread_interrupted(tmp_path):
    log = Log(tmp_path)
    head, tail = log.write(3, "a", "abcd").rsplit(") = ", 1)
    text = "\n".join([
        "[pid 7] " + head.removeprefix("1  ") + " <unfinished ...>",
        "8  " + log.fsync(4, "b").removeprefix("1  "),
        f"7  <... write resumed>)       = {tail}",
        "8  +++ exited with 0 +++",
    ])
    calls = parse(text)
    assert [(c.tid, c.name) for c in calls] == [(8, "fsync"), (7, "write")]
    assert calls[1].args[1] == b"abcd" and calls[1].ret == 4


def test_a_write_cut_short_by_the_strace_string_limit_is_refused(tmp_path):
    log = Log(tmp_path)
    with pytest.raises(ValueError, match="cut short"):
        parse(log.write(3, "a", "abcd").replace('", 4)', '"..., 4)'))
