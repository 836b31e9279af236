"""The Batch handed to the trainer: an Arrow table of whole groups with provenance columns."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from schemas import BATCH_PROVENANCE


def with_provenance(payload: pa.Table, *, batch_id: int, step: int,
                    group_steps: dict[str, int], group_status: dict[str, str]) -> pa.Table:
    """Append the BATCH_PROVENANCE columns (span, staleness at `step`, batch id, ...) to rows."""
    n = payload.num_rows
    uids = payload.column("uid").to_pylist()
    gs = np.fromiter((group_steps[u] for u in uids), dtype=np.int64, count=n)
    mn = payload.column("min_global_steps").to_numpy()
    mx = payload.column("max_global_steps").to_numpy()
    cols = {
        "batch_id": np.full(n, batch_id, dtype=np.int64),
        "step": np.full(n, step, dtype=np.int64),
        "global_steps": gs,
        "status": [group_status[u] for u in uids],
        "span": mx - mn + 1,
        "staleness": (step - 1) - mx,
        "staleness_worst": (step - 1) - mn,
        "group_span": step - gs + 1,
        "times_sampled": np.ones(n, dtype=np.int32),
    }
    out = payload
    for f in BATCH_PROVENANCE:
        out = out.append_column(f, pa.array(cols[f.name], type=f.type))
    return out


@dataclass
class Batch:
    """Whole groups chosen by `sample`, oldest dispatch first; rows in arrival order.

    ``table`` holds the trajectory payload (schemas.TRAJECTORIES) plus BATCH_PROVENANCE.
    ``metrics`` are the call's eviction metrics (SPEC §6.1) and the batch's off-policy metrics
    (§6.2); ``filtered_reward_counts`` is the `{value: count}` dict of zero-variance groups.
    """

    table: pa.Table
    batch_id: int
    step: int
    partition: str
    uids: list[str]
    eviction_metrics: dict[str, float] = field(default_factory=dict)
    off_policy_metrics: dict[str, float] = field(default_factory=dict)
    metric_weights: dict[str, float] = field(default_factory=dict)
    filtered_reward_counts: dict[float, int] = field(default_factory=dict)

    @property
    def metrics(self) -> dict[str, float]:
        return {**self.eviction_metrics, **self.off_policy_metrics}

    @property
    def num_groups(self) -> int:
        return len(self.uids)

    def __len__(self) -> int:
        return self.table.num_rows

    def to_polars(self) -> Any:
        import polars as pl
        return pl.from_arrow(self.table)

    def to_torch(self, layout: str = "padded", device: Any = None, pin_memory: bool = False,
                 pad_token_id: int = 0) -> dict[str, Any]:
        """Tensors for the trainer (SPEC §7); see pipeline/to_torch.py (imports torch lazily)."""
        from pipeline.to_torch import batch_to_torch
        return batch_to_torch(self.table, layout=layout, device=device, pin_memory=pin_memory,
                              pad_token_id=pad_token_id)
