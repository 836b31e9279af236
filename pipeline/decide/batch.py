"""The Batch handed to the trainer: an Arrow table of whole groups with provenance columns.

The provenance columns (span, staleness, ...) are computed by the declared formulas of
sql/metrics/provenance.sql, compiled for polars; the same frame feeds the off-policy metrics.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.decide import compile as declared
from pipeline.ingest import one_array
from pipeline.state.constants import constant
from schemas import BATCH_PROVENANCE

PROVENANCE = "provenance"
_SPAN = pl.col("version_spans")
_N_TOKENS = pl.element().struct.field("n_tokens")
_VERSION = pl.element().struct.field("version")
_META = ["partition", "uid", "seq", "min_global_steps", "max_global_steps", "is_padding",
         "version_spans"]
# what the frame carries for its readers beyond what the formulas read (a certificate lists each
# row by partition, uid and seq; a batch's own provenance needs none of them)
CARRIED = ("partition", "uid", "seq")
_SPAN_COLUMNS = ["span_tokens", "span_version_sum", "span_version_min"]
# the rows the off-policy metrics keep (that declaration's predicate), computed with the rest
KEPT = "__off_policy_kept"


def batch_rows(payload: pa.Table, *, batch_id: int, step: int,
               group_steps: dict[str, int] | np.ndarray, carry: bool = True) -> pl.DataFrame:
    """The `batch_rows` relation of a batch (what provenance.sql reads), plus its provenance.
    ``group_steps``: each group's dispatch step by uid, or already each row's (an array);
    ``carry=False`` leaves out the row identity (`CARRIED`), which no formula reads.

    Per-trajectory token counts are the stored `n_response_tokens` (or come from the Arrow list
    offsets); the version-span sums only when some row reported spans. Every input column is
    assembled in Arrow and crosses into polars at once, and the declared formulas run in one
    frame evaluation: each eager polars call has a fixed cost whatever its size, and so does
    every column handed over, which is most of a batch's bookkeeping."""
    n = payload.num_rows
    spans_reported = payload.column("version_spans").null_count != n
    take = [c for c in _META if (carry or c not in CARRIED)
            and (spans_reported or c != "version_spans")]
    if isinstance(group_steps, np.ndarray):
        steps = group_steps.astype(np.int64, copy=False)
    else:
        steps = np.fromiter((group_steps[u] for u in payload.column("uid").to_pylist()),
                            dtype=np.int64, count=n)
    ints = {"step": constant(step, n, pa.int64()),
            "batch_id": pa.repeat(pa.scalar(batch_id, pa.int64()), n),   # a new one every batch
            "global_steps": pa.array(steps)}
    names = [*take, *ints, "n_response_tokens"]
    arrays: list = [*(payload.column(c) for c in take), *ints.values(), _response_tokens(payload)]
    if not spans_reported:
        names += _SPAN_COLUMNS
        arrays += [constant(None, n, pa.int64())] * len(_SPAN_COLUMNS)
    # one record batch: polars takes it whole, for about what `from_arrow` of a chunked table
    # pays for each column it converts
    frame = pl.DataFrame(pa.RecordBatch.from_arrays([one_array(a) for a in arrays], names=names))
    if spans_reported:
        has = _SPAN.is_not_null()
        frame = frame.with_columns(
            span_tokens=pl.when(has).then(_SPAN.list.eval(_N_TOKENS.cast(pl.Int64)).list.sum()),
            span_version_sum=pl.when(has).then(
                _SPAN.list.eval(_N_TOKENS.cast(pl.Int128) * _VERSION).list.sum()),
            span_version_min=_SPAN.list.eval(_VERSION.filter(_N_TOKENS > 0)).list.min())
    return frame.with_columns(*declared.compiled_named(PROVENANCE), _kept_column())


def _response_tokens(payload: pa.Table) -> pa.ChunkedArray | pa.Array:
    """Each row's response length: stored at ingest in the lake's trajectories (a batch's payload
    has it), counted from the list offsets of a table without it."""
    if "n_response_tokens" in payload.schema.names:
        return payload.column("n_response_tokens")
    return pc.list_value_length(payload.column("response_ids")).cast(pa.int64())


