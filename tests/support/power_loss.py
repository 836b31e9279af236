"""Power losses replayed from a recorded run: when to cut the power, and what each cut leaves.

`trace` runs one of `power_loss_runs`' programs under strace and checks the disk model against
the run: every call replayed must leave exactly the files the run left, byte for byte, or the
model (or the parser) is wrong and nothing it simulates could be trusted.

`crashes` then cuts the power at moments of the run: just before and just after each fsync of a
file under the root, just before each rename and unlink there, just after each acknowledged call
and at the end of the run, and
yields every distinct disk (see `disk_model.Disk.crash_images`) each cut could leave, with the
call that was in flight and how many calls had been acknowledged (marked) before it. Each call
kind gets ``per_kind`` moments of each kind (before an fsync of a file, after one, the same for a
directory, before a rename, ...),
spread evenly over its own; ``per_kind=None``: every moment.
"""
from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.disk_calls import ACK, MARKER_FILE, SYNCS, Replay
from tests.support.disk_model import Disk, Image, digest, on_disk
from tests.support.lake import ROOT, python_env
from tests.support.syscall_trace import Call, Fd, record

CUTS = ("rename", "renameat", "renameat2", "unlink", "unlinkat", "rmdir")


@dataclass(frozen=True)
class Traced:
    """A recorded run: the root's files before it, its calls, and the calls it acknowledged."""

    root: Path
    before: Image = field(repr=False)
    calls: list[Call] = field(repr=False)
    acks: list[str]


@dataclass(frozen=True)
class Crash:
    """One disk a power loss leaves: ``op`` was in flight, ``acked`` calls were acknowledged."""

    op: str
    acked: int
    how: str
    image: Image = field(repr=False)


def trace(job: list[str], root: Path, trace_file: Path, timeout: float = 300) -> Traced:
    """Record ``python -m tests.support.power_loss_runs JOB...`` changing ``root``."""
    before = on_disk(root)
    calls = record([sys.executable, "-m", "tests.support.power_loss_runs", *job], trace_file,
                   cwd=ROOT, env=python_env(), timeout=timeout)
    replay = Replay(Disk(root, before), ROOT)
    for call in calls:
        replay.apply(call)
    replayed, real = replay.disk.image(), on_disk(root)
    wrong = sorted(p for p in set(replayed) | set(real) if replayed.get(p, 0) != real.get(p, 0))
    if wrong:
        raise AssertionError(f"the disk model replays the run to other files than it left: "
                             f"{wrong[:5]}")
    return Traced(root, before, calls, replay.acks)


def _is_ack(call: Call) -> bool:
    return (call.name == "write" and isinstance(call.args[0], Fd)
            and call.args[0].path == MARKER_FILE and call.args[1].startswith(ACK))


def moments(traced: Traced, tail: str) -> list[tuple[int, str, str]]:
    """(calls applied, the call in flight, what the next or last call was) for every moment of
    interest, in order; ``tail`` names what runs after the last acknowledged call."""
    root = str(traced.root)

    def under(arg: object) -> bool:
        path = arg.path if isinstance(arg, Fd) else arg.decode() if isinstance(arg, bytes) else ""
        return path.startswith(root + "/")

    points: dict[int, str] = {}
    dirs: set[int] = set()        # descriptors open on a directory
    for i, call in enumerate(traced.calls):
        if call.name == "openat" and isinstance(call.ret, Fd):
            (dirs.add if "O_DIRECTORY" in str(call.args[2]) else dirs.discard)(call.ret.num)
        if call.name in SYNCS and under(call.args[0]):
            what = "a directory" if call.args[0].num in dirs else "a file"
            points.setdefault(i, f"before an fsync of {what}")
            points.setdefault(i + 1, f"after an fsync of {what}")
        elif call.name in CUTS and any(under(a) for a in call.args):
            points.setdefault(i, "before a rename" if "rename" in call.name else "before an unlink")
        elif _is_ack(call):
            points.setdefault(i + 1, "after an acknowledged call")
    points.setdefault(len(traced.calls), "at the end")
    acks = iter(traced.acks)
    label = next(acks, tail)
    labels = []
    for call in traced.calls:
        labels.append(label)
        if _is_ack(call):
            label = next(acks, tail)
    labels.append(label)
    return [(p, labels[p], kind) for p, kind in sorted(points.items())]


def spread(items: list, k: int | None) -> list:
    """``k`` items spread evenly over ``items`` (one: the middle one; two or more: the first and
    the last among them)."""
    if k is None or len(items) <= k:
        return list(items)
    if k == 1:
        return [items[len(items) // 2]]
    return [items[round(j * (len(items) - 1) / (k - 1))] for j in range(k)]


def crashes(traced: Traced, per_kind: int | None, tail: str) -> Iterator[Crash]:
    """Every distinct disk a power loss at the chosen moments leaves (module doc)."""
    groups: dict[tuple[str, str], list[int]] = {}
    for point, op, kind in moments(traced, tail):
        groups.setdefault((op, kind), []).append(point)
    chosen = {p: op for (op, _), points in groups.items() for p in spread(points, per_kind)}
    replay = Replay(Disk(traced.root, traced.before), ROOT)
    seen: set[tuple[str, int]] = set()
    for i in range(len(traced.calls) + 1):
        if i in chosen:
            for how, image in replay.disk.crash_images():
                key = (digest(image), len(replay.acks))
                if key not in seen:
                    seen.add(key)
                    yield Crash(chosen[i], len(replay.acks), how, image)
        if i < len(traced.calls):
            replay.apply(traced.calls[i])
