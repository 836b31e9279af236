"""Batch table -> torch tensors for the trainer, built straight from the Arrow buffers.

The only core module that imports torch. Every tensor is written once from the list offsets and
value buffers of the Arrow columns (no Python list of tokens), into numpy views of the output
tensors (wrapped by ``torch.from_numpy`` without a copy). Two ways to write a token stream (all
prompt tokens, or all response tokens, one row after another):

- long rows (the usual RL batch): one ``np.concatenate(..., out=)`` per tensor over per-row views
  -- each row's values, then its padding taken from a small constant template -- so every output
  byte is written exactly once, in order, with no zero-fill pass and no mask (for long rows about
  half to a third of the time boolean masks take); the packed
  layout of a batch without null lists takes pipeline/to_torch/packed.py (fewer calls per batch),
  anything else pipeline/to_torch/rows.py; both hand each tensor to one call of a compiled
  extension instead, where it is built (pipeline/to_torch/runs.py: same bytes, no per-row
  Python);
- short rows (below ``ROW_COPY_MIN_TOKENS`` tokens per row on average, where what a view costs
  in Python exceeds a mask pass): zeroed outputs and boolean masks built from the lengths
  (pipeline/to_torch/masks.py).

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
    loss_mask          [B, L] int64    response_mask with the rows marked `is_stale` zeroed
                                       (max_off_policy_strategy="mask"; else equal to it)
    responses_loss_mask [B, R] int64   the same in the responses layout
``packed`` -- the rows concatenated without padding, as varlen attention kernels (and HF's
flattening collator) take them; ``[1, T]`` so a model sees one sequence of T tokens, and
``.squeeze(0)`` gives the ``[T]`` view flash-attention's varlen functions take:
    input_ids [1, T] int64, position_ids [1, T] int64 (restart at 0 for every row),
    response_mask [1, T] int64, loss_mask [1, T] int64, rollout_log_probs [1, T] float32,
    cu_seqlens [B + 1] int32 (row i is tokens cu_seqlens[i]:cu_seqlens[i+1]).
    No attention_mask: an all-ones mask would make a model attend across rows.
per row (both layouts):
    prompt_lengths, response_lengths [B] int64; rewards [B] float32 (from the float64 reward);
    global_steps, min_global_steps, max_global_steps, staleness [B] int64; is_padding [B] bool.
with ``token_versions=True`` (pipeline/to_torch/versions.py; 0 off the response):
    token_versions, token_staleness     int64, [B, L] padded / [1, T] packed, aligned like
                                        response_mask
    responses_token_versions, responses_token_staleness  [B, R] int64 (padded only)

Null payload columns (the lake's conventions): a null ``response_mask`` means every response
token is trained on (all ones); a null ``rollout_log_probs`` means unknown and becomes 0.0 -- a
trainer that needs them must recompute them (verl does when ``rollout_log_probs`` is absent).

``pin_memory=True`` allocates every output in page-locked host memory (written in place, no
extra copy) so the copy to ``device`` can be ``non_blocking`` (torch's caching host allocator
keeps a pinned block alive until the copies reading it finish). Without an accelerator there is
nothing to pin for: like torch's DataLoader, we warn and return ordinary memory.
``pool=TensorPool()`` writes the token tensors into buffers reused across calls (no fresh pages
to fault in; see pipeline/to_torch/pool.py).
"""
from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from pipeline.to_torch import loss_mask as to_torch_loss_mask
from pipeline.to_torch import masks as to_torch_masks
from pipeline.to_torch import packed as to_torch_packed
from pipeline.to_torch import rows as to_torch_rows
from pipeline.to_torch import versions as to_torch_versions
from pipeline.to_torch.pool import TensorPool, output
from pipeline.to_torch.ragged import (
    BatchFormatError,
    Pieces,
    Ragged,
    describe_rows,
    merged,
    read_ragged,
    response_stream,
)

LAYOUTS = ("padded", "packed")
PER_ROW_INT64 = ("global_steps", "min_global_steps", "max_global_steps", "staleness")
LIST_COLUMNS = ("prompt_ids", "response_ids", "response_mask", "rollout_log_probs")
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
REQUIRED_COLUMNS = (*LIST_COLUMNS, "reward", *PER_ROW_INT64, "is_padding")


