"""The row-copy writer of pipeline/to_torch/convert.py: every token tensor in one ``np.concatenate``.

A padded or packed tensor, read in memory order, is a sequence of runs: row 0's prompt tokens,
its response tokens, its padding, then row 1's, and so on. Each run is a numpy view -- of the
Arrow value buffer a column's chunk already is, or of a small constant template (zeros, the pad
token, ones for a null loss mask, 0..n-1 for positions) -- and one ``np.concatenate(views,
out=tensor)`` writes the whole tensor in order, casting int32 / int8 to int64 on the way. Every
output byte is written exactly once: no zero-fill pass, no boolean mask, so the output memory can
come uninitialised. The Python cost is one view per run, which is why the mask path of
pipeline/to_torch/convert.py stays for short rows (see ``ROW_COPY_MIN_TOKENS``). Where the compiled
extension is available, the same runs are written by a few C calls instead
(pipeline/to_torch/runs.py); these numpy writers are the fallback.

numpy only (no torch): the caller hands in numpy views of its output tensors.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.to_torch import runs as run_copies
from pipeline.to_torch.ragged import Pieces

# Rows at least this long on average (packed) / padded to at least this length (padded) are
# written by this module: a view per run costs about what a mask pass over a hundred-odd
# elements does, and a row has a run per stream, so rows of a few hundred tokens are where the
# two meet (figures in docs/performance.md).
ROW_COPY_MIN_TOKENS = 256


def use_row_copy(layout: str, rows: int, tokens: int, padded_length: int) -> bool:
    """Whether the row-copy writer is the cheaper one for this batch's shape."""
    if rows == 0:
        return False
    span = padded_length if layout == "padded" else tokens / rows
    return span >= ROW_COPY_MIN_TOKENS


class RowSlices:
    """Per-row slices for one array of row lengths, built once per call and shared by every
    stream with those lengths (response ids, loss mask and log-probs share the response lengths;
    their pieces follow the same chunks), so each view costs one ``vals[slice]`` and no more."""

    def __init__(self, lengths: np.ndarray):
        self.lengths = lengths
        self._prefix: list[slice] | None = None
        self._local: dict[tuple[int, int], list[slice]] = {}

    def views(self, stream: Pieces | float, dtype: Any) -> list[np.ndarray]:
        """One view per row of a token stream (``lengths[i]`` values for row i); a scalar
        stream (a null column's fill value) gives views of one constant template of ``dtype``."""
        if not isinstance(stream, list):
            return self.runs(stream, dtype)
        out: list[np.ndarray] = []
        for r0, r1, vals in stream:
            local = self._local.get((r0, r1))
            if local is None:
                local = self._slices(stream)[r0, r1]
            out += [vals[s] for s in local]     # a comprehension: cheaper than map here
        return out

    def _slices(self, stream: Pieces) -> dict[tuple[int, int], list[slice]]:
        """Every row's slice within its piece, for all pieces of ``stream`` in a few numpy calls
        (one cumsum, not one per piece)."""
        ends = np.zeros(len(self.lengths) + 1, np.int64)
        np.cumsum(self.lengths, out=ends[1:])      # ends[i] = where row i starts in the stream
        first = np.array([r0 for r0, _, _ in stream], np.int64)
        rows = np.array([r1 - r0 for r0, r1, _ in stream], np.int64)
        local_ends = ends[1:] - np.repeat(ends[first], rows)
        stop = local_ends.tolist()
        start = (local_ends - self.lengths).tolist()
        for r0, r1, _ in stream:
            self._local[r0, r1] = list(map(slice, start[r0:r1], stop[r0:r1]))
        return self._local

    def runs(self, value: float, dtype: Any) -> list[np.ndarray]:
        """Row i's run of ``lengths[i]`` copies of ``value`` (views of one template)."""
        return self.prefixes(np.full(int(self.lengths.max(initial=0)), value, dtype))

    def prefixes(self, template: np.ndarray) -> list[np.ndarray]:
        """Row i's view ``template[:lengths[i]]`` (the template is at least as long as a row)."""
        if self._prefix is None:
            self._prefix = list(map(slice, self.lengths.tolist()))
        return [template[s] for s in self._prefix]


def _fill(out: np.ndarray, *per_row: list[np.ndarray]) -> None:
    """Write ``out`` (C-contiguous) as row 0's runs, then row 1's, ...; each argument holds one
    run per row (e.g. prompts, responses, padding)."""
    k = len(per_row)
    seq: list[Any] = [None] * (k * len(per_row[0]))
    for i, runs in enumerate(per_row):          # interleaved by slice assignment, in C
        seq[i::k] = runs
    if seq:
        np.concatenate(seq, out=out.reshape(-1), casting="same_kind")


def write_padded(out: dict[str, np.ndarray], p: np.ndarray, r: np.ndarray, prompt: Pieces,
                 resp: Pieces, mask: Pieces | float, logp: Pieces | float, pad: int) -> None:
    """The token tensors of the padded layout (names and shapes as in pipeline/to_torch/convert.py)."""
    if run_copies.usable(prompt, resp, mask, logp):
        return run_copies.write_padded(out, p, r, prompt, resp, mask, logp, pad)
    i64, f32 = np.int64, np.float32
    n = p + r
    L = out["input_ids"].shape[1]
    R = out["responses"].shape[1]
    ps, rs, tl, tr = RowSlices(p), RowSlices(r), RowSlices(L - n), RowSlices(R - r)
    pv, rv = ps.views(prompt, i64), rs.views(resp, i64)
    mv, lv = rs.views(mask, i64), rs.views(logp, f32)
    # zero runs as int8 views, shared by the int64 and float32 tensors (cast while copied)
    zp, zl, zr = ps.runs(0, np.int8), tl.runs(0, np.int8), tr.runs(0, np.int8)
    _fill(out["input_ids"], pv, rv, tl.runs(pad, i64))
    _fill(out["response_mask"], zp, mv, zl)
    _fill(out["rollout_log_probs"], zp, lv, zl)
    _fill(out["responses"], rv, tr.runs(pad, i64))
    _fill(out["responses_mask"], mv, zr)
    _fill(out["responses_log_probs"], lv, zr)
    pos = np.arange(L)
    np.less(pos, n[:, None], out=out["attention_mask"])           # every element written
    np.multiply(pos, out["attention_mask"], out=out["position_ids"])


def write_packed(out: dict[str, np.ndarray], p: np.ndarray, r: np.ndarray, prompt: Pieces,
                 resp: Pieces, mask: Pieces | float, logp: Pieces | float) -> None:
    """The token tensors of the packed layout (1-D buffers of T tokens)."""
    if run_copies.usable(prompt, resp, mask, logp):
        return run_copies.write_packed(out, p, r, prompt, resp, mask, logp)
    i64, f32 = np.int64, np.float32
    ps, rs = RowSlices(p), RowSlices(r)
    _fill(out["input_ids"], ps.views(prompt, i64), rs.views(resp, i64))
    zeros = ps.runs(0, np.int8)         # shared by the int64 and float32 tensors
    _fill(out["response_mask"], zeros, rs.views(mask, i64))
    _fill(out["rollout_log_probs"], zeros, rs.views(logp, f32))
    n = p + r
    # an int32 template (half the bytes, widened while copied): numpy's widening loop beats the
    # same-dtype copy, which goes through memcpy, on the machines measured
    top = int(n.max(initial=0))
    template = np.arange(top, dtype=np.int32 if top <= np.iinfo(np.int32).max else i64)
    _fill(out["position_ids"], RowSlices(n).prefixes(template))
