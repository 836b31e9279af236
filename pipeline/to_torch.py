"""Batch table -> torch tensors for the trainer (SPEC §7), built straight from the Arrow buffers.

The only core module that imports torch. Every tensor is written once from the list offsets and
value buffers of the Arrow columns: no Python list, no Python loop over rows. The token streams
(all prompt tokens, all response tokens, one after another in row order) are scattered into the
output with boolean masks built from the row lengths; numpy allocates the output (freshly zeroed
pages, so a zero fill costs nothing) and ``torch.from_numpy`` wraps it without a copy.

Layouts and tensors (B rows, L = max(prompt + response length), R = max response length,
T = total tokens; per-row tensors are shared by both layouts):

``padded`` -- each row is its prompt then its response, right-padded:
    input_ids          [B, L] int64    pad_token_id on padding
    attention_mask     [B, L] int64    1 on real tokens, 0 on padding
    position_ids       [B, L] int64    0..len-1 on real tokens, 0 on padding
    response_mask      [B, L] int64    the loss mask on the response tokens' positions,
                                       0 on prompt and padding
    rollout_log_probs  [B, L] float32  aligned like response_mask, 0.0 elsewhere
    responses          [B, R] int64    the response tokens alone, right-padded with pad_token_id
    responses_mask     [B, R] int64    response_mask in the responses layout (verl's
                                       `response_mask`), 0 on padding
    responses_log_probs [B, R] float32 rollout_log_probs in the responses layout (verl's
                                       `rollout_log_probs`), 0.0 on padding
``packed`` -- the rows concatenated without padding, as varlen attention kernels (and HF's
flattening collator) take them; ``[1, T]`` so a model sees one sequence of T tokens, and
``.squeeze(0)`` gives the ``[T]`` view flash-attention's varlen functions take:
    input_ids [1, T] int64, position_ids [1, T] int64 (restart at 0 for every row),
    response_mask [1, T] int64, rollout_log_probs [1, T] float32,
    cu_seqlens [B + 1] int32 (row i is tokens cu_seqlens[i]:cu_seqlens[i+1]).
    No attention_mask: an all-ones mask would make a model attend across rows.
per row (both layouts):
    prompt_lengths, response_lengths [B] int64; rewards [B] float32 (from the float64 reward);
    global_steps, min_global_steps, max_global_steps, staleness [B] int64; is_padding [B] bool.

Null payload columns (the lake's conventions): a null ``response_mask`` means every response
token is trained on (all ones); a null ``rollout_log_probs`` means unknown and becomes 0.0 -- a
trainer that needs them must recompute them (verl does when ``rollout_log_probs`` is absent).

``pin_memory=True`` allocates every output in page-locked host memory (written in place, no
extra copy) so the copy to ``device`` can be ``non_blocking``. Without an accelerator there is
nothing to pin for: like torch's DataLoader, we warn and return ordinary memory.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from pipeline.errors import ReplayLakeError

LAYOUTS = ("padded", "packed")
PER_ROW_INT64 = ("global_steps", "min_global_steps", "max_global_steps", "staleness")
LIST_COLUMNS = ("prompt_ids", "response_ids", "response_mask", "rollout_log_probs")
REQUIRED_COLUMNS = (*LIST_COLUMNS, "reward", *PER_ROW_INT64, "is_padding")
_NULLABLE = ("response_mask", "rollout_log_probs")
_TORCH_DTYPES = {np.dtype(np.int64): torch.int64, np.dtype(np.int32): torch.int32,
                 np.dtype(np.float32): torch.float32, np.dtype(bool): torch.bool}


class BatchFormatError(ReplayLakeError, ValueError):
    """The table or the arguments cannot be turned into tensors (names the column and rows)."""


@dataclass
class _Ragged:
    """One list column as numpy: per-row lengths and the values of every valid row, in order."""

    lengths: np.ndarray        # int64 [B]; 0 for null rows
    values: np.ndarray         # the valid rows' values, concatenated in row order
    valid: np.ndarray | None   # bool [B]; None when no row is null


def _rows(mask: np.ndarray, limit: int = 5) -> str:
    idx = np.flatnonzero(mask)
    more = f" (+{len(idx) - limit} more)" if len(idx) > limit else ""
    return f"rows {idx[:limit].tolist()}{more}"


def _ragged(table: pa.Table, name: str) -> _Ragged:
    """Read a list column from its offsets and values buffers (sliced and chunked arrays too).

    Offsets of a sliced array do not start at 0 and the child buffer may hold values outside the
    slice, so each chunk contributes ``values[offsets[0]:offsets[-1]]``; a null slot may own a
    (garbage) range, which is dropped. One chunk costs no copy at all.
    """
    col = table.column(name)
    if not (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)):
        raise BatchFormatError(f"column {name!r} has type {col.type}; a list of numbers is needed")
    lengths, values, valid = [], [], []
    for chunk in col.chunks:
        off = np.asarray(chunk.offsets)
        child = chunk.values
        if child.null_count:
            raise BatchFormatError(f"column {name!r} holds null items inside its lists")
        seg = child.to_numpy(zero_copy_only=False)[off[0]:off[-1]]
        n = np.diff(off).astype(np.int64)
        ok = np.ones(len(chunk), dtype=bool)
        if chunk.null_count:
            ok = chunk.is_valid().to_numpy(zero_copy_only=False)
            seg = seg[np.repeat(ok, n)]
            n[~ok] = 0
        lengths.append(n)
        values.append(seg)
        valid.append(ok)
    if not values:
        dtype = col.type.value_type.to_pandas_dtype()
        return _Ragged(np.zeros(0, np.int64), np.zeros(0, dtype), None)
    ok_all = np.concatenate(valid) if len(valid) > 1 else valid[0]
    out = _Ragged(np.concatenate(lengths) if len(lengths) > 1 else lengths[0],
                  np.concatenate(values) if len(values) > 1 else values[0],
                  None if ok_all.all() else ok_all)
    if out.valid is not None and name not in _NULLABLE:
        raise BatchFormatError(f"column {name!r} is null in {_rows(~out.valid)}; it must not be")
    return out


def _response_stream(col: _Ragged, name: str, resp_len: np.ndarray,
                     fill: float) -> np.ndarray | float:
    """A response-aligned column as one value per response token; null rows -> ``fill``.

    Returns the scalar ``fill`` itself when every row is null (callers then skip the scatter).
    """
    has = np.ones(len(resp_len), bool) if col.valid is None else col.valid
    bad = has & (col.lengths != resp_len)
    if bad.any():
        raise BatchFormatError(f"column {name!r}: length differs from response_ids in "
                               f"{_rows(bad)}")
    if col.valid is None:
        return col.values
    if not col.valid.any():
        return fill
    out = np.full(int(resp_len.sum()), fill, dtype=col.values.dtype)
    out[np.repeat(col.valid, resp_len)] = col.values
    return out


class _Alloc:
    """Output buffers as (numpy view, tensor) pairs, in pinned memory when asked."""

    def __init__(self, pin: bool):
        self.pin = pin

    def new(self, shape: tuple[int, ...], dtype: Any, fill: float = 0) -> tuple[np.ndarray,
                                                                              torch.Tensor]:
        if self.pin:
            t = torch.empty(shape, dtype=_TORCH_DTYPES[np.dtype(dtype)], pin_memory=True)
            a = t.numpy()
            a.fill(fill)
            return a, t
        # np.zeros takes fresh zero pages from the OS: the zero fill is free.
        a = np.zeros(shape, dtype) if fill == 0 else np.full(shape, fill, dtype)
        return a, torch.from_numpy(a)

    def scatter(self, shape: tuple[int, ...], dtype: Any, where: np.ndarray,
                stream: np.ndarray | float, fill: float = 0) -> torch.Tensor:
        """A tensor holding ``stream`` (in row-major order) where ``where`` is set, else fill."""
        a, t = self.new(shape, dtype, fill)
        if isinstance(stream, np.ndarray):
            a[where] = stream
        elif stream != fill:
            np.copyto(a, np.asarray(stream, dtype), where=where)
        return t

    def copy(self, values: np.ndarray, dtype: Any) -> torch.Tensor:
        if not self.pin:
            return torch.from_numpy(np.ascontiguousarray(values, dtype=dtype))
        a, t = self.new(values.shape, dtype)
        a[...] = values
        return t


def _can_pin() -> bool:
    acc = getattr(torch, "accelerator", None)
    return torch.cuda.is_available() or bool(acc is not None and acc.is_available())


def _per_row(table: pa.Table, alloc: _Alloc, p: np.ndarray, r: np.ndarray) -> dict[str, Any]:
    out = {"prompt_lengths": alloc.copy(p, np.int64), "response_lengths": alloc.copy(r, np.int64)}
    for name, key, dtype in [("reward", "rewards", np.float32), ("is_padding", "is_padding", bool),
                             *[(c, c, np.int64) for c in PER_ROW_INT64]]:
        col = table.column(name)
        if col.null_count:
            isnull = col.is_null().to_numpy(zero_copy_only=False)
            raise BatchFormatError(f"column {name!r} is null in {_rows(isnull)}; it must not be")
        out[key] = alloc.copy(col.to_numpy(), dtype)
    return out


def _padded(alloc: _Alloc, prompt: _Ragged, resp: _Ragged, mask: np.ndarray | float,
            logp: np.ndarray | float, pad: int) -> dict[str, torch.Tensor]:
    p, r = prompt.lengths, resp.lengths
    n = p + r
    B, L, R = len(n), int(n.max(initial=0)), int(r.max(initial=0))
    pos = np.arange(L)
    real = pos < n[:, None]                  # [B, L]
    in_prompt = pos < p[:, None]
    in_resp = real ^ in_prompt               # the prompt is a prefix of the real tokens
    ids, input_ids = alloc.new((B, L), np.int64, pad)
    ids[in_prompt] = prompt.values
    ids[in_resp] = resp.values
    attn, attention_mask = alloc.new((B, L), np.int64)
    np.copyto(attn, real)
    posv, position_ids = alloc.new((B, L), np.int64)
    np.multiply(pos, real, out=posv)
    resp_real = np.arange(R) < r[:, None]    # [B, R]
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": alloc.scatter((B, L), np.int64, in_resp, mask),
        "rollout_log_probs": alloc.scatter((B, L), np.float32, in_resp, logp),
        "responses": alloc.scatter((B, R), np.int64, resp_real, resp.values, pad),
        "responses_mask": alloc.scatter((B, R), np.int64, resp_real, mask),
        "responses_log_probs": alloc.scatter((B, R), np.float32, resp_real, logp),
    }


def _packed(alloc: _Alloc, prompt: _Ragged, resp: _Ragged, mask: np.ndarray | float,
            logp: np.ndarray | float) -> dict[str, torch.Tensor]:
    p, r = prompt.lengths, resp.lengths
    n = p + r
    B, T = len(n), int(n.sum())
    if T >= 2**31:
        raise BatchFormatError(f"{T} tokens do not fit the int32 cu_seqlens of varlen kernels; "
                               "hand the batch over in smaller pieces")
    cu = np.zeros(B + 1, np.int64)
    np.cumsum(n, out=cu[1:])
    # Runs of (prompt, response) per row: a run-length decode, which np.repeat does at memset speed.
    is_prompt = np.repeat(np.tile(np.array([True, False]), B), np.stack([p, r], 1).ravel())
    is_resp = ~is_prompt
    # 1-D buffers: numpy's boolean-mask assignment is several times slower through a [1, T] view.
    ids, input_ids = alloc.new((T,), np.int64)
    ids[is_prompt] = prompt.values
    ids[is_resp] = resp.values
    # Positions: a running count of ones that jumps back to 0 at the start of every non-empty row.
    posv, position_ids = alloc.new((T,), np.int64, 1)
    nonempty = n > 0
    starts, lens = cu[:-1][nonempty], n[nonempty]
    if T:
        posv[starts[0]] = 0
        posv[starts[1:]] = 1 - lens[:-1]
        np.cumsum(posv, out=posv)
    return {
        "input_ids": input_ids[None],
        "position_ids": position_ids[None],
        "response_mask": alloc.scatter((T,), np.int64, is_resp, mask)[None],
        "rollout_log_probs": alloc.scatter((T,), np.float32, is_resp, logp)[None],
        "cu_seqlens": alloc.copy(cu, np.int32),
    }


def batch_to_torch(table: pa.Table, layout: str = "padded", device: Any = None,
                   pin_memory: bool = False, pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """The trainer's tensors for a Batch table (trajectories + provenance); see the module doc.

    Rows keep the table's order. ``device`` (e.g. ``"cuda"``) receives a copy, non-blocking when
    the host tensors are pinned; ``None`` or ``"cpu"`` keeps them on the host.
    """
    if layout not in LAYOUTS:
        raise BatchFormatError(f"layout={layout!r}: use one of {', '.join(LAYOUTS)}")
    missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
    if missing:
        raise BatchFormatError(
            f"the table lacks column(s) {', '.join(missing)}; batch_to_torch needs a Batch table "
            "(schemas.TRAJECTORIES plus schemas.BATCH_PROVENANCE), e.g. ReplayBuffer.sample's")
    if isinstance(pad_token_id, bool) or not isinstance(pad_token_id, (int, np.integer)):
        raise BatchFormatError(f"pad_token_id={pad_token_id!r} must be an int")
    pin = bool(pin_memory)
    if pin and not _can_pin():
        warnings.warn("pin_memory=True but no accelerator is available: returning ordinary "
                      "(pageable) host memory", stacklevel=2)
        pin = False
    alloc = _Alloc(pin)
    prompt, resp = _ragged(table, "prompt_ids"), _ragged(table, "response_ids")
    mask = _response_stream(_ragged(table, "response_mask"), "response_mask", resp.lengths, 1)
    logp = _response_stream(_ragged(table, "rollout_log_probs"), "rollout_log_probs",
                            resp.lengths, 0.0)
    if layout == "padded":
        out = _padded(alloc, prompt, resp, mask, logp, int(pad_token_id))
    else:
        out = _packed(alloc, prompt, resp, mask, logp)
    out.update(_per_row(table, alloc, prompt.lengths, resp.lengths))
    if device is not None and torch.device(device).type != "cpu":
        out = {k: v.to(device, non_blocking=pin) for k, v in out.items()}
    return out
