"""The Batch handed to the trainer: an Arrow table of whole groups with provenance columns.

The provenance columns (span, staleness, ...) are computed by the declared formulas of
sql/metrics/provenance.sql, compiled for numpy (`pipeline.decide.vectors`: a batch is a few
hundred rows, where numpy's cost per operation is a small part of polars' fixed cost per
expression); the same rows feed the off-policy metrics.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.decide import vectors
from pipeline.decide.vectors import BIGINT, HUGEINT, Col
from pipeline.ingest import one_array
from pipeline.state.constants import constant
from schemas import BATCH_PROVENANCE

PROVENANCE = "provenance"
OFF_POLICY = "off_policy"
_INPUTS = ("min_global_steps", "max_global_steps", "is_padding")
# what the rows carry for their readers beyond what the formulas read (a certificate lists each
# row by partition, uid and seq; a batch's own provenance needs none of them)
CARRIED = ("partition", "uid", "seq")
_INT64 = 2 ** 63
_LATER = ("table", "off_policy_metrics", "metric_weights")   # what `Batch.later` builds late


@dataclass
class Rows:
    """A batch's `batch_rows` relation (what provenance.sql reads) with its provenance, as numpy
    columns (`vectors.Col`); ``carried``: the row identity, as Arrow arrays, when asked for;
    ``kept``: the rows the off-policy declaration keeps (its predicate, evaluated here)."""

    cols: dict[str, Col]
    n: int
    carried: dict[str, Any]
    kept: np.ndarray

    def numpy(self, name: str) -> np.ndarray:
        """A column's values (under NULL: 0)."""
        return self.cols[name].values

    def arrow(self, name: str) -> pa.Array:
        return self.cols[name].arrow(self.n)

    def frame(self) -> pl.DataFrame:
        """The rows as a polars frame, columns typed as the lake types them (the 128-bit sums
        as Int128)."""
        series = [pl.Series(k, v) for k, v in self.carried.items()]
        for name, c in self.cols.items():
            s = pl.Series(name, c.arrow(self.n))
            series.append(s.cast(pl.Int128) if c.typ == HUGEINT else s)
        return pl.DataFrame(series)


def batch_rows(payload: pa.Table, *, batch_id: int, step: int,
               group_steps: dict[str, int] | np.ndarray, carry: bool = True) -> Rows:
    """The `batch_rows` relation of a batch (what provenance.sql reads), plus its provenance.
    ``group_steps``: each group's dispatch step by uid, or already each row's (an array);
    ``carry=False`` leaves out the row identity (`CARRIED`), which no formula reads.

    Per-trajectory token counts are the stored `n_response_tokens` (or come from the Arrow list
    offsets); the version-span sums are taken only when some row reported spans."""
    n = payload.num_rows
    if isinstance(group_steps, np.ndarray):
        steps = group_steps.astype(np.int64, copy=False)
    else:
        steps = np.fromiter((group_steps[u] for u in payload.column("uid").to_pylist()),
                            dtype=np.int64, count=n)
    cols = {c: vectors.column(payload.column(c)) for c in _INPUTS}
    cols["step"] = vectors.of(np.full(n, step, dtype=np.int64))
    cols["batch_id"] = vectors.of(np.full(n, batch_id, dtype=np.int64))
    cols["global_steps"] = vectors.of(steps)
    cols["n_response_tokens"] = vectors.column(_response_tokens(payload))
    cols.update(_span_sums(payload.column("version_spans"), n))
    carried = {c: one_array(payload.column(c)) for c in CARRIED} if carry else {}
    vectors.rows(vectors.compiled_items(PROVENANCE), cols)
    kept = vectors.true(vectors.compiled_predicate(OFF_POLICY).fn(cols))
    return Rows(cols, n, carried, np.broadcast_to(kept, (n,)))


