"""The loss mask: ``response_mask`` with the rows a `mask` selection marked stale zeroed.

Under ``max_off_policy_strategy="mask"`` a group over the staleness bound stays in the batch
(nothing is re-generated) and its rows carry ``is_stale`` (schemas.BATCH_PROVENANCE); a trainer
that multiplies its per-token loss by ``loss_mask`` trains them with their loss switched off,
while they still count in the group's reward statistics. Under every other strategy no row is
stale and ``loss_mask`` equals ``response_mask`` (a copy: writing one never changes the other).
A table without the column (an export written before it) has no stale row.

Names: ``loss_mask`` is aligned like ``response_mask`` ([B, L] padded, [1, T] packed);
``responses_loss_mask`` like ``responses_mask`` ([B, R], padded only).
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch

from pipeline.to_torch.pool import TensorPool, output
from pipeline.to_torch.ragged import BatchFormatError, describe_rows

COLUMN = "is_stale"
NAMES = {"response_mask": "loss_mask", "responses_mask": "responses_loss_mask"}


def stale_rows(table: pa.Table) -> np.ndarray:
    """The indices of the rows marked ``is_stale`` (none when the table lacks the column)."""
    if COLUMN not in table.column_names:
        return np.zeros(0, np.int64)
    col = table.column(COLUMN)
    if col.null_count:
        isnull = col.is_null().to_numpy(zero_copy_only=False)
        raise BatchFormatError(f"column {COLUMN!r} is null in {describe_rows(isnull)}; it must "
                               "not be (false: the row is trained)")
    return np.flatnonzero(col.to_numpy(zero_copy_only=False))


def build(table: pa.Table, out: dict[str, torch.Tensor], pin: bool,
          pool: TensorPool | None = None) -> dict[str, torch.Tensor]:
    """The loss masks for the token tensors ``out`` of ``table`` (see the module docstring),
    in ``pool``'s reused buffers when given; a packed ``out`` is told by its ``cu_seqlens``."""
    rows = stale_rows(table)
    cu = out.get("cu_seqlens")
    made: dict[str, torch.Tensor] = {}
    for src, name in NAMES.items():
        if src not in out:
            continue
        mask = output(tuple(out[src].shape), out[src].numpy().dtype, pin, False, pool)
        mask.copy_(out[src])
        if len(rows) and cu is None:
            mask[torch.from_numpy(rows)] = 0
        elif len(rows):
            bounds = cu.numpy()
            for i in rows.tolist():
                mask[0, bounds[i]:bounds[i + 1]] = 0
        made[name] = mask
    return made
