"""The packed layout's token tensors for the common batch, with the fewest calls per batch.

The common batch: the four list columns hold no null row and no null item, have 32-bit offsets
and are cut into the same chunks, empty ones aside (a sampled batch: one chunk per producer
put). ``read`` takes such a table straight from its chunks' buffers and returns None for anything
else, which the general path (pipeline/to_torch/ragged.py, then pipeline/to_torch/rows.py)
handles, with its errors.

Why a path of its own: at B=256 x ~3.2k tokens the copies cost about a memcpy of the output,
and the general path added nearly as much again in fixed cost per call, paid with cold caches (a
trainer builds a batch after a step has evicted everything): every numpy or Arrow call and every
per-row view costs more cold. So the columns are read without Arrow compute
kernels (one ``buffers()`` per chunk, ``np.frombuffer`` for offsets and values), both lengths
come from one diff of the stacked offsets and every row's slice from the raw offsets (no
rebasing per chunk), the loss mask and log-probs reuse the response ids' slices when their
offsets buffers are equal (the usual case: one `take` cut all of them), and the zero and
position runs are views of templates kept across calls.

Where the compiled extension is built (pipeline/to_torch/runs.py), ``write`` hands each
tensor to it in one call from the rows' raw offsets, and the per-row views are never made.

numpy only (no torch): the caller hands in numpy views of its output tensors.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from pipeline.to_torch import runs as run_copies

_LISTS = ("prompt_ids", "response_ids", "response_mask", "rollout_log_probs")
_OFFSETS = np.dtype(np.int32)
# Templates kept across calls (read-only) for rows up to this many tokens; longer rows get
# templates of their own per call.
_TEMPLATE_MAX = 1 << 20
_templates: dict[str, np.ndarray] = {}


@dataclass
class PlainLists:
    """The four list columns of a common batch: per-row lengths and offsets, per-chunk values."""

    p: np.ndarray                 # int64 [B] prompt lengths
    r: np.ndarray                 # int64 [B] response lengths
    bounds: list[int]             # row where each chunk ends
    values: list[list[np.ndarray]]        # per column, per chunk: the chunk's child values
    # per column: every chunk's k + 1 raw offsets, one chunk after another (the loss mask's and
    # the log-probs' are the response ids' array itself when their buffers are equal)
    offsets: list[np.ndarray]
    sizes: list[int]              # rows per chunk
    rows: np.ndarray              # bool: which steps of ``offsets`` are rows (not chunk joins)
    _made: dict[tuple[str, int], object] = field(default_factory=dict)

    def slices(self, column: int) -> list[slice]:
        """Row i's slice into its chunk's values (the numpy writer's views)."""
        return self._once("slices", column, lambda off: _slices(off, self.sizes))

    def starts(self, column: int) -> np.ndarray:
        """Row i's first value in its chunk's values, int64 (the compiled writer's runs)."""
        return self._once("starts", column, lambda off: off[:-1][self.rows].astype(np.int64))

    def _once(self, what: str, column: int, make):
        off = self.offsets[column]
        key = (what, id(off))           # columns sharing an offsets array share the result
        if key not in self._made:
            self._made[key] = make(off)
        return self._made[key]


def _column(col: pa.ChunkedArray) -> tuple[list[pa.Array], np.dtype] | None:
    """A list column's non-empty chunks and its values' dtype, or None when it is not plain."""
    vt = col.type.value_type if pa.types.is_list(col.type) else None
    if vt is None or col.null_count or not (pa.types.is_integer(vt) or pa.types.is_floating(vt)):
        return None
    return [c for c in col.chunks if len(c)], np.dtype(vt.to_pandas_dtype())


def _values(chunk: pa.Array, bufs: list[pa.Buffer | None], vd: np.dtype) -> np.ndarray:
    """The chunk's child values (the chunk's offsets index them)."""
    child = chunk.values
    return np.frombuffer(bufs[3], vd, len(child), child.offset * vd.itemsize)


def _offsets(chunks: list[pa.Array], bufs: list[list[pa.Buffer | None]],
             sizes: list[int]) -> np.ndarray:
    """Every chunk's k + 1 offsets, one chunk after another."""
    offs = [np.frombuffer(b[1], _OFFSETS, k + 1, c.offset * _OFFSETS.itemsize)
            for c, b, k in zip(chunks, bufs, sizes)]
    return np.concatenate(offs) if len(offs) > 1 else offs[0]


def read(table: pa.Table) -> PlainLists | None:
    """The four list columns of a common batch (see the module doc), or None."""
    cols = [_column(table.column(name)) for name in _LISTS]
    if any(c is None for c in cols):
        return None
    sizes = [len(c) for c in cols[0][0]]
    if not sizes or any([len(c) for c in chunks] != sizes for chunks, _ in cols[1:]):
        return None                 # no rows, or columns cut into different chunks
    values: list[list[np.ndarray]] = []
    bufs: list[list[list[pa.Buffer | None]]] = []
    for chunks, vd in cols:
        col_bufs = [c.buffers() for c in chunks]  # validity, offsets, child validity and values
        if any(b[2] is not None or b[3] is None for b in col_bufs):
            return None             # null items, or no values buffer
        values.append([_values(c, b, vd) for c, b in zip(chunks, col_bufs)])
        bufs.append(col_bufs)
    offsets = [_offsets(cols[i][0], bufs[i], sizes) for i in (0, 1)]
    # A chunk of k rows holds k + 1 offsets; row i's length is the difference of its two.
    first = np.cumsum([0, *(k + 1 for k in sizes)])
    keep = np.ones(int(first[-1]) - 1, bool)
    keep[first[1:-1] - 1] = False               # the step from one chunk's end to the next's start
    # (C order: the per-row arrays go to the compiled writer as flat buffers)
    lengths = np.ascontiguousarray(np.diff(np.stack(offsets).astype(np.int64))[:, keep])
    r = lengths[1]
    resp = cols[1][0]
    for i in (2, 3):                # response-aligned: the response ids' lengths are required
        if all(c.offset == rc.offset and b[1].equals(rb[1])
               for c, b, rc, rb in zip(cols[i][0], bufs[i], resp, bufs[1])):
            offsets.append(offsets[1])  # the same offsets (the usual case: one `take` cut both)
            continue
        off = _offsets(cols[i][0], bufs[i], sizes)
        if not np.array_equal(np.diff(off)[keep], r):
            return None                         # the general path names the rows
        offsets.append(off)
    return PlainLists(lengths[0], r, np.cumsum(sizes).tolist(), values, offsets, sizes, keep)


def _slices(off: np.ndarray, sizes: list[int]) -> list[slice]:
    """Row i's slice ``off[i]:off[i+1]`` within its chunk's offsets, for every chunk."""
    flat = off.tolist()
    out: list[slice] = []
    at = 0
    for k in sizes:
        out += map(slice, flat[at:at + k], flat[at + 1:at + k + 1])
        at += k + 1
    return out


def template(kind: str, length: int) -> np.ndarray:
    """A read-only template of at least ``length`` values: zeros as int8 (``zeros8``) or the
    positions 0, 1, ... as int32 (``positions``), both widened while copied (numpy's widening
    loop beats the int64 memcpy of the same positions)."""
    have = _templates.get(kind)
    if have is not None and len(have) >= length:
        return have
    size = max(length, 4096)
    if kind == "positions":          # callers checked that a batch holds under 2**31 tokens
        made = np.arange(size, dtype=np.int32)
    else:
        made = np.zeros(size, np.int8)
    if size <= _TEMPLATE_MAX:
        made.flags.writeable = False
        _templates[kind] = made
    return made


def _views(lists: PlainLists, column: int) -> list[np.ndarray]:
    vals, sl = lists.values[column], lists.slices(column)
    out: list[np.ndarray] = []
    lo = 0
    for v, hi in zip(vals, lists.bounds):
        out += [v[s] for s in sl[lo:hi]]
        lo = hi
    return out


_TARGETS = (np.int64, np.int64, np.int64, np.float32)     # each list column's tensor dtype


def write(out: dict[str, np.ndarray], lists: PlainLists, n: np.ndarray) -> None:
    """The packed token tensors (1-D buffers of T tokens; names as in pipeline/to_torch/convert.py).
    ``n``: each row's prompt + response length."""
    if run_copies.compiled() and all(
            run_copies.converts(vals[0].dtype, target)
            for vals, target in zip(lists.values, _TARGETS)):
        _write_compiled(out, lists, n)
        return
    seq: list[np.ndarray | None] = [None] * (2 * len(n))    # row 0's two runs, row 1's, ...
    seq[0::2] = _views(lists, 0)
    seq[1::2] = _views(lists, 1)
    np.concatenate(seq, out=out["input_ids"], casting="same_kind")
    # The prompts' zero runs: int8 views shared by the int64 mask and the float32 log-probs
    # (cast while copied). One list for both is cheaper than a float32 template's views for the
    # log-probs, though those copy without a cast: half the views to build.
    zeros = template("zeros8", int(lists.p.max()))
    seq[0::2] = [zeros[s] for s in map(slice, lists.p.tolist())]
    seq[1::2] = _views(lists, 2)
    np.concatenate(seq, out=out["response_mask"], casting="same_kind")
    seq[1::2] = _views(lists, 3)
    np.concatenate(seq, out=out["rollout_log_probs"], casting="same_kind")
    pos = template("positions", int(n.max()))
    np.concatenate([pos[s] for s in map(slice, n.tolist())], out=out["position_ids"],
                   casting="same_kind")


def _write_compiled(out: dict[str, np.ndarray], lists: PlainLists, n: np.ndarray) -> None:
    """``write`` through the extension (pipeline/to_torch/runs.py): one C call per tensor
    instead of a view per row and run."""
    seg = run_copies
    bounds = np.array(lists.bounds, np.int64)
    p, r, v = lists.p, lists.r, lists.values
    seg.write_packed_parts(out, p, n, seg.copy(p, v[0], bounds, lists.starts(0)),
                           *(seg.copy(r, v[c], bounds, lists.starts(c)) for c in (1, 2, 3)))
