"""Where the Arrow IPC messages of a stream's unrecorded bytes begin and end, without reading bodies.

Why: the bytes of a stream past its last checksum record are either the one write a crash
interrupted (a torn tail, ignored) or damage (a checksum file that lost records). A crash leaves
at most one unacknowledged write, because the writer records each write before it starts the next
one, so telling the two apart means counting the whole writes in those bytes. A write is one IPC
message (a record batch, or the end-of-stream marker), and a stream's first write is the schema
message followed by one of those. Counting reads each message's 8-byte prefix and its metadata
(a few hundred bytes), never its body, so a tail of hundreds of MB costs a few reads per message.

The framing is the stream format's own: a 0xFFFFFFFF continuation marker, the metadata length
(int32, 0 for the end-of-stream marker), the flatbuffer `Message` (header type and body length
are read from it), then the body. Bytes that do not frame that way (a write cut short, zeros a
power loss left) end the count: they are at most the rest of one write.
"""
from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

CONTINUATION = b"\xff\xff\xff\xff"
SCHEMA, RECORD_BATCH, EOS = 1, 3, -1      # flatbuffer MessageHeader types; EOS: the marker
_MESSAGE_HEADER_TYPE, _MESSAGE_HEADER, _MESSAGE_BODY_LENGTH = 1, 2, 3   # fields of `Message`
_BATCH_COMPRESSION = 3                    # field id of `compression` in a `RecordBatch`


@dataclass(frozen=True)
class Frames:
    """The whole messages found from ``start``, their kinds in order, and where the last ends."""

    start: int
    kinds: tuple[int, ...]
    end: int                       # the end of the last whole message (``start`` if none)

    def writes(self) -> int:
        """How many writes the whole messages make: a stream's first write is its schema
        message together with the message after it."""
        n = len(self.kinds)
        return n - 1 if self.start == 0 and n and self.kinds[0] == SCHEMA else n

    @property
    def batches(self) -> int:
        return self.kinds.count(RECORD_BATCH)


def _field(meta: bytes, table: int, vtable: int, index: int, fmt: str) -> int:
    """A scalar field of a flatbuffer table (0 when absent, its default)."""
    (vt_size,) = struct.unpack_from("<H", meta, vtable)
    at = 4 + 2 * index
    if at + 2 > vt_size:
        return 0
    (offset,) = struct.unpack_from("<H", meta, vtable + at)
    return struct.unpack_from(fmt, meta, table + offset)[0] if offset else 0


def _header(meta: bytes) -> tuple[int, int] | None:
    """(header type, body length) of a flatbuffer `Message`; None if it does not parse."""
    try:
        (table,) = struct.unpack_from("<I", meta, 0)
        (back,) = struct.unpack_from("<i", meta, table)
        vtable = table - back
        if not 0 <= vtable < len(meta):
            return None
        kind = _field(meta, table, vtable, _MESSAGE_HEADER_TYPE, "<B")
        body = _field(meta, table, vtable, _MESSAGE_BODY_LENGTH, "<q")
    except struct.error:
        return None
    if kind not in (SCHEMA, RECORD_BATCH) or body < 0 or body % 8:
        return None
    return kind, body


def _compressed(meta: bytes) -> bool:
    """Whether a record batch message's `RecordBatch` names a body compression."""
    try:
        (table,) = struct.unpack_from("<I", meta, 0)
        (back,) = struct.unpack_from("<i", meta, table)
        vtable = table - back
        (vt_size,) = struct.unpack_from("<H", meta, vtable)
        at = 4 + 2 * _MESSAGE_HEADER
        if at + 2 > vt_size:
            return False
        (offset,) = struct.unpack_from("<H", meta, vtable + at)
        if not offset:
            return False
        (rel,) = struct.unpack_from("<I", meta, table + offset)
        batch = table + offset + rel
        (back,) = struct.unpack_from("<i", meta, batch)
        return _field(meta, batch, batch - back, _BATCH_COMPRESSION, "<I") != 0
    except struct.error:
        return False


def _messages(fd: int, start: int, stop: int) -> Iterator[tuple[int, bytes, int]]:
    """(header type, metadata, end) of each whole message in bytes ``start..stop`` of the open
    file ``fd``, in order, up to the first that is not whole (EOS: empty metadata)."""
    pos = start
    while pos + 8 <= stop:
        head = os.pread(fd, 8, pos)
        if len(head) < 8 or head[:4] != CONTINUATION:
            return
        (size,) = struct.unpack_from("<i", head, 4)
        if size == 0:
            pos += 8
            yield EOS, b"", pos
            continue
        if size < 0 or pos + 8 + size > stop:
            return
        meta = os.pread(fd, size, pos + 8)
        parsed = _header(meta)
        if parsed is None or pos + 8 + size + parsed[1] > stop:
            return
        pos += 8 + size + parsed[1]
        yield parsed[0], meta, pos


def compressed(path: str | os.PathLike) -> bool:
    """Whether the stream at ``path`` holds a compressed record batch (a lake writer with
    ``compression`` set compresses every batch of a segment but small ones). Reads message
    headers only, up to the first compressed one."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return any(kind == RECORD_BATCH and _compressed(meta)
                   for kind, meta, _ in _messages(fd, 0, os.fstat(fd).st_size))
    finally:
        os.close(fd)


def frames(fd: int, start: int, stop: int, limit: int | None = None) -> Frames:
    """The whole messages in bytes ``start..stop`` of the open file ``fd`` (at most ``limit``)."""
    kinds: list[int] = []
    pos = start
    for kind, _, end in _messages(fd, start, stop):
        if limit is not None and len(kinds) >= limit:
            break
        kinds.append(kind)
        pos = end
    return Frames(start, tuple(kinds), pos)


__all__ = ["Frames", "frames", "compressed", "SCHEMA", "RECORD_BATCH", "EOS"]