class _Outputs:
    """The large output tensors of one call (`pool.output` allocates each), with numpy views to
    fill them through.

    ``zeroed``: the mask path writes only the real tokens and needs zeros elsewhere; the row-copy
    path writes every byte itself, so it takes uninitialised memory (no fill pass).
    Each tensor owns its memory (pinned when asked): torch.save, sharing and freeing work per
    tensor as users expect. (One shared buffer for all of them faults fewer pages, and is
    faster, but torch.save refuses tensors viewing one buffer as different dtypes.)
    """

    def __init__(self, specs: dict[str, tuple[tuple[int, ...], Any]], pin: bool,
                 zeroed: bool = True, pool: TensorPool | None = None):
        self.tensors: dict[str, torch.Tensor] = {}
        self.arrays: dict[str, np.ndarray] = {}
        for name, (shape, dtype) in specs.items():
            t = output(shape, dtype, pin, zeroed, pool)
            self.tensors[name], self.arrays[name] = t, t.numpy()


def _small(values: np.ndarray, dtype: Any, pin: bool) -> torch.Tensor:
    """A writable copy of a per-row array (Arrow's zero-copy numpy views are read-only)."""
    t = torch.from_numpy(np.array(values, dtype=dtype))
    return t.pin_memory() if pin else t


def _can_pin() -> bool:
    acc = getattr(torch, "accelerator", None)
    return torch.cuda.is_available() or bool(acc is not None and acc.is_available())


def _per_row(table: pa.Table, pin: bool, p: np.ndarray, r: np.ndarray) -> dict[str, Any]:
    out = {"prompt_lengths": _small(p, np.int64, pin), "response_lengths": _small(r, np.int64, pin)}
    for name, key, dtype in [("reward", "rewards", np.float32), ("is_padding", "is_padding", bool),
                             *[(c, c, np.int64) for c in PER_ROW_INT64]]:
        col = table.column(name)
        if col.null_count:
            isnull = col.is_null().to_numpy(zero_copy_only=False)
            why = (" (a reward not known: its producer sent none, or the verl adapter's "
                   "`decisions` mode, which reads no rewards, took it in; verl's trainer reads "
                   "rewards from TransferQueue)") if name == "reward" else ""
            raise BatchFormatError(f"column {name!r} is null in {describe_rows(isnull)}; "
                                   f"it must not be{why}")
        values = col.to_numpy()
        if dtype is np.float32:
            _fits_float32(name, values)
        out[key] = _small(values, dtype, pin)
    return out


_PACKAGE = str(Path(__file__).resolve().parents[1])


