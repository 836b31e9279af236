"""The token tensors of short rows, written through boolean masks into zeroed outputs.

Below ``pipeline.to_torch.rows.ROW_COPY_MIN_TOKENS`` tokens per row what a per-row view costs in
Python exceeds a mask pass over the row, so short rows are scattered where a mask built
from the lengths is set. The outputs come zeroed: only real tokens (and the pad token, when it is
not 0) are written. Names and shapes as in pipeline/to_torch/convert.py.

numpy only (no torch): the caller hands in numpy views of its output tensors.
"""
from __future__ import annotations

import numpy as np

from pipeline.to_torch.ragged import Pieces


def _put(a: np.ndarray, where: np.ndarray, stream: Pieces | float, bounds: np.ndarray) -> None:
    """Write a token stream into ``a`` where ``where`` is set, piece by piece (a scalar stream:
    that value everywhere ``where`` is set; 0 is already there).

    ``bounds[i]`` is where row i starts along the first axis of ``a`` (rows of a padded tensor;
    token offsets, i.e. cu_seqlens, of a packed one)."""
    if not isinstance(stream, list):
        if stream != 0:
            np.copyto(a, np.asarray(stream, a.dtype), where=where)
    elif len(stream) == 1:
        a[where] = stream[0][2]
    else:
        for r0, r1, vals in stream:
            span = slice(bounds[r0], bounds[r1])
            a[span][where[span]] = vals


def write_padded(out: dict[str, np.ndarray], p: np.ndarray, r: np.ndarray, prompt: Pieces,
                 resp: Pieces, mask: Pieces | float, logp: Pieces | float, pad: int) -> None:
    """The padded layout's tensors ([B, L] and [B, R]) into zeroed outputs."""
    n = p + r
    B, L = out["input_ids"].shape
    R = out["responses"].shape[1]
    pos = np.arange(L)
    np.less(pos, n[:, None], out=out["attention_mask"])          # 1 on the real tokens
    np.multiply(pos, out["attention_mask"], out=out["position_ids"])
    in_prompt = pos < p[:, None]                                  # [B, L] bool
    in_resp = pos < n[:, None]
    np.logical_xor(in_resp, in_prompt, out=in_resp)   # the prompt is a prefix of the real tokens
    resp_real = np.arange(R) < r[:, None]                         # [B, R] bool
    rows = np.arange(B + 1)
    if pad:
        out["input_ids"].fill(pad)
        out["responses"].fill(pad)
    _put(out["input_ids"], in_prompt, prompt, rows)
    _put(out["input_ids"], in_resp, resp, rows)
    _put(out["response_mask"], in_resp, mask, rows)
    _put(out["rollout_log_probs"], in_resp, logp, rows)
    _put(out["responses"], resp_real, resp, rows)
    _put(out["responses_mask"], resp_real, mask, rows)
    _put(out["responses_log_probs"], resp_real, logp, rows)


def write_packed(out: dict[str, np.ndarray], p: np.ndarray, r: np.ndarray, cu: np.ndarray,
                 prompt: Pieces, resp: Pieces, mask: Pieces | float,
                 logp: Pieces | float) -> None:
    """The packed layout's token tensors (1-D, T tokens; row i at ``cu[i]:cu[i+1]``) into
    zeroed outputs."""
    n = p + r
    B, T = len(n), int(cu[-1])
    # Runs of (prompt, response) per row: a run-length decode, which np.repeat does at memset speed.
    is_prompt = np.repeat(np.tile(np.array([True, False]), B), np.stack([p, r], 1).ravel())
    is_resp = ~is_prompt
    _put(out["input_ids"], is_prompt, prompt, cu)
    _put(out["input_ids"], is_resp, resp, cu)
    # Positions: a running count of ones that jumps back to 0 at the start of every non-empty row.
    posv = out["position_ids"]
    posv.fill(1)
    nonempty = n > 0
    starts, lens = cu[:-1][nonempty], n[nonempty]
    if T:
        posv[starts[0]] = 0
        posv[starts[1:]] = 1 - lens[:-1]
        np.cumsum(posv, out=posv)
    _put(out["response_mask"], is_resp, mask, cu)
    _put(out["rollout_log_probs"], is_resp, logp, cu)
