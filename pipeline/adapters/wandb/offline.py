"""Read an offline W&B run back from its files: the logged history rows, config and table rows.

Why this exists: an offline run is only useful if someone can check what it holds without
syncing it to a server, and wandb 0.31 ships no Python reader for its run file (the Go core
writes it). The ``run-<id>.wandb`` file is a record log in the LevelDB log format -- a 7-byte
file header (``:W&B``, magic 0xBEE1, version 0), then 32 KiB blocks of chunks, each chunk
``crc32(type byte + data)`` (4 bytes LE), ``length`` (2 bytes LE), ``type`` (1 = full,
2 = first, 3 = middle, 4 = last), ``data`` -- and every record is a ``wandb.proto.Record``
protobuf. Tables are logged as a history value that names a ``.table.json`` file under
``files/``; an incremental table's file holds only the rows of that increment.

Used by the tests of the tracker and the demo; `OfflineRun.table_rows(key)` gives every row a
table key ever received, in logging order.
"""
from __future__ import annotations

import json
import os
import struct
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.errors import ReplayLakeError

_HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
_BLOCK = 32768
_CHUNK = struct.Struct("<IHB")
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


class WandbRunFormatError(ReplayLakeError, ValueError):
    """The file is not a W&B run file, or a chunk inside it is damaged (names file and offset)."""


def read_records(path: str | os.PathLike) -> list[bytes]:
    """The raw protobuf records of a ``.wandb`` file, in order. A torn last chunk (a run still
    writing, or killed) ends the list; a bad checksum anywhere before it is an error."""
    data = Path(path).read_bytes()
    if not data.startswith(_HEADER):
        raise WandbRunFormatError(f"{path}: not a W&B run file (header {data[:7]!r})")
    records: list[bytes] = []
    pending: bytes | None = None
    off = len(_HEADER)
    while off + _CHUNK.size <= len(data):
        left = _BLOCK - off % _BLOCK
        if left < _CHUNK.size:                 # a block's tail too short for a chunk is padding
            off += left
            continue
        crc, length, kind = _CHUNK.unpack_from(data, off)
        start = off + _CHUNK.size
        if kind == 0 and length == 0:          # zero padding at the end of a block
            off += left
            continue
        if start + length > len(data):
            break                               # torn tail
        chunk = data[start:start + length]
        if zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != crc:
            raise WandbRunFormatError(f"{path}: bad checksum in the chunk at offset {off}")
        off = start + length
        if kind == _FULL:
            records.append(chunk)
        elif kind == _FIRST:
            pending = chunk
        elif kind in (_MIDDLE, _LAST) and pending is not None:
            pending += chunk
            if kind == _LAST:
                records.append(pending)
                pending = None
        else:
            raise WandbRunFormatError(f"{path}: unexpected chunk type {kind} at offset {off}")
    return records


def _items(items: Any) -> dict[str, Any]:
    out = {}
    for it in items:
        key = it.key or "/".join(it.nested_key)
        out[key] = json.loads(it.value_json)
    return out


@dataclass
class OfflineRun:
    """What one offline run logged: history rows (one dict per ``log`` call, with ``_step``),
    the config, and the run directory to resolve media files against."""

    run_dir: Path
    history: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    finished: bool = False

    def values(self, key: str) -> dict[int, Any]:
        """`{step: value}` of one scalar key, over every history row that has it."""
        return {row["_step"]: row[key] for row in self.history if key in row}

    def table_rows(self, key: str) -> list[list[Any]]:
        """Every row a table key received, in logging order (for an incremental table: the rows
        of each increment; for an ordinary table logged repeatedly: its last version)."""
        rows: list[list[Any]] = []
        for row in self.history:
            meta = {k[len(key) + 1:]: v for k, v in row.items() if k.startswith(key + "/")}
            if "path" not in meta:
                continue
            table = json.loads((self.run_dir / "files" / meta["path"]).read_text())
            if meta.get("_type") == "incremental-table-file":
                rows.extend(table["data"])
            else:
                rows = list(table["data"])
        return rows


def run_file(run_dir: str | os.PathLike) -> Path:
    """The one ``run-<id>.wandb`` file of an ``offline-run-...`` directory."""
    files = sorted(Path(run_dir).glob("run-*.wandb"))
    if len(files) != 1:
        raise WandbRunFormatError(f"{run_dir}: expected one run-*.wandb file, found {len(files)}")
    return files[0]


def is_complete(run_dir: str | os.PathLike) -> bool:
    """Whether the run file already ends with its exit record. `wandb.Run.finish()` can return
    while wandb's core process is still writing the last records (seen with wandb 0.31), so a
    reader that needs the whole run waits for this first."""
    from wandb.proto import wandb_internal_pb2 as pb

    try:
        records = read_records(run_file(run_dir))
    except (WandbRunFormatError, OSError):
        return False
    if not records:
        return False
    last = pb.Record()
    last.ParseFromString(records[-1])
    return last.WhichOneof("record_type") == "exit"


def wait_complete(run_dir: str | os.PathLike, timeout: float = 30.0) -> bool:
    """Poll `is_complete` for up to `timeout` seconds; returns whether the run is complete."""
    deadline = time.monotonic() + timeout
    while not is_complete(run_dir):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def read_run(run_dir: str | os.PathLike) -> OfflineRun:
    """Parse ``<run_dir>/run-<id>.wandb`` (``run_dir`` is an ``offline-run-...`` directory)."""
    from wandb.proto import wandb_internal_pb2 as pb

    run_dir = Path(run_dir)
    run = OfflineRun(run_dir)
    for raw in read_records(run_file(run_dir)):
        rec = pb.Record()
        rec.ParseFromString(raw)
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            run.history.append(_items(rec.history.item))
        elif kind in ("config", "run"):
            updates = rec.config.update if kind == "config" else rec.run.config.update
            for it in updates:
                key = it.key or "/".join(it.nested_key)
                if key == "_wandb":                # wandb's own bookkeeping, not the user's
                    continue
                # the entry's value as JSON, as given (a dict value stays a dict: the
                # {"value": ...} wrapping is config.yaml's, not these records')
                run.config[key] = json.loads(it.value_json)
        elif kind == "exit":
            run.finished = True
    return run