def _callers_level() -> int:
    """The ``stacklevel`` of the first frame outside this package, for a warning raised in the
    function that calls this one: the line of the user's code (`Batch.to_torch` or
    `batch_to_torch`), not one of ours."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


def _fits_float32(name: str, values: np.ndarray) -> None:
    """A finite value beyond float32's range would become inf in the float32 tensor: refused,
    naming the rows (an inf or NaN stored as such is passed on as it is)."""
    with np.errstate(over="ignore"):
        over = np.isinf(values.astype(np.float32)) & np.isfinite(values)
    if over.any():
        raise BatchFormatError(
            f"column {name!r} is beyond float32's range (|x| > 3.4e38) in {describe_rows(over)}; "
            "its tensor is float32, where such a value becomes inf: scale the values down")


def _padded(pin: bool, prompt: Ragged, resp: Ragged, mask: Pieces | float,
            logp: Pieces | float, pad: int, row_copy: bool,
            pool: TensorPool | None) -> dict[str, torch.Tensor]:
    p, r = prompt.lengths, resp.lengths
    n = p + r
    B, L, R = len(n), int(n.max(initial=0)), int(r.max(initial=0))
    i64, f32 = np.int64, np.float32
    outs = _Outputs({"input_ids": ((B, L), i64), "attention_mask": ((B, L), i64),
                     "position_ids": ((B, L), i64), "response_mask": ((B, L), i64),
                     "rollout_log_probs": ((B, L), f32), "responses": ((B, R), i64),
                     "responses_mask": ((B, R), i64), "responses_log_probs": ((B, R), f32)}, pin,
                    zeroed=not row_copy, pool=pool)
    out = outs.arrays
    if row_copy:
        to_torch_rows.write_padded(out, p, r, prompt.pieces, resp.pieces, mask, logp, pad)
    else:
        to_torch_masks.write_padded(out, p, r, prompt.pieces, resp.pieces, mask, logp, pad)
    return outs.tensors


def _packed(pin: bool, p: np.ndarray, r: np.ndarray, row_copy: bool,
            write: Callable[[dict[str, np.ndarray], np.ndarray, np.ndarray], None],
            pool: TensorPool | None) -> dict[str, torch.Tensor]:
    """The packed tensors; ``write(arrays, n, cu)`` fills the token ones (row lengths ``n``,
    their offsets ``cu``)."""
    n = p + r
    B, T = len(n), int(n.sum())
    if T >= 2**31:
        raise BatchFormatError(f"{T} tokens do not fit the int32 cu_seqlens of varlen kernels; "
                               "hand the batch over in smaller pieces")
    cu = np.zeros(B + 1, np.int64)
    np.cumsum(n, out=cu[1:])
    # 1-D buffers: numpy's boolean-mask assignment is several times slower through a [1, T] view.
    outs = _Outputs({"input_ids": ((T,), np.int64), "position_ids": ((T,), np.int64),
                     "response_mask": ((T,), np.int64), "rollout_log_probs": ((T,), np.float32)},
                    pin, zeroed=not row_copy, pool=pool)
    out = outs.arrays
    tensors = {k: v[None] for k, v in outs.tensors.items()}
    tensors["cu_seqlens"] = _small(cu, np.int32, pin)
    write(out, n, cu)
    return tensors


def _refuse_dropped_payload(table: pa.Table) -> None:
    """Refuse rows without the token payload their response length says they had (`replaylake
    retain` dropped it, or the producer sent the length alone): they would turn into empty
    tensors where the rows say there were tokens."""
    if "n_response_tokens" not in table.column_names or table.num_rows == 0:
        return
    from pipeline.lake import dropped_payload
    dropped = np.asarray(dropped_payload(table, tokenless=False))
    if dropped.any():
        raise BatchFormatError(
            f"column 'response_ids': in {describe_rows(dropped)} it holds fewer tokens than "
            "n_response_tokens says, so they cannot be converted: their token payload is not "
            "here. Either it was never sent (the producer sent the response length alone: the "
            "verl adapter does so unless mirror_fields='full', as verl's trainer reads the tokens "
            "from TransferQueue), or `replaylake retain` dropped it (rows read back from a lake "
            "past its retention horizon); convert rows that hold their tokens")


def batch_to_torch(table: pa.Table, layout: str = "padded", device: Any = None,
                   pin_memory: bool = False, pad_token_id: int = 0,
                   pool: TensorPool | None = None, token_versions: bool = False,
                   require_log_probs_when_stale: bool = False) -> dict[str, torch.Tensor]:
    """The trainer's tensors for a Batch table (trajectories + provenance); see the module doc.

    Rows keep the table's order. ``device`` (e.g. ``"cuda"``) receives a copy, non-blocking when
    the host tensors are pinned; ``None`` or ``"cpu"`` keeps them on the host; a device torch
    cannot use here (no such device, or none of its kind) is refused before any work. ``pool``:
    write the token tensors into a ``TensorPool``'s reused buffers (see pipeline/to_torch/pool.py);
    host tensors then go back with ``pool.give_back``, staging ones for a device go back by
    themselves (also when the copy fails).
    ``token_versions=True`` adds ``token_versions`` / ``token_staleness`` (int64, aligned like
    ``response_mask``; ``responses_token_versions`` / ``responses_token_staleness`` [B, R] in the
    padded layout): the weight version behind every response token and its staleness (see
    pipeline/to_torch/versions.py). ``require_log_probs_when_stale=True`` refuses a batch whose
    rows hold tokens older than the trainer's weights without ``rollout_log_probs``, naming them.
    """
    if layout not in LAYOUTS:
        raise BatchFormatError(f"layout={layout!r}: use one of {', '.join(LAYOUTS)}")
    names = set(table.column_names)
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing:
        raise BatchFormatError(
            f"the table lacks column(s) {', '.join(missing)}; batch_to_torch needs a Batch table "
            "(schemas.TRAJECTORIES plus schemas.BATCH_PROVENANCE), e.g. ReplayBuffer.sample's")
    _check_pad_token_id(pad_token_id)
    if pool is not None and not isinstance(pool, TensorPool):
        raise BatchFormatError(f"pool={pool!r} must be a TensorPool or None")
    target = _target_device(device)
    _refuse_dropped_payload(table)
    if require_log_probs_when_stale:
        to_torch_versions.refuse_stale_without_log_probs(
            table, _lengths(table, "response_ids"))
    pin = bool(pin_memory)
    if pin and not _can_pin():
        warnings.warn("pin_memory=True but no accelerator is available: returning ordinary "
                      "(pageable) host memory", stacklevel=_callers_level())
        pin = False
    plain = to_torch_packed.read(table) if layout == "packed" else None
    if plain is not None:             # the common batch, read straight from its buffers
        n = plain.p + plain.r
        if to_torch_rows.use_row_copy(layout, table.num_rows, int(n.sum()), int(n.max())):
            return _finish(table, pin, target, pool, plain.p, plain.r, partial(
                _packed, pin, plain.p, plain.r, True,
                lambda out, n, _: to_torch_packed.write(out, plain, n), pool),
                layout if token_versions else None)
    prompt, resp = read_ragged(table, "prompt_ids", 0), read_ragged(table, "response_ids", 0)
    n = prompt.lengths + resp.lengths     # the writer follows from the row lengths alone
    row_copy = to_torch_rows.use_row_copy(layout, table.num_rows, int(n.sum()),
                                          int(n.max(initial=0)))
    merge = 0 if row_copy else None     # the row-copy writer takes chunks as they are
    prompt, resp = merged(prompt, merge), merged(resp, merge)
    mask = response_stream(read_ragged(table, "response_mask", merge), "response_mask",
                            resp.lengths, 1)
    logp = response_stream(read_ragged(table, "rollout_log_probs", merge), "rollout_log_probs",
                            resp.lengths, 0.0)
    if layout == "padded":
        build = partial(_padded, pin, prompt, resp, mask, logp, int(pad_token_id), row_copy, pool)
    else:
        p, r = prompt.lengths, resp.lengths
        if row_copy:
            def write(out: dict[str, np.ndarray], n: np.ndarray, cu: np.ndarray) -> None:
                to_torch_rows.write_packed(out, p, r, prompt.pieces, resp.pieces, mask, logp)
        else:
            def write(out: dict[str, np.ndarray], n: np.ndarray, cu: np.ndarray) -> None:
                to_torch_masks.write_packed(out, p, r, cu, prompt.pieces, resp.pieces, mask,
                                            logp)
        build = partial(_packed, pin, p, r, row_copy, write, pool)
    return _finish(table, pin, target, pool, prompt.lengths, resp.lengths, build,
                   layout if token_versions else None)


def _check_pad_token_id(pad_token_id: Any) -> None:
    """``pad_token_id`` must be an int the int64 token tensors can hold (checked in both layouts,
    though only the padded one writes it)."""
    if isinstance(pad_token_id, bool) or not isinstance(pad_token_id, (int, np.integer)):
        raise BatchFormatError(f"pad_token_id={pad_token_id!r} must be an int")
    if not INT64_MIN <= int(pad_token_id) <= INT64_MAX:
        raise BatchFormatError(f"pad_token_id={pad_token_id!r} does not fit the int64 token "
                               "tensors; give your tokenizer's pad token id (an int in "
                               "[-2**63, 2**63 - 1])")


def _target_device(device: Any) -> torch.device | None:
    """The device the tensors are copied to (None: they stay on the host), refused before any
    work when torch cannot use it here. The check is torch's device module (``torch.cuda``, ...):
    ``is_available()`` and ``device_count()``; a device type without one is not checked."""
    if device is None:
        return None
    try:
        target = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise BatchFormatError(f"device={device!r} is not a device torch can use here ({exc}); "
                               "pass e.g. 'cuda', 'cuda:1', or None to keep the tensors on the "
                               "host") from None
    if target.type == "cpu":
        return None
    try:
        module = torch.get_device_module(target)
    except RuntimeError:                  # no device module (e.g. meta): nothing cheap to ask
        return target
    is_available = getattr(module, "is_available", None)
    if callable(is_available) and not is_available():
        raise BatchFormatError(f"device={device!r}: torch has no usable {target.type} device "
                               f"here ({module.__name__}.is_available() is False); pass "
                               "device=None to keep the tensors on the host")
    count = getattr(module, "device_count", None)
    if target.index is not None and callable(count) and target.index >= count():
        raise BatchFormatError(f"device={device!r}: torch sees {count()} {target.type} "
                               f"device(s) here, numbered from 0")
    return target


def _lengths(table: pa.Table, name: str) -> np.ndarray:
    """Each row's list length (0 for a null row), int64."""
    return read_ragged(table, name, 0).lengths


