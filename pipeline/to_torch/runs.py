"""The compiled path of the row-copy writers: whole tensors written by a few C calls.

The numpy writers (pipeline/to_torch/rows.py, pipeline/to_torch/packed.py) build a tensor as one
``np.concatenate`` over per-row views, a view per row and run (each a Python object: at B=256
packed, ~1,800 of them). The optional extension ``pipeline.to_torch._runs`` (built from
pipeline/to_torch/_runs.c by ``pip install``) takes the runs as int64 arrays instead -- where each row
starts in the output, then per run of a row: how many values, and which source buffer it reads
from where, or the constant it repeats -- and writes a whole tensor in one loop, in memory order
(fresh pages written in one pass, each touched once, where a pass per kind of run would walk
them again per kind). It
widens int32 / int8 to int64 and converts floats to float32 with the C casts numpy's loops use,
so both paths write bit-identical tensors. Every run is checked against the buffers' sizes
before anything is written.

The compiled path is taken when the extension imports and ``REPLAYLAKE_PURE_PYTHON`` is unset,
empty or ``0`` (read on every call, so tests can drive both paths), and when every stream's
dtype converts to its tensor's the way numpy's ``same_kind`` casting allows; otherwise the
numpy writers run, with their own errors.

numpy only (no torch): the caller hands in numpy views of its output tensors.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from pipeline.to_torch.ragged import Pieces

try:
    from pipeline.to_torch import _runs as _compiled
except ImportError:                 # built without a compiler: the numpy writers do the work
    _compiled = None

ENV_PURE_PYTHON = "REPLAYLAKE_PURE_PYTHON"
HAVE_EXTENSION = _compiled is not None      # built and importable (whatever the variable says)

# The source dtypes the extension reads (fixed-width numbers, native byte order).
_SOURCES = frozenset(np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32,
                                           np.uint32, np.int64, np.uint64, np.float32,
                                           np.float64))
_I64 = np.dtype(np.int64)


def compiled() -> bool:
    """Whether the compiled path is available and not switched off by ``REPLAYLAKE_PURE_PYTHON``."""
    return HAVE_EXTENSION and os.environ.get(ENV_PURE_PYTHON, "") in ("", "0")


def converts(source: np.dtype, target: Any) -> bool:
    """Whether values of ``source`` go into a ``target`` tensor on the compiled path: the dtypes
    it reads, cast as ``np.concatenate(..., casting="same_kind")`` allows."""
    return source in _SOURCES and np.can_cast(source, target, "same_kind")


def write_rows(dst: np.ndarray, row_at: np.ndarray, parts: list[tuple]) -> None:
    """Write row i of ``dst`` (flat, int64 or float32) from ``row_at[i]`` on: each part's run for
    that row, one after another, so the whole output is written once, in memory order. A part:

    - ``copy(lengths, sources, bounds, src_at)``: ``lengths[i]`` values of its source from
      ``src_at[i]``; row i reads ``sources[j]`` for ``bounds[j-1] <= i < bounds[j]``;
    - ``fill(lengths, value)``: ``lengths[i]`` copies of ``value``;
    - ``positions(lengths)``: ``0, 1, ..., lengths[i] - 1``.

    Positions and lengths: int64 arrays of one entry per row. A run outside its buffers raises
    IndexError (a negative length ValueError) before anything is written."""
    _compiled.write_rows(dst, row_at, parts)


def copy(lengths: np.ndarray, sources: list[np.ndarray], bounds: np.ndarray,
         src_at: np.ndarray) -> tuple:
    return ("copy", lengths, sources, bounds, src_at)


def fill(lengths: np.ndarray, value: Any, dtype: Any) -> tuple:
    """``value`` is cast by numpy first, so a value the tensor cannot hold fails as it does in
    the numpy writers."""
    return ("fill", lengths, np.full(1, value, dtype)[0].item())


def positions(lengths: np.ndarray) -> tuple:
    return ("positions", lengths)


def _stream_ok(stream: Pieces | float, target: Any) -> bool:
    return not isinstance(stream, list) or all(converts(v.dtype, target) for *_, v in stream)


def usable(prompt: Pieces, resp: Pieces, mask: Pieces | float, logp: Pieces | float) -> bool:
    """Whether the row-copy writers' streams can take the compiled path (see the module doc)."""
    return (compiled() and _stream_ok(prompt, _I64) and _stream_ok(resp, _I64)
            and _stream_ok(mask, _I64) and _stream_ok(logp, np.float32))


