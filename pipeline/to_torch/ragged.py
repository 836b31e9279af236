"""Arrow list columns -> numpy, for the tensor builder: per-row lengths and value pieces.

Read without a copy (no Python list, no loop over rows): a column without null rows through one
``list_flatten`` call, otherwise from each chunk's offsets and values buffers, keeping the pieces
the Arrow chunks already are so a chunked batch is scattered without a copy.
Split out of pipeline/to_torch/convert.py so this part stays free of torch.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.errors import ReplayLakeError

_NULLABLE = ("response_mask", "rollout_log_probs")


class BatchFormatError(ReplayLakeError, ValueError):
    """The table or the arguments cannot be turned into tensors (names the column and rows)."""


# Chunks smaller than this many values are merged (copied) into one piece: below it, the cost of
# one more numpy call per piece exceeds the cost of copying the values.
MIN_PIECE_VALUES = 1 << 14

Pieces = list[tuple[int, int, np.ndarray]]
"""(first row, end row, the values of those rows in row order): a column's token stream, kept in
the pieces its Arrow chunks already are, so that a chunked table is scattered without a copy."""


@dataclass
class Ragged:
    """One list column as numpy: per-row lengths and the values of every valid row, in pieces."""

    lengths: np.ndarray        # int64 [B]; 0 for null rows
    valid: np.ndarray | None   # bool [B]; None when no row is null
    pieces: Pieces


def describe_rows(mask: np.ndarray, limit: int = 5) -> str:
    idx = np.flatnonzero(mask)
    more = f" (+{len(idx) - limit} more)" if len(idx) > limit else ""
    return f"rows {idx[:limit].tolist()}{more}"


def read_ragged(table: pa.Table, name: str, min_piece: int | None = None) -> Ragged:
    """Read a list column from its offsets and values buffers (sliced and chunked arrays too).

    Chunks are merged into pieces of at least ``min_piece`` values (default
    ``MIN_PIECE_VALUES``; 0 keeps every chunk as it is, without a copy).

    Offsets of a sliced array do not start at 0 and the child buffer may hold values outside the
    slice, so each chunk contributes ``values[offsets[0]:offsets[-1]]`` (a view); a null slot may
    own a (garbage) range, which is dropped. Numbers without null rows take ``_flat_pieces``
    (Arrow resolves the offsets); the rest is read chunk by chunk.
    """
    col = table.column(name)
    if not (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)):
        raise BatchFormatError(f"column {name!r} has type {col.type}; a list of numbers is needed")
    valid = None
    if col.null_count:
        valid = col.is_valid().to_numpy(zero_copy_only=False)
        if name not in _NULLABLE:
            raise BatchFormatError(f"column {name!r} is null in {describe_rows(~valid)}; "
                                   "it must not be")
    lengths = pc.list_value_length(col)
    if valid is not None:
        lengths = pc.fill_null(lengths, 0)
    lengths = lengths.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    fixed = _fixed_width(col.type)
    if fixed and valid is None:
        flat = _flat_pieces(col)
        if flat is not None:
            return merged(Ragged(lengths, valid, flat), min_piece)
    pieces: Pieces = []
    row = 0
    for chunk in col.chunks:
        seg = _plain_chunk(chunk, *fixed) if fixed else None
        if seg is None:
            seg = _any_chunk(chunk, name)
        pieces.append((row, row + len(chunk), seg))
        row += len(chunk)
    return merged(Ragged(lengths, valid, pieces), min_piece)


def _flat_pieces(col: pa.ChunkedArray) -> Pieces | None:
    """Every chunk's values in one Arrow call (``list_flatten`` resolves the offsets and the
    child's offset in C++), each wrapped without a copy; None when an item inside a list is null
    (the per-chunk path reports it). One call for all the chunks is cheaper than reading each
    chunk's buffers from Python."""
    flat = pc.list_flatten(col)
    chunks = col.chunks
    if flat.null_count or flat.num_chunks != len(chunks):
        return None
    pieces: Pieces = []
    row = 0
    for chunk, values in zip(chunks, flat.chunks):
        pieces.append((row, row + len(chunk), values.to_numpy()))
        row += len(chunk)
    return pieces