def _span_sums(spans: pa.ChunkedArray, n: int) -> dict[str, Col]:
    """Each row's version-span sums, as the `batch_rows` view makes them: span_tokens (tokens
    covered), span_version_sum (sum of n_tokens * version, exact past 64 bits) and
    span_version_min (oldest version that produced a token); NULL for a row without spans, and
    the minimum NULL too where no span has a token."""
    if spans.null_count == n:
        return {"span_tokens": vectors.nulls(n), "span_version_sum": vectors.nulls(n, HUGEINT),
                "span_version_min": vectors.nulls(n)}
    spans = one_array(spans)
    reported = np.asarray(spans.is_valid())
    flat = spans.flatten()
    owner = np.asarray(pc.list_parent_indices(spans), dtype=np.intp)
    # a NULL span (the element itself) is NULL in both fields, as SQL reads `s.n_tokens`
    tokens, versions = (vectors.column(pc.struct_field(flat, f)) for f in ("n_tokens", "version"))
    counted = np.ones(len(owner), bool) if tokens.valid is None else tokens.valid.copy()
    t = np.where(counted, tokens.values, 0)
    both = counted if versions.valid is None else counted & versions.valid
    v = np.where(both, versions.values, 0)
    span_tokens = np.zeros(n, np.int64)
    np.add.at(span_tokens, owner, t)
    per = (np.bincount(owner, minlength=n).max(initial=0) if len(owner) else 0)
    big = int(np.abs(t).max(initial=0)) * int(np.abs(v).max(initial=0)) * max(int(per), 1)
    if big < _INT64:
        version_sum = np.zeros(n, np.int64)
        np.add.at(version_sum, owner, t * v)
    else:                                   # past 64 bits: Python integers, exactly
        version_sum = np.zeros(n, object)
        for row, x, y in zip(owner.tolist(), t.tolist(), v.tolist()):
            version_sum[row] += x * y
    live = both & (t > 0)
    low = np.full(n, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(low, owner[live], v[live])
    has_low = np.zeros(n, bool)
    has_low[owner[live]] = True
    valid = None if reported.all() else reported
    return {"span_tokens": Col(np.where(reported, span_tokens, 0), valid, BIGINT),
            "span_version_sum": Col(np.where(reported, version_sum, 0), valid, HUGEINT),
            "span_version_min": Col(np.where(has_low, low, 0), has_low & reported, BIGINT)}


def _response_tokens(payload: pa.Table) -> pa.ChunkedArray | pa.Array:
    """Each row's response length: stored at ingest in the lake's trajectories (a batch's payload
    has it), counted from the list offsets of a table without it."""
    if "n_response_tokens" in payload.schema.names:
        return payload.column("n_response_tokens")
    return pc.list_value_length(payload.column("response_ids")).cast(pa.int64())


def with_provenance(payload: pa.Table, rows: Rows, status: pa.Array,
                    stale: np.ndarray | None = None) -> pa.Table:
    """Append the BATCH_PROVENANCE columns to the payload (``rows`` from `batch_rows`):
    ``status``, each row's group status; ``stale``, whether each row's group is masked stale
    (`StaleMask`; None: none is), which becomes ``is_stale``."""
    n = payload.num_rows
    made = {"status": status, "times_sampled": constant(1, n, pa.int32()),
            "is_stale": constant(False, n, pa.bool_()) if stale is None else pa.array(stale)}
    extra = [made[f.name] if f.name in made else _as(rows.arrow(f.name), f.type)
             for f in BATCH_PROVENANCE]
    schema = payload.schema
    meta = schema.metadata
    return pa.Table.from_arrays([*payload.columns, *extra], schema=_with_provenance(
        schema, tuple(sorted(meta.items())) if meta else ()))


def row_provenance(step: np.ndarray, global_steps: np.ndarray, min_global_steps: np.ndarray,
                   max_global_steps: np.ndarray) -> dict[str, np.ndarray]:
    """The BATCH_PROVENANCE columns the declared formulas give (span, staleness, worst
    staleness, group span) for rows of any mix of batches: each row's training step, its
    group's dispatch step and its oldest and newest weight version (int64 arrays)."""
    env = {"step": vectors.of(step), "global_steps": vectors.of(global_steps),
           "min_global_steps": vectors.of(min_global_steps),
           "max_global_steps": vectors.of(max_global_steps)}
    wanted = {f.name for f in BATCH_PROVENANCE}
    return {name: c.fn(env).values for name, c in vectors.compiled_items(PROVENANCE).items()
            if name in wanted}


@lru_cache(maxsize=1)
def _staleness() -> vectors.Compiled:
    return vectors.compiled_items(PROVENANCE)["staleness"]


def staleness_at(step: int, newest_version: int) -> int:
    """The declared staleness (sql/metrics/provenance.sql) of a row trained at ``step`` whose
    newest weight version is ``newest_version``: below 0, a version from the future."""
    env = {"step": vectors.scalar(step), "max_global_steps": vectors.scalar(newest_version)}
    return int(np.asarray(_staleness().fn(env).values).reshape(-1)[0])


@lru_cache(maxsize=16)
def _with_provenance(schema: pa.Schema, metadata: tuple) -> pa.Schema:
    """The payload's schema followed by BATCH_PROVENANCE (a batch's schema: built once per
    payload schema and metadata; schemas compare equal whatever their metadata, so it is part
    of the key)."""
    return pa.schema([*schema, *BATCH_PROVENANCE], metadata=dict(metadata) or None)


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

    A batch made by `later` builds ``table``, ``off_policy_metrics`` and ``metric_weights`` when
    one of them is first read (from rows it holds, so the result is the same whenever that is):
    a caller that reads only the chosen groups and the eviction metrics (the verl adapter,
    whose trainer reads the tokens from TransferQueue) never pays for them. ``len(batch)`` and
    ``num_groups`` need neither.
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

    @classmethod
    def later(cls, build: Callable[[], tuple[pa.Table, dict[str, float], dict[str, float]]],
              num_rows: int, **fields: Any) -> Batch:
        """A batch whose ``table``, ``off_policy_metrics`` and ``metric_weights`` are
        ``build()``'s, made at the first read of any of them; ``num_rows``: the table's rows."""
        batch = cls(None, **fields)
        for name in _LATER:
            del batch.__dict__[name]
        batch.__dict__["_build"] = build
        batch.__dict__["_num_rows"] = num_rows
        return batch

    def __getattr__(self, name: str) -> Any:
        # only called for an attribute not set: one of _LATER, until `build` has run
        build = self.__dict__.get("_build")
        if build is None or name not in _LATER:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        made = build()
        self.__dict__.update(zip(_LATER, made))
        self.__dict__.pop("_build", None)
        return self.__dict__[name]

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (a Ray actor's reply) built: a build function does not travel."""
        if "_build" in self.__dict__:
            self.table                                # noqa: B018 - builds it
        return dict(self.__dict__)

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
        n = self.__dict__.get("_num_rows")
        return self.table.num_rows if n is None else n

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
