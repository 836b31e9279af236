"""One open append-only lake stream (an Arrow IPC stream and its checksum file) and how it writes.

Why the stream assembles its own IPC messages: an Arrow stream writer hands its bytes to a Python
sink one Arrow buffer at a time (a Python callback each, a large part of a small put's cost),
and they must be joined again so one write lands as one unit. The stream format is a schema
message, record batch messages and an end-of-stream marker; `RecordBatch.serialize` makes a
batch's message in one C++ buffer byte for byte as the stream writer would, so the files are
unchanged. A segment's first write (schema and batch) and a batch that carries custom metadata
(the parts of a multi-partition call; `serialize` cannot attach it) go through a throwaway stream
writer on a C++ sink instead.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa

from pipeline.lake import kill as lake_kill
from pipeline.lake.files import record_for, sum_path

EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"     # the stream format's end-of-stream marker


# Larger writes go out in pieces of this size: one `write` of tens of MB into the page cache is
# now and then several times slower (always the first in a process) than the same bytes in 1 MiB
# pieces, as `dd bs=1M` writes them, which keep their speed every time.
WRITE_PIECE = 1 << 20

# a record batch smaller than this is written uncompressed even when the stream compresses
COMPRESS_FROM = 32 * 1024


def _write_all(fd: int, data: bytes | pa.Buffer) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view[:WRITE_PIECE]):]


def encode(schema: pa.Schema, schema_bytes: pa.Buffer, batch: pa.RecordBatch,
           meta: dict[bytes, bytes] | None, with_schema: bool,
           compression: str | None = None) -> pa.Buffer:
    """The bytes one append writes: ``batch``'s message as Arrow's stream writer writes it,
    after the schema message when the stream is new. Always one buffer, filled by C++.
    ``compression`` ("zstd", "lz4"): the message's buffers compressed, as the stream writer's
    option compresses them (every reader of the stream format decompresses them); a batch
    under `COMPRESS_FROM` bytes is written uncompressed (each message says whether it is)."""
    packed = compression is not None and batch.nbytes >= COMPRESS_FROM
    if meta is None and not with_schema and not packed:
        return batch.serialize()                # the common case, exactly sized
    if meta is None and not packed:    # a segment's first write: schema and batch in one buffer
        out = pa.allocate_buffer(schema_bytes.size + pa.ipc.get_record_batch_size(batch)
                                 + len(EOS))
        sink = pa.FixedSizeBufferWriter(out)
    else:   # custom metadata or compression changes the message's size: a sink that grows
        sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression) if packed else None
    with pa.ipc.new_stream(sink, schema, options=options) as writer:
        writer.write_batch(batch, custom_metadata=meta)
    if isinstance(sink, pa.FixedSizeBufferWriter):
        end = sink.tell()
    else:
        out = sink.getvalue()
        end = out.size
    start = 0 if with_schema else schema_bytes.size
    return out.slice(start, end - len(EOS) - start)


class UndoError(OSError):
    """A failed write could not be taken back: its stream may still hold it."""


class Stream:
    """One open append-only stream and its checksum file."""

    def __init__(self, path: Path, schema: pa.Schema, point: str, fsync: bool,
                 compression: str | None = None):
        if any(pa.types.is_dictionary(f.type) for f in schema):
            # dictionary batches would have to be written between the messages assembled here
            raise pa.ArrowNotImplementedError(f"lake stream {path}: dictionary-encoded columns")
        self.path, self.point, self.fsync = path, point, fsync
        # the checksum file first: a stream without one is damage, never a crash's leftover.
        # File objects (unbuffered), so a writer dropped without close() still closes them.
        self.sums = open(sum_path(path), "xb", buffering=0)
        try:
            self.data = open(path, "xb", buffering=0)
        except OSError:
            self.sums.close()
            raise
        self.size = 0             # bytes of the stream, and of its checksum file, written whole
        self.sums_size = 0
        self.opened_at = time.monotonic()
        self.schema = schema
        self.schema_bytes = schema.serialize()
        self.compression = compression
        self.started = False      # the schema message goes out with the first write

    def write(self, data: bytes | pa.Buffer) -> None:
        """Write then record; with fsync, each is on disk before the next step. Anything raised
        on the way (a failed write or fsync, an exception of any kind) first cuts both files back
        to where they were, so the write is not in the lake at all (see `undo`)."""
        mark = self.mark()
        try:
            self._put(self.data.fileno(), data, "data")
            self.size += len(data)
            record = record_for(self.size, data)
            self._put(self.sums.fileno(), record, "sum")
            self.sums_size += len(record)
        except BaseException as exc:
            self.undo(mark, exc)
            raise

    def mark(self) -> tuple[int, int, bool]:
        """Where the stream stands: what `undo` goes back to."""
        return self.size, self.sums_size, self.started

    def undo(self, mark: tuple[int, int, bool], cause: BaseException | None = None) -> None:
        """Cut both files back to ``mark``: whatever was written since (even a whole write with
        its checksum record, which readers would count) is gone, durably with fsync. Raises
        `UndoError` (from ``cause``) when that fails: the files may then still hold it."""
        self.size, self.sums_size, self.started = mark
        try:
            os.ftruncate(self.data.fileno(), self.size)
            os.ftruncate(self.sums.fileno(), self.sums_size)
            if self.fsync:
                os.fsync(self.data.fileno())
                os.fsync(self.sums.fileno())
        except (OSError, ValueError) as exc:     # ValueError: the file was closed meanwhile
            raise UndoError(f"cannot cut {self.path} back to byte {self.size} ({exc})") \
                from cause

    def _put(self, fd: int, data: bytes | pa.Buffer, stage: str) -> None:
        """One file's step of a write, with its kill points (`<point>.<stage>_torn|written|synced`)."""
        p = f"{self.point}.{stage}"
        lake_kill.torn(p + "_torn", fd, data)
        _write_all(fd, data)
        lake_kill.hit(p + "_written")
        if self.fsync:
            os.fsync(fd)
            lake_kill.hit(p + "_synced")

    def append(self, batch: pa.RecordBatch, meta: dict[bytes, bytes] | None) -> None:
        if batch.schema != self.schema:
            raise pa.ArrowInvalid(f"lake stream {self.path}: a batch of another schema")
        self.write(encode(self.schema, self.schema_bytes, batch, meta, not self.started,
                          self.compression))
        self.started = True

    def finish(self) -> None:
        """Write the end-of-stream marker and close."""
        try:
            self.write(EOS if self.started else b"".join((self.schema_bytes, EOS)))
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Close both files (idempotent)."""
        for f in (self.data, self.sums):
            try:
                f.close()
            except OSError:
                pass