class _Runs:
    """Where each row of a stream starts within its piece, for one array of row lengths and one
    way of cutting the rows into pieces (shared by the streams cut alike: the response ids, the
    loss mask and the log-probs of one batch usually are)."""

    def __init__(self, pieces: Pieces, lengths: np.ndarray):
        self.bounds = np.array([r1 for _, r1, _ in pieces], np.int64)
        starts = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=starts[1:])       # starts[i]: where row i begins in the stream
        first = np.array([r0 for r0, _, _ in pieces], np.int64)
        # a piece's values begin with its first row's: rebase each row on its piece's start
        self.src_at = starts[:-1] - np.repeat(starts[first], np.diff(self.bounds, prepend=0))


class _Parts:
    """The parts that write each stream, with the per-row source positions computed once per way
    of cutting rows into pieces."""

    def __init__(self) -> None:
        self._runs: dict[tuple, _Runs] = {}

    def run(self, stream: Pieces | float, lengths: np.ndarray, dtype: Any) -> tuple:
        """The part writing a stream's rows (or a scalar stream's value) of ``lengths``."""
        if not isinstance(stream, list):
            return fill(lengths, stream, dtype)
        key = (id(lengths), *(r1 for _, r1, _ in stream))
        runs = self._runs.get(key)
        if runs is None:
            runs = self._runs[key] = _Runs(stream, lengths)
        return copy(lengths, [v for *_, v in stream], runs.bounds, runs.src_at)


def write_padded(out: dict[str, np.ndarray], p: np.ndarray, r: np.ndarray, prompt: Pieces,
                 resp: Pieces, mask: Pieces | float, logp: Pieces | float, pad: int) -> None:
    """``to_torch_rows.write_padded``'s tensors, written by the extension."""
    i64, f32 = np.int64, np.float32
    n = p + r
    B, L = out["input_ids"].shape
    R = out["responses"].shape[1]
    rows = np.arange(B, dtype=i64)
    rows, resp_rows = rows * L, rows * R            # where each row starts
    tail, resp_tail = L - n, R - r
    parts = _Parts()
    pv, rv = parts.run(prompt, p, i64), parts.run(resp, r, i64)
    write_rows(out["input_ids"].reshape(-1), rows, [pv, rv, fill(tail, pad, i64)])
    write_rows(out["responses"].reshape(-1), resp_rows, [rv, fill(resp_tail, pad, i64)])
    for name, resp_name, stream, dtype in (("response_mask", "responses_mask", mask, i64),
                                           ("rollout_log_probs", "responses_log_probs", logp,
                                            f32)):
        sv = parts.run(stream, r, dtype)
        write_rows(out[name].reshape(-1), rows, [fill(p, 0, dtype), sv, fill(tail, 0, dtype)])
        write_rows(out[resp_name].reshape(-1), resp_rows, [sv, fill(resp_tail, 0, dtype)])
    write_rows(out["attention_mask"].reshape(-1), rows, [fill(n, 1, i64), fill(tail, 0, i64)])
    write_rows(out["position_ids"].reshape(-1), rows, [positions(n), fill(tail, 0, i64)])


def write_packed(out: dict[str, np.ndarray], p: np.ndarray, r: np.ndarray, prompt: Pieces,
                 resp: Pieces, mask: Pieces | float, logp: Pieces | float) -> None:
    """``to_torch_rows.write_packed``'s tensors (1-D, T tokens), written by the extension."""
    i64, f32 = np.int64, np.float32
    parts = _Parts()
    write_packed_parts(out, p, p + r, parts.run(prompt, p, i64), parts.run(resp, r, i64),
                       parts.run(mask, r, i64), parts.run(logp, r, f32))


def write_packed_parts(out: dict[str, np.ndarray], p: np.ndarray, n: np.ndarray, prompt: tuple,
                       resp: tuple, mask: tuple, logp: tuple) -> None:
    """The packed token tensors from the parts writing each stream's rows (``n``: each row's
    prompt + response length), one C call per tensor."""
    at = np.cumsum(n)
    at -= n                                 # where each row starts
    write_rows(out["input_ids"], at, [prompt, resp])
    write_rows(out["response_mask"], at, [fill(p, 0, np.int64), mask])
    write_rows(out["rollout_log_probs"], at, [fill(p, 0, np.float32), logp])
    write_rows(out["position_ids"], at, [positions(n)])
