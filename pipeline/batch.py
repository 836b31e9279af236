"""The Batch handed to the trainer: an Arrow table of whole groups with provenance columns.

The provenance columns (span, staleness, ...) are computed by the declared formulas of
sql/metrics/provenance.sql, compiled for polars; the same frame feeds the off-policy metrics.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl
import pyarrow as pa

from pipeline import declared
from schemas import BATCH_PROVENANCE

PROVENANCE = "provenance"
_SPAN = pl.col("version_spans")
_N_TOKENS = pl.element().struct.field("n_tokens")
_VERSION = pl.element().struct.field("version")


def batch_rows(payload: pa.Table, *, batch_id: int, step: int, group_steps: dict[str, int]
               ) -> pl.DataFrame:
    """The `batch_rows` relation of a batch (what provenance.sql reads), plus its provenance.

    Per-trajectory token counts come straight from the Arrow list offsets; the version-span sums
    only when some row reported spans."""
    meta = pl.from_arrow(payload.select(["partition", "uid", "seq", "min_global_steps",
                                         "max_global_steps", "is_padding", "version_spans"]))
    n_tok = pa.compute.list_value_length(payload.column("response_ids")).cast(pa.int64())
    uids = meta["uid"].to_list()
    frame = meta.with_columns(
        step=pl.lit(step, pl.Int64), batch_id=pl.lit(batch_id, pl.Int64),
        global_steps=pl.Series([group_steps[u] for u in uids], dtype=pl.Int64),
        n_response_tokens=pl.from_arrow(n_tok))
    if payload.column("version_spans").null_count == payload.num_rows:
        frame = frame.with_columns(span_tokens=pl.lit(None, pl.Int64),
                                   span_version_sum=pl.lit(None, pl.Int64),
                                   span_version_min=pl.lit(None, pl.Int64))
    else:
        frame = frame.with_columns(
            span_tokens=_SPAN.list.eval(_N_TOKENS.cast(pl.Int64)).list.sum(),
            span_version_sum=_SPAN.list.eval(_N_TOKENS.cast(pl.Int64) * _VERSION).list.sum(),
            span_version_min=_SPAN.list.eval(_VERSION.filter(_N_TOKENS > 0)).list.min())
        has = _SPAN.is_not_null()
        frame = frame.with_columns(
            pl.when(has).then(pl.col(c)).otherwise(None).alias(c)
            for c in ("span_tokens", "span_version_sum"))
    items = declared.compiled_items(PROVENANCE)
    return frame.with_columns(e.alias(k) for k, e in items.items())


def with_provenance(payload: pa.Table, rows: pl.DataFrame, group_status: dict[str, str]
                    ) -> pa.Table:
    """Append the BATCH_PROVENANCE columns to the payload (``rows`` from `batch_rows`)."""
    n = payload.num_rows
    cols = {
        "batch_id": rows["batch_id"], "step": rows["step"], "global_steps": rows["global_steps"],
        "status": pl.Series([group_status[u] for u in rows["uid"].to_list()], dtype=pl.String),
        "span": rows["span"], "staleness": rows["staleness"],
        "staleness_worst": rows["staleness_worst"], "group_span": rows["group_span"],
        "times_sampled": pl.Series([1] * n, dtype=pl.Int32),
    }
    out = payload
    for f in BATCH_PROVENANCE:
        out = out.append_column(f, cols[f.name].to_arrow().cast(f.type))
    return out


@dataclass
class Batch:
    """Whole groups chosen by `sample`, oldest dispatch first; rows in arrival order.

    ``table`` holds the trajectory payload (schemas.TRAJECTORIES) plus BATCH_PROVENANCE.
    ``metrics`` are the call's eviction metrics and the batch's off-policy metrics (verl's key
    names); ``metric_weights`` merge their means across calls (`StepAggregator.add(batch)`);
    ``filtered_reward_counts`` is the `{value: count}` of the zero-variance groups evicted.
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
        return pl.from_arrow(self.table)

    def to_torch(self, layout: str = "padded", device: Any = None, pin_memory: bool = False,
                 pad_token_id: int = 0) -> dict[str, Any]:
        """Tensors for the trainer (see pipeline/to_torch.py; imports torch lazily)."""
        from pipeline.to_torch import batch_to_torch
        return batch_to_torch(self.table, layout=layout, device=device, pin_memory=pin_memory,
                              pad_token_id=pad_token_id)
