"""The lake's on-disk format, shared by its writer, reader, checker and lock: paths and records.

Every append-only file (a table segment or a writer's log) is an Arrow IPC stream `X.arrow` with a
checksum file `X.arrow.crc` beside it. The checksum file holds one fixed-size record per write to
the stream: the stream's length after that write and the checksum of the bytes the write added,
plus the record's own CRC-32. Which checksum is in the record's top byte of the length: 0 for a
CRC-32 (zlib's; every lake written before CRC-32C came in), 1 for a CRC-32C (hardware-accelerated,
a few times cheaper per write). A write counts (was acknowledged) once its record is in
the checksum file,
so the bytes of a stream past its last record are a torn tail, and every byte before it can be
verified: that is what tells a torn tail (ignored) from damage anywhere else (refused).

Each writer also keeps a log, `_log/log-<writer>.arrow`: one `segment` record per segment it
created (so a segment that disappears is noticed), one `commit` record per call that spanned
several partitions (so a call torn between its files is read as never made), and `removed` records
a salvage (or a job that rewrites segments) writes for files it took away on purpose. A writer
creates its log before its first segment's first write, so a segment whose writer's log is gone
is damage, never a crash's leftover.
"""
from __future__ import annotations

import errno
import os
import struct
import zlib
from pathlib import Path
from typing import NamedTuple

import google_crc32c
import pyarrow as pa

from pipeline.lake import kill as lake_kill

DEFAULT_WINDOW = 1000
LOG_DIR = "_log"
LOCK_NAME = "_writer.lock"
QUARANTINE_DIR = "_quarantine"
SUM_SUFFIX = ".crc"
CALL_KEY = b"replaylake.call"       # batch metadata of a multi-partition call: "<writer>:<first>:<last>"
COMMIT_SEP = ","         # a commit record's tables, in lakes whose writer joined a call's tables

WINDOW_COLUMN = {
    "trajectories": "max_global_steps",
    "group_events": "global_steps",
    "decisions": "step",
    "metrics": "step",
}

LOG_SCHEMA = pa.schema([
    pa.field("kind", pa.string()),          # segment | commit | removed | burnt
    pa.field("table", pa.string()),
    pa.field("path", pa.string()),          # segment / removed: the file, relative to the lake root
    pa.field("writer", pa.string()),        # commit: the tag of the writer that made the call
    pa.field("first_seq", pa.int64()),      # commit: the call's seq range, both ends included;
    #                                         burnt: seqs no row will ever have (see scan.cut_seq)
    pa.field("last_seq", pa.int64()),
    pa.field("parts", pa.int32()),          # commit: how many record batches the call wrote
])

_RECORD = struct.Struct("<QI")              # (algorithm << 56 | stream length after the write),
_FULL = struct.Struct("<QII")               # checksum of its bytes; + the CRC-32 of those 12 bytes
RECORD_SIZE = _FULL.size

CRC32, CRC32C = 0, 1                        # the checksum algorithms a record can name
_ALGO_SHIFT = 56
_END_MASK = (1 << _ALGO_SHIFT) - 1
# CRC-32C only where the package has its compiled (hardware) code: its pure-Python fallback would
# cost milliseconds per write. Readers verify either algorithm either way.
WRITE_ALGORITHM = CRC32C if google_crc32c.implementation == "c" else CRC32


class Record(NamedTuple):
    """One checksum record: where the write ends in the stream, its checksum, which algorithm."""

    end: int
    crc: int
    algorithm: int = CRC32

    def matches(self, data: bytes | pa.Buffer) -> bool:
        """Whether ``data`` (the bytes of the write this record covers) is intact."""
        return checksum(data, self.algorithm) == self.crc


# errno values by which the OS refuses to hand out a file's bytes (permissions, limits): the bytes
# may be intact, so such a failure is never damage (salvage would set an intact file aside)
REFUSED_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EMFILE, errno.ENFILE, errno.ENOMEM})


def refused(exc: BaseException) -> bool:
    """Whether a read failed because the OS refused it, not because of what the file holds."""
    return isinstance(exc, OSError) and exc.errno in REFUSED_ERRNOS


def window_of(step: int, window: int = DEFAULT_WINDOW) -> int:
    """The step window a step falls in (negative steps never reach the lake)."""
    return max(int(step), 0) // window


def call_key(writer: str, first_seq: int, last_seq: int) -> str:
    """How a multi-partition call is named in its batches' metadata and in its commit record:
    by its writer and its own seq range, so no other call's rows can ever share its commit."""
    return f"{writer}:{first_seq}:{last_seq}"


def sum_path(path: Path) -> Path:
    return path.with_name(path.name + SUM_SUFFIX)


def checksum(data: bytes | pa.Buffer, algorithm: int = WRITE_ALGORITHM) -> int:
    """The checksum of the bytes one write added to a stream, by ``algorithm``."""
    if algorithm == CRC32C:
        return google_crc32c.value(data)
    return zlib.crc32(data)