def _token_versions(table: pa.Table, layout: str, pin: bool, pool: TensorPool | None,
                    p: np.ndarray, r: np.ndarray) -> dict[str, torch.Tensor]:
    """The per-token version and staleness tensors of ``layout`` (pipeline/to_torch/versions.py):
    fresh arrays as numpy builds them, copied into pinned or pooled buffers when asked for."""
    built = to_torch_versions.build(table, layout, p, r)
    if pin or pool is not None:
        outs = _Outputs({k: (a.shape, a.dtype) for k, a in built.items()}, pin, zeroed=False,
                        pool=pool)
        for k, a in built.items():
            np.copyto(outs.arrays[k], a)
        tensors = outs.tensors
    else:
        tensors = {k: torch.from_numpy(a) for k, a in built.items()}
    return tensors if layout == "padded" else {k: v[None] for k, v in tensors.items()}


def _finish(table: pa.Table, pin: bool, device: torch.device | None, pool: TensorPool | None,
            p: np.ndarray, r: np.ndarray, build: Callable[[], dict[str, torch.Tensor]],
            versions_layout: str | None = None) -> dict[str, torch.Tensor]:
    """``build()``'s tensors and the per-row ones (and the token versions of
    ``versions_layout``, if given), lent from ``pool``, copied to ``device`` (None: the host)."""
    try:
        out = build()
        out.update(to_torch_loss_mask.build(table, out, pin, pool))
        per_row = _per_row(table, pin, p, r)        # checks the per-row columns first
        if versions_layout is not None:
            out.update(_token_versions(table, versions_layout, pin, pool, p, r))
        out.update(per_row)
    except BaseException:
        if pool is not None:
            pool.abandon()
        raise
    if pool is not None:
        pool.lend(out)
    return out if device is None else _to_device(out, device, pin, pool)