@cache
def _kept_column() -> pl.Expr:
    """The off-policy declaration's predicate, as the column `KEPT`."""
    return declared.compiled_predicate("off_policy").alias(KEPT)


def with_provenance(payload: pa.Table, rows: pl.DataFrame, status: pa.Array,
                    stale: np.ndarray | None = None) -> pa.Table:
    """Append the BATCH_PROVENANCE columns to the payload (``rows`` from `batch_rows`):
    ``status``, each row's group status; ``stale``, whether each row's group is masked stale
    (`StaleMask`; None: none is), which becomes ``is_stale``."""
    n = payload.num_rows
    made = {"status": status, "times_sampled": constant(1, n, pa.int32()),
            "is_stale": constant(False, n, pa.bool_()) if stale is None else pa.array(stale)}
    extra = [made[f.name] if f.name in made else _as(rows.get_column(f.name).to_arrow(), f.type)
             for f in BATCH_PROVENANCE]
    return pa.Table.from_arrays([*payload.columns, *extra],
                                schema=pa.schema([*payload.schema, *BATCH_PROVENANCE],
                                                 metadata=payload.schema.metadata))


def per_row(values: list[Any], owner: np.ndarray, typ: pa.DataType) -> pa.Array:
    """A value per group spread to the rows (``owner``: each row's group position); one value
    shared by every group (the usual status) is a remembered filled column."""
    if values and values.count(values[0]) == len(values) and values[0] is not None:
        return constant(values[0], len(owner), typ)
    return pa.array(values, typ).take(pa.array(owner))


def _as(array: pa.Array, typ: pa.DataType) -> pa.Array:
    """``array`` as ``typ``; most columns already are (a no-op cast is not free)."""
    return array if array.type == typ else array.cast(typ)


@dataclass
class Batch:
    """Whole groups chosen by `sample`, oldest dispatch first; rows in arrival order.

    ``table`` holds the trajectory payload (schemas.TRAJECTORIES) plus BATCH_PROVENANCE.
    ``metrics`` are the call's eviction metrics and the batch's off-policy metrics (verl's key
    names); ``metric_weights`` merge their means across calls (`StepAggregator.add(batch)`);
    ``filtered_reward_counts`` is the `{value: count}` of the zero-variance groups evicted;
    ``bound`` / ``strategy``: the staleness bound in force at the selection (recorded with it in
    the lake; ``certificate`` checks every row against it); ``group_bounds``: each group's own
    (uid -> bound), which differs from ``bound`` only under per-dataset bounds, where ``bound``
    is the loosest of them.
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
    bound: int | None = None          # the staleness bound it was chosen under (group span)
    strategy: str | None = None       # what set the bound: drop | wait | admit | mask
    masked: list[str] = field(default_factory=list)   # mask: the groups trained loss-masked
    group_bounds: dict[str, int | None] = field(default_factory=dict)   # uid -> its own bound

    @property
    def certificate(self) -> Any:
        """The batch's staleness certificate (`pipeline.decide.certificate.Certificate`): the
        bound in force, per row the versions that produced it, ``holds`` / ``violations``."""
        from pipeline.decide.certificate import of_batch
        return of_batch(self)

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
                 pad_token_id: int = 0, pool: Any = None, token_versions: bool = False,
                 require_log_probs_when_stale: bool = False) -> dict[str, Any]:
        """Tensors for the trainer (see pipeline/to_torch/convert.py; imports torch lazily). ``pool``: a
        ``TensorPool`` whose reused buffers receive the token tensors (give them back with
        ``pool.give_back`` when the step is done). ``token_versions=True`` adds the weight
        version and staleness of every response token; ``require_log_probs_when_stale=True``
        refuses stale rows without ``rollout_log_probs``, naming them."""
        from pipeline.to_torch import batch_to_torch
        return batch_to_torch(self.table, layout=layout, device=device, pin_memory=pin_memory,
                              pad_token_id=pad_token_id, pool=pool,
                              token_versions=token_versions,
                              require_log_probs_when_stale=require_log_probs_when_stale)
