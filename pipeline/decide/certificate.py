"""The staleness certificate of a batch: the bound in force when it was chosen, and per row the
versions that produced it and whether its group lay within that bound.

Why a certificate and not a metric: a mean staleness says how old a batch was on average; a
certificate says, for every row, which bound it was chosen under and whether it kept it, so the
bound a run promised can be checked after the fact. The bound is recorded with each `select`
decision (`decisions.bound`, `decisions.strategy`), so the lake's `certificates` view serves the
same rows from disk, and the audit `certificate_holds` lists every trained row over its bound.

Under per-dataset bounds (``max_off_policy_threshold={"math": 4, "*": 6}``) the bound in force
is each group's own: its dataset's, or the ``"*"`` default for a dataset the mapping does not name
(or none). Each `select` row records that bound, so a math row is held to 4 while a code row of
the same batch is held to 6; the batch's ``bound`` is the loosest of its groups' (what the
`batches` view shows: the largest bound of its selections).

The rows are the provenance formulas (sql/metrics/provenance.sql) over the batch's own table,
and the verdict is the `certified` step of sql/views/certificates.sql compiled for polars: one
text for both engines. Built on first use of `Batch.certificate`, so `sample` pays nothing.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import polars as pl
import pyarrow as pa

from pipeline.decide import compile as declared
from pipeline.decide.batch import batch_rows

if TYPE_CHECKING:
    from pipeline.config import BufferConfig
    from pipeline.decide.batch import Batch

VIEW, STEP = "certificates", "certified"
COLUMNS = ("partition", "step", "batch_id", "uid", "seq", "is_padding", "bound", "strategy",
           "global_steps", "min_global_steps", "max_global_steps", "staleness",
           "staleness_worst", "group_span", "n_response_tokens", "span_tokens",
           "token_staleness_max", "over_bound")
"""The columns of a certificate's rows: those of the `certificates` view, in its order."""


# strategies whose own guarantee lets a trained row lie over the bound, and which rows those are:
# the certificate names them (it states the bound, not the strategy's promise), and the audit
# `replaylake audit` reports them as allowed rather than failing a healthy run on them
OVER_BOUND_ALLOWED = {
    "wait": "finished groups that waited in the buffer longer than the batches took them; the "
            "wait gate holds only groups still generating",
    "mask": "the masked rows, trained with their loss switched off",
}


def bound_in_force(cfg: BufferConfig) -> tuple[int | None, str | None]:
    """The bound a selection on ``cfg``'s partition keeps, and the strategy that sets it.

    ``drop(T)``: the `stale` rule evicts every group over group span T before it can be chosen.
    ``wait(T)``: `sample` returns only once no in-flight group has group span >= T, so a group
    still generating is at most T when it trains. ``mask(T)``: a group over T is trained with its
    loss switched off, so it is over the bound by design and exactly its rows break it (the
    audit lists the masked rows). None on the partition: (None, None)."""
    bound = cfg.bound()
    if bound is not None:
        return bound, cfg.stale.strategy
    if cfg.mask is not None:
        return cfg.mask.threshold, cfg.stale.strategy
    gate = cfg.gate
    if gate is not None:
        return gate.threshold, cfg.stale.strategy
    return None, None


def group_bounds(cfg: BufferConfig, datasets: Mapping[str, str | None]
                 ) -> dict[str, int | None]:
    """The bound in force for each chosen group (uid -> its dataset, ``datasets``): its dataset's
    bound while the `stale` rule judges each group by it (`drop`, `admit`; the default for a
    dataset the mapping does not name), else the one bound of `bound_in_force` for every group."""
    if cfg.bound() is not None:
        bounds = cfg.stale.bounds()
        return {u: bounds.of(d) for u, d in datasets.items()}
    one = bound_in_force(cfg)[0]
    return dict.fromkeys(datasets, one)


@dataclass(frozen=True)
class Certificate:
    """One batch's staleness certificate.

    ``bound``: the largest group span (trainer step - dispatch step + 1) a group of the batch may
    be trained at, None when unbounded (under per-dataset bounds the loosest of its groups'; each
    row's own is its ``bound`` column); ``strategy``: what set it (``drop`` | ``wait`` | ``admit``
    | ``mask``; under ``mask`` the violations are the masked rows).
    ``rows``: one row per trajectory (`COLUMNS`: versions, staleness, group span, tokens covered
    by version spans, ``over_bound``), as the lake's `certificates` view serves them."""

    partition: str
    batch_id: int
    step: int
    bound: int | None
    strategy: str | None
    rows: pa.Table

    @property
    def violations(self) -> pa.Table:
        """The trained (non-padding) rows over the bound: what the audit `certificate_holds`
        returns for this batch."""
        over = pl.from_arrow(self.rows).filter(pl.col("over_bound") & ~pl.col("is_padding"))
        return over.to_arrow()

    @property
    def holds(self) -> bool:
        """Whether every trained row kept the bound (always, when there is none)."""
        return self.violations.num_rows == 0


def of_batch(batch: Batch) -> Certificate:
    """The certificate of ``batch`` from its table (payload + provenance) and recorded bound."""
    table = batch.table
    uids = table.column("uid").to_pylist()
    steps = dict(zip(uids, table.column("global_steps").to_pylist()))
    rows = batch_rows(table, batch_id=batch.batch_id, step=batch.step, group_steps=steps).frame()
    bound = (pl.col("uid").replace_strict(batch.group_bounds, default=batch.bound,
                                          return_dtype=pl.Int64)
             if batch.group_bounds else pl.lit(batch.bound, pl.Int64))
    rows = rows.with_columns(bound=bound, strategy=pl.lit(batch.strategy, pl.String))
    items = declared.compiled_items(VIEW, STEP)
    rows = rows.with_columns(*(e.alias(k) for k, e in items.items())).select(COLUMNS)
    return Certificate(batch.partition, batch.batch_id, batch.step, batch.bound, batch.strategy,
                       rows.to_arrow())
