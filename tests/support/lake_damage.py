"""Test helpers that damage a lake the way a crash (or a bad disk) would, on real files.

A crash in the middle of a write leaves the stream torn past its last checksum record and no
record for that write, so `tear_last_write` cuts both; the other helpers do what no crash can
(flip bytes in the middle, delete a file) so the reader's refusal can be tested.
"""
from __future__ import annotations

import os
from pathlib import Path

from pipeline.lake.files import RECORD_SIZE, sum_path, unpack_records


def write_ends(path: Path) -> list[int]:
    """Where each acknowledged write of a stream ends (from its checksum file)."""
    return [r[0] for r in unpack_records(sum_path(path).read_bytes()) if r is not None]


def tear_last_write(path: Path, cut: int | None = None) -> None:
    """As if the process died while writing the stream's last write: its checksum record was
    never written and only ``cut`` bytes short of it reached the file (None: half of it)."""
    ends = write_ends(path)
    start = ends[-2] if len(ends) > 1 else 0
    length = ends[-1] - start
    cut = length // 2 if cut is None else cut
    if not 0 < cut <= length:
        raise ValueError(f"cut {cut} must be within the last write ({length} bytes)")
    os.truncate(path, ends[-1] - cut)
    os.truncate(sum_path(path), (len(ends) - 1) * RECORD_SIZE)


def tear_all(path: Path, keep: int) -> None:
    """As if the process died during the stream's very first write, ``keep`` bytes in."""
    os.truncate(path, keep)
    os.truncate(sum_path(path), 0)


def zero_bytes(path: Path, offset: int, n: int = 16) -> None:
    """Overwrite ``n`` bytes at ``offset`` with zeros (a bad sector, a stray write)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(b"\0" * n)


def flip_bytes(path: Path, offset: int, n: int = 8) -> None:
    """Invert ``n`` bytes at ``offset``: unlike zeroing, always a change, whatever was there."""
    with open(path, "r+b") as f:
        f.seek(offset)
        old = f.read(n)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in old))


def cut_records(path: Path, drop: int | None = None) -> None:
    """Cut a stream's checksum file short by ``drop`` records (None: to nothing), its stream left
    whole: what a copy or a disk that lost the file's end leaves, never a crash."""
    n = len(unpack_records(sum_path(path).read_bytes()))
    os.truncate(sum_path(path), 0 if drop is None else (n - drop) * RECORD_SIZE)