def mapped(path: Path) -> pa.Buffer:
    """The whole file as one zero-copy buffer, readable after the file is replaced or deleted."""
    with pa.memory_map(str(path)) as f:
        return f.read_buffer()


def extend_checksum(crc: int, data: bytes, algorithm: int = WRITE_ALGORITHM) -> int:
    """``crc`` (of the bytes so far) extended over ``data``: a running `checksum`."""
    if algorithm == CRC32C:
        return google_crc32c.extend(crc, data)
    return zlib.crc32(data, crc)


def pack_record(end: int, data_crc: int, algorithm: int = CRC32) -> bytes:
    """One checksum record (``algorithm`` CRC32: byte for byte the format before CRC-32C)."""
    head = _RECORD.pack(algorithm << _ALGO_SHIFT | end, data_crc)
    return head + struct.pack("<I", zlib.crc32(head))


def record_for(end: int, data: bytes | pa.Buffer) -> bytes:
    """The checksum record of a write of ``data`` that ends the stream at ``end``."""
    return pack_record(end, checksum(data, WRITE_ALGORITHM), WRITE_ALGORITHM)


def unpack_records(raw: bytes) -> list[Record | None]:
    """Every complete record; None for a record whose own CRC does not match or that names an
    unknown algorithm. A partial record at the end (a torn write of the checksum file) is not
    returned."""
    out: list[Record | None] = []
    for i in range(len(raw) // RECORD_SIZE):
        head, crc, own = _FULL.unpack_from(raw, i * RECORD_SIZE)
        ok = zlib.crc32(raw[i * RECORD_SIZE:i * RECORD_SIZE + _RECORD.size]) == own
        algorithm = head >> _ALGO_SHIFT
        ok = ok and algorithm in (CRC32, CRC32C)
        out.append(Record(head & _END_MASK, crc, algorithm) if ok else None)
    return out


def _listed(d: Path, prefix: str = "", suffix: str = "") -> list[Path]:
    """The entries of directory ``d`` named ``prefix*suffix``, sorted; none when ``d`` does not
    exist. Unlike pathlib's glob, which silently skips a directory it may not read (so an
    unreadable partition or log would read as one holding nothing), this raises the OS's error."""
    try:
        names = os.listdir(d)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(d / n for n in names if n.startswith(prefix) and n.endswith(suffix))


def segment_files(root: str | os.PathLike, table: str,
                  partitions: list[str] | None = None) -> list[Path]:
    """Every live (.arrow) and compacted (.parquet) file of a lake table, in a stable order."""
    base = Path(root) / table
    if not base.exists():
        return []
    dirs = [base / f"partition={p}" for p in partitions] if partitions is not None else \
        _listed(base, "partition=")
    files: list[Path] = []
    for d in dirs:
        windows = _listed(d, "window=")
        for suffix in (".arrow", ".parquet"):
            files.extend(sorted(f for w in windows for f in _listed(w, suffix=suffix)))
    return files


def log_files(root: str | os.PathLike) -> list[Path]:
    """Every writer's log stream, in a stable order."""
    return _listed(Path(root) / LOG_DIR, suffix=".arrow")


def table_of(path: Path) -> str:
    """The lake table a segment file belongs to (its name starts with it)."""
    return path.name.split("-")[0]


WRITER_TAG_LENGTH = 12      # a writer's tag: 12 hex digits, then the file's 4-digit number


def writer_of(path: Path) -> str | None:
    """The tag of the writer that created a segment (`<table>-<first seq>-<tag><n>.arrow`) or a
    log (`log-<tag><n>.arrow`); None for a name of neither form."""
    parts = path.name.split(".")[0].split("-")
    last = parts[-1] if len(parts) in (2, 3) else ""
    tag = last[:WRITER_TAG_LENGTH]
    return tag if len(last) > WRITER_TAG_LENGTH and last[WRITER_TAG_LENGTH:].isdigit() else None


def fsync_dir(path: Path) -> None:
    """fsync a directory, so the names added to it survive power loss."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def mkdir_durably(d: Path) -> None:
    """Create ``d`` and its missing parents, each new name fsynced into its parent directory."""
    new = [p for p in (d, *d.parents) if not p.exists()]
    d.mkdir(parents=True, exist_ok=True)
    for p in reversed(new):
        fsync_dir(p.parent)


def replace_durably(tmp: Path, target: Path, *, synced: str | None = None,
                    replaced: str | None = None) -> None:
    """Put a fully written temporary file in ``target``'s place so that a power loss leaves the
    old file or the new one, never a mix: the file's bytes are fsynced, it is renamed, and the
    directory is fsynced. ``synced`` / ``replaced`` name the kill points (see lake_kill) hit
    after the fsync and after the rename, for the crash tests."""
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    if synced:
        lake_kill.hit(synced)
    os.replace(tmp, target)
    fsync_dir(target.parent)
    if replaced:
        lake_kill.hit(replaced)
