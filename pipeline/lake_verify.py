"""Verifying a stream against its checksum file, one write at a time.

Why one write at a time: a live segment can be hundreds of MB of token payload, and every reader
(restore, `lake check`, an analysis connection, compaction) must check every acknowledged byte
before trusting it. Reading the whole segment to check it made a metadata query's memory grow
with the segment's size. Here each acknowledged write is read, checked against its own CRC and
only then handed on (to the Arrow stream reader, or dropped), so what is held at any moment is one
write: one call's rows of one partition, whatever the size of the segment or the lake.

The rules are those of `lake_files`: bytes past the last checksum record are a torn tail (ignored);
a damaged record, a stream shorter than its acknowledged length, a write whose CRC does not match,
acknowledged bytes that do not parse as Arrow, or a stream without its checksum file are damage
(`LakeDamageError`, naming the file and the first byte of the write at fault). A consumer that
iterates `batches` may have seen earlier batches before damage further on is raised: every caller
lets the error end what it was doing, so nothing read from a damaged stream is ever kept.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from pipeline.errors import LakeDamageError
from pipeline.lake_files import RECORD_SIZE, Record, sum_path, unpack_records

_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"     # the Arrow end-of-stream marker


@dataclass
class Verified:
    """What the checksum file says of one stream, every acknowledged byte of it checked."""

    path: Path
    size: int = 0                                    # acknowledged bytes
    ends: list[int] = field(default_factory=list)    # where each acknowledged write ends
    torn: int = 0                                    # bytes past the last record (ignored)
    closed: bool = False                             # ends with the end-of-stream marker


def _records(path: Path) -> list[Record] | None:
    """The record of every acknowledged write; None when neither the stream nor anything
    acknowledged of it exists (a crash between creating the checksum file and the stream)."""
    sums = sum_path(path)
    try:
        raw = sums.read_bytes()
    except FileNotFoundError:
        if not path.exists():
            raise LakeDamageError(path, 0, "the file is missing") from None
        raise LakeDamageError(path, 0, f"its checksum file {sums.name} is missing") from None
    out: list[Record] = []
    for i, rec in enumerate(unpack_records(raw)):
        if rec is None or (out and rec.end <= out[-1].end):
            raise LakeDamageError(sums, i * RECORD_SIZE, "a checksum record is damaged")
        out.append(rec)
    return out


class _Writes:
    """The acknowledged bytes of a stream as a read-only file, checked write by write: a write's
    bytes are handed out only after its CRC matched. Holds one write in memory."""

    def __init__(self, path: Path):
        self.path = path
        self.records = _records(path)
        self.end = self.records[-1].end if self.records else 0
        self.file = None
        self.file_size = 0
        self.next = 0              # the next write to load
        self.start = 0             # where the loaded write starts in the stream
        self.buf = b""             # the loaded write
        self.pos = 0               # read position in the stream
        self.last = b""            # the last write loaded (for the end-of-stream marker)
        try:
            self.file = open(path, "rb", buffering=0)
        except FileNotFoundError:
            if self.end:
                raise LakeDamageError(path, 0, f"the file is missing, but {self.end} "
                                      "acknowledged bytes were recorded for it") from None
            return
        self.file_size = os.fstat(self.file.fileno()).st_size
        if self.file_size < self.end:
            self.close()
            raise LakeDamageError(path, self.file_size, f"the file ends at byte {self.file_size}, "
                                  f"but {self.end} bytes of it were acknowledged")

    closed = False

    def load(self) -> bool:
        """Read and check the next write; False at the end of the acknowledged bytes."""
        if self.file is None or self.next >= len(self.records):
            return False
        start = self.records[self.next - 1].end if self.next else 0
        rec = self.records[self.next]
        stop = rec.end
        data = self._read(stop - start)
        if len(data) < stop - start or not rec.matches(data):
            raise LakeDamageError(self.path, start, f"checksum mismatch in bytes {start}..{stop}")
        self.start, self.buf, self.last = start, data, data
        self.next += 1
        return True

    def _read(self, n: int) -> bytes:
        parts, left = [], n
        while left:
            chunk = self.file.read(left)
            if not chunk:
                break
            parts.append(chunk)
            left -= len(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def read(self, n: int = -1) -> bytes:
        out: list[bytes] = []
        want = self.end - self.pos if n is None or n < 0 else min(n, self.end - self.pos)
        while want > 0:
            at = self.pos - self.start
            if at >= len(self.buf):
                if not self.load():
                    break
                continue
            piece = self.buf[at:at + want]
            out.append(piece)
            self.pos += len(piece)
            want -= len(piece)
        return b"".join(out)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self.pos

    def write_start(self) -> int:
        """The first byte of the write being parsed (the offset damage is reported at)."""
        return self.start

    def close(self) -> None:
        self.closed = True
        if self.file is not None:
            self.file.close()

    def verified(self) -> Verified:
        return Verified(self.path, self.end, [r.end for r in self.records],
                        max(self.file_size - self.end, 0),
                        self.end >= len(_EOS) and self.last.endswith(_EOS))


def verify(path: Path) -> Verified:
    """Check every acknowledged byte of ``path`` against its checksum file, one write at a time;
    raises LakeDamageError."""
    w = _Writes(path)
    try:
        while w.load():
            pass
        return w.verified()
    finally:
        w.close()


def batches(path: Path) -> Iterator[tuple[pa.RecordBatch, dict | None]]:
    """(batch, custom metadata) of every acknowledged record batch of a stream, each write
    checked before Arrow parses it."""
    w = _Writes(path)
    try:
        if w.end == 0:
            return
        try:
            reader = pa.ipc.open_stream(w)
            while True:
                try:
                    item = reader.read_next_batch_with_custom_metadata()
                except StopIteration:
                    return
                yield item
        except pa.ArrowInvalid as exc:
            raise LakeDamageError(path, w.write_start(),
                                  f"verified bytes do not parse as Arrow ({exc})") from exc
    finally:
        w.close()


__all__ = ["Verified", "verify", "batches"]
