"""One open append-only lake stream (an Arrow IPC stream and its checksum file) and how it writes.

Why the stream assembles its own IPC messages: an Arrow stream writer hands its bytes to a Python
sink one Arrow buffer at a time (a callback each, ~30 us per 16-trajectory batch), and they must
be joined again so one write lands as one unit. The stream format is a schema message, record
batch messages and an end-of-stream marker; Arrow serialises each of them into one C++ buffer
(`Schema.serialize`, `RecordBatch.serialize`) byte for byte as its stream writer would, so the
files are unchanged. A batch that carries custom metadata (the parts of a multi-partition call)
goes through a throwaway stream writer on a C++ sink instead, since `serialize` cannot attach it.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa

from pipeline import lake_kill
from pipeline.lake_files import record_for, sum_path

EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"     # the stream format's end-of-stream marker


def _write_all(fd: int, data: bytes | pa.Buffer) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def batch_message(schema_bytes: pa.Buffer, schema: pa.Schema, batch: pa.RecordBatch,
                  meta: dict[bytes, bytes] | None) -> pa.Buffer:
    """The IPC message of ``batch`` as a stream writer would write it after the schema."""
    if meta is None:
        return batch.serialize()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_batch(batch, custom_metadata=meta)
    out = sink.getvalue()
    return out.slice(schema_bytes.size, out.size - schema_bytes.size - len(EOS))


class Stream:
    """One open append-only stream and its checksum file."""

    def __init__(self, path: Path, schema: pa.Schema, point: str, fsync: bool):
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
        self.size = 0
        self.opened_at = time.monotonic()
        self.schema = schema
        self.schema_bytes = schema.serialize()
        self.started = False      # the schema message goes out with the first write

    def write(self, data: bytes | pa.Buffer) -> None:
        """Write then record; with fsync, each is on disk before the next step."""
        p, fd, sum_fd = self.point, self.data.fileno(), self.sums.fileno()
        lake_kill.torn(p + ".data_torn", fd, data)
        _write_all(fd, data)
        lake_kill.hit(p + ".data_written")
        if self.fsync:
            os.fsync(fd)
            lake_kill.hit(p + ".data_synced")
        self.size += len(data)
        record = record_for(self.size, data)
        lake_kill.torn(p + ".sum_torn", sum_fd, record)
        _write_all(sum_fd, record)
        lake_kill.hit(p + ".sum_written")
        if self.fsync:
            os.fsync(sum_fd)
            lake_kill.hit(p + ".sum_synced")

    def _with_schema(self, message: pa.Buffer | bytes) -> pa.Buffer | bytes:
        if self.started:
            return message
        self.started = True
        return b"".join((self.schema_bytes, message))

    def append(self, batch: pa.RecordBatch, meta: dict[bytes, bytes] | None) -> None:
        if batch.schema != self.schema:
            raise pa.ArrowInvalid(f"lake stream {self.path}: a batch of another schema")
        message = batch_message(self.schema_bytes, self.schema, batch, meta)
        self.write(self._with_schema(message))

    def finish(self) -> None:
        """Write the end-of-stream marker and close."""
        try:
            self.write(self._with_schema(EOS))
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Close both files (idempotent)."""
        for f in (self.data, self.sums):
            try:
                f.close()
            except OSError:
                pass
