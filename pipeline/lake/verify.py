"""Verifying a stream against its checksum file, one write at a time.

Why one write at a time: a open segment can be hundreds of MB of token payload, and every reader
(restore, `lake check`, an analysis connection, compaction) must check every acknowledged byte
before trusting it. Reading the whole segment to check it made a metadata query's memory grow
with the segment's size. Here each acknowledged write is read, checked against its own CRC and
only then handed on (to the Arrow stream reader, or dropped), so what is held at any moment is one
write: one call's rows of one partition, whatever the size of the segment or the lake.

The rules are those of `lake.files`: bytes past the last checksum record are a torn tail (ignored)
when they are at most one write, as a crash leaves them; a damaged record, a stream shorter than
its acknowledged length, a write whose CRC does not match, acknowledged bytes that do not parse as
Arrow, a stream without its checksum file, and unrecorded bytes that hold more than one write or
follow the end-of-stream marker (a checksum file that lost records: see `lake.frames`) are damage
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
from pipeline.lake.files import RECORD_SIZE, Record, sum_path, unpack_records
from pipeline.lake.frames import EOS, frames


@dataclass
class Verified:
    """What the checksum file says of one stream, every acknowledged byte of it checked."""

    path: Path
    size: int = 0                                    # acknowledged bytes
    ends: list[int] = field(default_factory=list)    # where each acknowledged write ends
    torn: int = 0                                    # bytes past the last record (ignored)
    closed: bool = False                             # its last write is the end-of-stream marker


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
        try:
            self.file = open(path, "rb", buffering=0)
        except FileNotFoundError:
            if self.end:
                raise LakeDamageError(path, 0, f"the file is missing, but {self.end} "
                                      "acknowledged bytes were recorded for it") from None
            return
        self.file_size = os.fstat(self.file.fileno()).st_size
        try:
            if self.file_size < self.end:
                raise LakeDamageError(path, self.file_size, f"the file ends at byte "
                                      f"{self.file_size}, but {self.end} bytes of it were "
                                      "acknowledged")
            self.ends_closed = self._ends_closed()
            self._check_tail()
        except LakeDamageError:
            self.close()
            raise

    closed = False
    ends_closed = False

    def _ends_closed(self) -> bool:
        """Whether the last acknowledged write is the end-of-stream marker (the stream was
        finished: nothing may follow it)."""
        if not self.records:
            return False
        start = self.records[-2].end if len(self.records) > 1 else 0
        f = frames(self.file.fileno(), start, self.end)
        return f.end == self.end and f.kinds[-1:] == (EOS,)

    def _check_tail(self) -> None:
        """Bytes past the last record must be at most one write: the writer records each write
        before it starts the next, so a crash leaves no more. More is a checksum file that lost
        records (cut short, say), and reading it as a torn tail would drop acknowledged writes."""
        size = self.file_size
        if size == self.end:
            return
        if self.ends_closed:
            raise LakeDamageError(self.path, self.end, f"{size - self.end} byte(s) follow the "
                                  "end-of-stream marker, after which nothing is ever written")
        if _one_write_at_most(self.file.fileno(), self.end, size):
            return
        # a live writer may have recorded writes since the checksum file was read: what is past
        # the records now is at most the one write in flight, unless records are missing
        again = _records(self.path)
        end = again[-1].end if again else 0
        if end >= size or _one_write_at_most(self.file.fileno(), end, size):
            return
        found = frames(self.file.fileno(), end, size)
        raise LakeDamageError(self.path, end, (
            f"the {size - end} byte(s) past its last checksum record hold {found.writes()} whole "
            "write(s), but a crash leaves at most one unacknowledged write: its checksum file "
            f"{sum_path(self.path).name} lost records"))

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
        self.start, self.buf = start, data
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
                        max(self.file_size - self.end, 0), self.ends_closed)


def _one_write_at_most(fd: int, start: int, stop: int) -> bool:
    """Whether bytes ``start..stop`` of a stream are (a prefix of) one write."""
    f = frames(fd, start, stop, limit=3)
    return f.writes() == 0 or (f.writes() == 1 and f.end == stop)


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
