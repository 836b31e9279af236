"""The row-copy writer of pipeline/to_torch.py: every token tensor in one ``np.concatenate``.

A padded or packed tensor, read in memory order, is a sequence of runs: row 0's prompt tokens,
its response tokens, its padding, then row 1's, and so on. Each run is a numpy view -- of the
Arrow value buffer a column's chunk already is, or of a small constant template (zeros, the pad
token, ones for a null loss mask, 0..n-1 for positions) -- and one ``np.concatenate(views,
out=tensor)`` writes the whole tensor in order, casting int32 / int8 to int64 on the way. Every
output byte is written exactly once: no zero-fill pass, no boolean mask, so the output memory can
come uninitialised. The Python cost is one view per run (~0.2 us), which is why the mask path of
pipeline/to_torch.py stays for short rows (see ``ROW_COPY_MIN_TOKENS``).

numpy only (no torch): the caller hands in numpy views of its output tensors.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.to_torch_ragged import Pieces

# Rows at least this long on average (packed) / padded to at least this length (padded) are
# written by this module. Measured on a 2-core machine: a mask pass costs ~1.3 ns per element of
# the mask, a view ~0.2 us per run, a run per stream and row; rows of a few hundred tokens are
# where the two meet.
ROW_COPY_MIN_TOKENS = 256


def use_row_copy(layout: str, rows: int, tokens: int, padded_length: int) -> bool:
    """Whether the row-copy writer is the cheaper one for this batch's shape."""
    if rows == 0:
        return False
    span = padded_length if layout == "padded" else tokens / rows
    return span >= ROW_COPY_MIN_TOKENS


def row_views(stream: Pieces | float, lengths: np.ndarray, dtype: Any) -> list[np.ndarray]:
    """One view per row of a token stream (``lengths[i]`` values for row i); a scalar stream
    (a null column's fill value) gives views of one constant template of ``dtype``."""
    if not isinstance(stream, list):
        return _runs(stream, dtype, lengths)
    out: list[np.ndarray] = []
    for r0, r1, vals in stream:
        ends = np.cumsum(lengths[r0:r1]).tolist()
        out += [vals[a:b] for a, b in zip([0, *ends[:-1]], ends)]
    return out


def _runs(value: float, dtype: Any, lengths: np.ndarray) -> list[np.ndarray]:
    sizes = lengths.tolist()
    template = np.full(max(sizes, default=0), value, dtype)
    return [template[:k] for k in sizes]


def _fill(out: np.ndarray, *per_row: list[np.ndarray]) -> None:
    """Write ``out`` (C-contiguous) as row 0's runs, then row 1's, ...; each argument holds one
    run per row (e.g. prompts, responses, padding)."""
    seq = [v for runs in zip(*per_row) for v in runs]
    if seq:
        np.concatenate(seq, out=out.reshape(-1), casting="same_kind")


def write_padded(out: dict[str, np.ndarray], p: np.ndarray, r: np.ndarray, prompt: Pieces,
                 resp: Pieces, mask: Pieces | float, logp: Pieces | float, pad: int) -> None:
    """The token tensors of the padded layout (names and shapes as in pipeline/to_torch.py)."""
    i64, f32 = np.int64, np.float32
    n = p + r
    L = out["input_ids"].shape[1]
    R = out["responses"].shape[1]
    pv, rv = row_views(prompt, p, i64), row_views(resp, r, i64)
    mv, lv = row_views(mask, r, i64), row_views(logp, r, f32)
    tail_l, tail_r = L - n, R - r
    _fill(out["input_ids"], pv, rv, _runs(pad, i64, tail_l))
    _fill(out["response_mask"], _runs(0, i64, p), mv, _runs(0, i64, tail_l))
    _fill(out["rollout_log_probs"], _runs(0, f32, p), lv, _runs(0, f32, tail_l))
    _fill(out["responses"], rv, _runs(pad, i64, tail_r))
    _fill(out["responses_mask"], mv, _runs(0, i64, tail_r))
    _fill(out["responses_log_probs"], lv, _runs(0, f32, tail_r))
    pos = np.arange(L)
    np.less(pos, n[:, None], out=out["attention_mask"])           # every element written
    np.multiply(pos, out["attention_mask"], out=out["position_ids"])


def write_packed(out: dict[str, np.ndarray], p: np.ndarray, r: np.ndarray, prompt: Pieces,
                 resp: Pieces, mask: Pieces | float, logp: Pieces | float) -> None:
    """The token tensors of the packed layout (1-D buffers of T tokens)."""
    i64, f32 = np.int64, np.float32
    _fill(out["input_ids"], row_views(prompt, p, i64), row_views(resp, r, i64))
    _fill(out["response_mask"], _runs(0, i64, p), row_views(mask, r, i64))
    _fill(out["rollout_log_probs"], _runs(0, f32, p), row_views(logp, r, f32))
    n = p + r
    positions = np.arange(int(n.max(initial=0)), dtype=i64)
    _fill(out["position_ids"], [positions[:k] for k in n.tolist()])