def _to_device(host: dict[str, torch.Tensor], device: torch.device, pin: bool,
               pool: TensorPool | None) -> dict[str, torch.Tensor]:
    """Copies of ``host`` on ``device``. Pooled host tensors are only staging: they go back to
    ``pool`` here, also when a copy fails (out of memory, a device error), once the copies that
    did start no longer read them."""
    try:
        out = {k: v.to(device, non_blocking=pin) for k, v in host.items()}
        ready = _copies_done(device, pin) if pool is not None else None
    except BaseException:
        if pool is not None:
            _wait_for_started_copies(device, pin)
            pool.give_back(host)
        raise
    if pool is not None:
        pool.give_back(host, ready=ready)
    return out


def _copies_done(device: torch.device, pin: bool) -> Any:
    """Something whose ``synchronize()`` returns once the copies to ``device`` have read their
    host tensors (None when they already have: pageable copies return after reading them)."""
    if not pin:
        return None
    if device.type == "cuda":
        event = torch.cuda.Event()
        event.record()
        return event
    torch.accelerator.synchronize(device)
    return None


def _wait_for_started_copies(device: torch.device, pin: bool) -> None:
    """After a copy to ``device`` failed: wait until the non-blocking copies that did start have
    read their host tensors (pageable copies return after reading them). A device that cannot
    synchronize (never usable, or failed) runs none of them any more; the copy's own error is the
    one to report."""
    if not pin:
        return
    try:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        else:
            torch.accelerator.synchronize(device)
    except Exception:
        pass
