"""Group aggregates, computed live from their one declaration (sql/aggregates/group_aggregates.sql).

A candidate row is completed from declarations the lake runs too: a group without trajectories
takes the empty aggregates of the `candidates` view (its `final` items over a group the
aggregates left out), and a group's status is the `effective_status` of the `groups` view (a
finished group without trajectories counts as a failure), both compiled from those files.

The first poll after groups turned terminal runs the declared aggregates once over the
per-trajectory inputs (schemas.GROUP_TRAJECTORIES) of all of them: one evaluation per poll, and one
for everything a restore brought back, never per group and never over the token payload. The
aggregates are compiled for numpy (`pipeline.decide.vectors`), as a batch's metrics are. Those inputs
are gathered then, from the stored chunks' small columns, rather than built at every `put`: a
put then only stores a reference, and nothing beside the payload is kept in memory.
"""
from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.decide import compile as declared
from pipeline.decide import vectors
from pipeline.ingest import metric_values, one_array
from schemas import CANDIDATES
from sql.loader import SqlError

if TYPE_CHECKING:
    from pipeline.decide.policies.order import SelectionOrder
    from pipeline.state import PartitionState

QUERY = "group_aggregates"
# where the effective status is declared (a step of the groups view) and what it may read
STATUS = ("groups", "status_words", "effective_status")
_STATUS_INPUTS = {"last_event": pl.String, "n_traj": pl.Int64}


@cache
def empty_aggregates() -> tuple:
    """The aggregates of a group without trajectories, in `group_aggregates` order: the
    `candidates` view's final items evaluated with every aggregate null (no aggregates row)."""
    names = list(vectors.compiled_items(QUERY))     # the numpy compile the poll uses (cached)
    items = declared.compiled_items("candidates", "final")
    missing = [n for n in names if n not in items]
    if missing:
        raise SqlError(f"candidates: its final step lacks `<expression> as <name>` items for "
                       f"the aggregates {', '.join(missing)}")
    nulls = pl.DataFrame({n: [None] for n in names})
    return nulls.select(items[n].alias(n) for n in names).row(0)


@cache
def _status_expr() -> pl.Expr:
    query, step, column = STATUS
    expr = declared.compiled_items(query, step)[column]
    reads = set(expr.meta.root_names())
    if not reads <= set(_STATUS_INPUTS):
        raise SqlError(f"{query}: {column} of step {step} may read only "
                       f"{', '.join(_STATUS_INPUTS)}, it reads {', '.join(sorted(reads))}")
    return expr


@cache
def effective_status(status: str, n_traj: int) -> str:
    """The declared effective status of a group whose last status is ``status`` (finished or
    failure) with ``n_traj`` trajectories. It reads nothing else, so each pair is evaluated once
    per process (~100 us) and remembered: a poll pays a dict lookup per group."""
    frame = pl.DataFrame({"last_event": [status], "n_traj": [n_traj]}, schema=_STATUS_INPUTS)
    return frame.select(_status_expr()).item()


def _values(chunk: pa.Table, name: str, local: np.ndarray) -> np.ndarray:
    """A non-null numeric column of a stored chunk at ``local`` rows (zero-copy view, then index)."""
    return one_array(chunk.column(name)).to_numpy(zero_copy_only=False)[local]


def _response_tokens(chunk: pa.Table, local: np.ndarray) -> np.ndarray:
    if "n_response_tokens" in chunk.schema.names:   # stored at ingest
        return _values(chunk, "n_response_tokens", local)
    lengths = pc.list_value_length(chunk.column("response_ids").take(pa.array(local)))
    return lengths.to_numpy().astype(np.int64)


def _metric(chunk: pa.Table, local: np.ndarray, metric: str) -> pa.Array:
    """The filter metric of a stored chunk's ``local`` rows (a reward without nulls is read as a
    numpy view, as the integer columns are)."""
    if metric == "reward" and chunk.column("reward").null_count == 0:
        return pa.array(_values(chunk, "reward", local))
    picked = chunk.select(["reward", "reward_info"]).take(pa.array(local))
    return metric_values(picked, metric).cast(pa.float64())