def merged(col: Ragged, min_piece: int | None = None) -> Ragged:
    """``col`` with consecutive pieces merged (copied) into pieces of at least ``min_piece``
    values (default ``MIN_PIECE_VALUES``; 0 keeps the pieces as they are)."""
    min_piece = MIN_PIECE_VALUES if min_piece is None else min_piece
    if min_piece == 0 or len(col.pieces) <= 1:
        return col
    pieces: Pieces = []
    pending: Pieces = []
    held = 0
    for piece in col.pieces:
        pending.append(piece)
        held += len(piece[2])
        if held >= min_piece:
            pieces.append(_merge(pending))
            pending, held = [], 0
    if pending:
        pieces.append(_merge(pending))
    return Ragged(col.lengths, col.valid, pieces)


def _fixed_width(list_type: pa.DataType) -> tuple[np.dtype, np.dtype] | None:
    """(offsets dtype, values dtype) when a chunk's buffers can be read directly: numbers."""
    vt = list_type.value_type
    if not (pa.types.is_integer(vt) or pa.types.is_floating(vt)):
        return None
    return (np.dtype(np.int64 if pa.types.is_large_list(list_type) else np.int32),
            np.dtype(vt.to_pandas_dtype()))


def _plain_chunk(chunk: pa.Array, off_dtype: np.dtype, val_dtype: np.dtype) -> np.ndarray | None:
    """The values of a chunk's rows straight from its buffers (cheaper than the array API,
    which matters with one chunk per producer put), or None when a null or an empty chunk needs
    ``_any_chunk``."""
    bufs = chunk.buffers()          # validity, offsets, the child's validity, the child's values
    n = len(chunk)
    if n == 0 or chunk.null_count or bufs[2] is not None or bufs[3] is None:
        return None
    off = np.frombuffer(bufs[1], off_dtype, n + 1, chunk.offset * off_dtype.itemsize)
    lo, hi = int(off[0]), int(off[-1])
    return np.frombuffer(bufs[3], val_dtype, hi - lo,
                         (chunk.values.offset + lo) * val_dtype.itemsize)


def _any_chunk(chunk: pa.Array, name: str) -> np.ndarray:
    """The values of a chunk's valid rows through the array API (nulls anywhere)."""
    off = np.asarray(chunk.offsets)
    lo, hi = off[0], off[-1]
    child = chunk.values
    if child.null_count:        # nulls somewhere in the child buffer: are any ours?
        child, lo, hi = child.slice(lo, hi - lo), 0, hi - lo
        if child.null_count:
            raise BatchFormatError(f"column {name!r} holds null items inside its lists")
    seg = child.to_numpy(zero_copy_only=False)[lo:hi]
    if chunk.null_count:
        seg = seg[np.repeat(chunk.is_valid().to_numpy(zero_copy_only=False), np.diff(off))]
    return seg


def _merge(pending: Pieces) -> tuple[int, int, np.ndarray]:
    vals = np.concatenate([v for *_, v in pending]) if len(pending) > 1 else pending[0][2]
    return pending[0][0], pending[-1][1], vals


def response_stream(col: Ragged, name: str, resp_len: np.ndarray,
                     fill: float) -> Pieces | float:
    """A response-aligned column as one value per response token; null rows -> ``fill``.

    Returns the scalar ``fill`` itself when every row is null (callers then skip the scatter).
    """
    has = np.ones(len(resp_len), bool) if col.valid is None else col.valid
    bad = has & (col.lengths != resp_len)
    if bad.any():
        raise BatchFormatError(f"column {name!r}: length differs from response_ids in "
                               f"{describe_rows(bad)}")
    if col.valid is None:
        return col.pieces
    if not col.valid.any():
        return fill
    out = []
    for r0, r1, vals in col.pieces:
        ok, rl = col.valid[r0:r1], resp_len[r0:r1]
        if not ok.all():
            full = np.full(int(rl.sum()), fill, dtype=vals.dtype)
            full[np.repeat(ok, rl)] = vals
            vals = full
        out.append((r0, r1, vals))
    return out