def meta_columns(part: PartitionState, uids: list[str]
                 ) -> tuple[dict[str, vectors.Col], np.ndarray] | None:
    """The columns of GROUP_TRAJECTORIES the aggregates read, for the stored trajectories of
    ``uids`` (None when none), and each row's group: its position in ``uids``. The aggregation
    groups by that one integer, as (partition, uid) would within one partition, and needs
    neither the partition nor the uid of every row."""
    ids: list[int] = []
    owners: list[int] = []
    for k, u in enumerate(uids):
        rows = part.groups[u].rows
        ids.extend(rows)
        owners.extend([k] * len(rows))
    if not ids:
        return None
    id_arr = np.asarray(ids, dtype=np.int64)
    owner = np.asarray(owners, dtype=np.int64)[np.argsort(id_arr, kind="stable")]
    metric: list[pa.Array] = []
    tokens, lo, hi = [], [], []
    for chunk, local in part.rows.chunks(id_arr):     # ascending ids, as `owner` now is
        if part.filter_metric is not None:
            metric.append(_metric(chunk, local, part.filter_metric))
        tokens.append(_response_tokens(chunk, local))
        lo.append(_values(chunk, "min_global_steps", local))
        hi.append(_values(chunk, "max_global_steps", local))
    n = len(owner)
    cols = {"metric": vectors.column(pa.concat_arrays(metric)) if metric else
            vectors.nulls(n, vectors.DOUBLE),
            "n_response_tokens": vectors.of(np.concatenate(tokens).astype(np.int64, copy=False)),
            "min_global_steps": vectors.of(np.concatenate(lo).astype(np.int64, copy=False)),
            "max_global_steps": vectors.of(np.concatenate(hi).astype(np.int64, copy=False))}
    return cols, owner


@cache
def _reads_checked() -> None:
    """The aggregates read only what `meta_columns` hands them (checked once per process)."""
    reads = {n for c in vectors.compiled_items(QUERY).values() for n in c.reads}
    extra = reads - {"metric", "n_response_tokens", "min_global_steps", "max_global_steps"}
    if extra:
        raise SqlError(f"{QUERY}: the live aggregates read {', '.join(sorted(extra))}, which "
                       "pipeline.decide.aggregates.meta_columns does not gather; add them there")


def complete(part: PartitionState) -> None:
    """Compute the candidate rows of every group awaiting them, in one evaluation (the declared
    aggregates compiled for numpy: a poll's few dozen groups cost polars' fixed cost per
    expression several times over)."""
    unaggregated = part.candidates.unaggregated
    if not unaggregated:
        return
    _reads_checked()
    uids = list(unaggregated)
    meta = meta_columns(part, uids)
    names = list(vectors.compiled_items(QUERY))
    agg: dict[str, tuple] = {}
    order = part.candidates.order
    # a declared order whose key reads only aggregates is keyed from them (in the candidate
    # columns' types, as the index would key them)
    keyed = order is not None and set(order.reads) <= set(names)
    if meta is not None:
        cols, owner = meta
        present = np.unique(owner)          # the groups with trajectories, in `uids` order
        dense = np.searchsorted(present, owner)
        out = vectors.grouped(vectors.compiled_items(QUERY), cols, dense, len(present))
        values = [out[n].tolist() for n in names]
        # keyed here only where the aggregates have the candidate columns' types
        keyed = keyed and all(out[c].typ == vectors.kind_of(CANDIDATES.field(c).type)
                              for c in order.reads)
        if keyed:
            values.append(order.key.fn(out).tolist(len(present)))
        agg = dict(zip((uids[g] for g in present.tolist()), zip(*values)))
    empty = empty_aggregates()
    if keyed:
        empty = (*empty, _empty_key(order))
    n_at = names.index("n_traj")
    rows, keys = [], []
    for uid, (gs, term_seq, status) in unaggregated.items():
        a = agg.get(uid, empty)
        if keyed:
            keys.append(a[-1])
            a = a[:-1]
        rows.append((part.partition, uid, gs, term_seq, effective_status(status, a[n_at]), *a,
                     part.groups[uid].dataset))
    part.candidates.complete(rows, keys if keyed else None)


@cache
def _empty_key(order: SelectionOrder) -> object:
    """The declared order's key of a group without trajectories (every aggregate at its empty
    value), evaluated once per order."""
    names = list(vectors.compiled_items(QUERY))
    frame = {n: vectors.from_list([v], CANDIDATES.field(n).type)
             for n, v in zip(names, empty_aggregates())}
    return order.key.fn(frame).tolist(1)[0]
