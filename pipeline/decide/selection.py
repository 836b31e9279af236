"""Choosing a sample's batch and handing it out: the selection, its metric rows, and the batch a
`sample` keeps for its retry.

Why the batch is built whole before its selection is written: from that write on, the batch is
the caller's. The selection is one write: the surplus groups a sync DAPO call discards, the
selected groups and (over a lake) the batch's metric rows, so a crash keeps all of them or none.
Should the call raise after that write but before returning the batch (Ctrl-C, a listener that
raised), `PartitionState.undelivered` keeps it, and the retry (`sample` of that partition at the
same step) returns that very batch: chosen once, trained once. A call named by its caller
(`sample(request=...)`) records the key with its selection, so the same call sent again, even to
a process that restored the lake after the one that chose died, gets that batch back (`again`).

Without a lake, the batch's table and off-policy metrics are made when first read
(`Batch.later`): from the stored chunks the selection found its rows in (Arrow chunks never
change), so whenever they are read, by the caller or by a retry, they are the ones made at the
selection. A buffer over a lake makes them at once: its metric rows are written with the
selection. Either way, a row with a weight version from the future is warned about at the
selection.
"""
from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.config import BufferConfig, metric_prefix
from pipeline.decide import aggregates
from pipeline.decide import evaluate as decide
from pipeline.decide.batch import (
    Batch,
    Rows,
    batch_rows,
    per_row,
    staleness_at,
    with_provenance,
)
from pipeline.decide.certificate import bound_in_force, group_bounds
from pipeline.decide.metrics import (
    MASKED_SAMPLES,
    STALENESS_MIN,
    EvictionMetrics,
    masked_rows,
    off_policy_metrics,
)
from pipeline.decide.policies import PollContext
from pipeline.decide.policies.stale import MASK, MASKED
from pipeline.errors import EmptyBatchError, InvariantError
from pipeline.lake import read_table
from pipeline.state import BufferState, Columns, PartitionState, Unreported, decision_rows

log = logging.getLogger("replaylake")


# the `replaylake_event` of that warning's log record, so a caller can tell it by structure (a
# what-if replay holds it and counts the rows instead)
FUTURE_VERSIONS = "future_versions"


def _warn_future(rows: Rows, uids: pa.ChunkedArray, ctx: PollContext,
                 staleness_min: int | None) -> None:
    """Rows whose newest version is not older than the training step are flagged, not changed
    (verl computes its metrics over them as they are); audit `no_future_versions` lists them.
    ``uids``: each row's group (the payload's column; the provenance rows carry none)."""
    # the common case (no such row) is told by the batch's declared minimum staleness over its
    # non-padding rows, already computed with the off-policy metrics (None: no such row)
    if staleness_min is None or staleness_min >= 0:
        return
    staleness = rows.cols["staleness"]
    future = rows.kept & (staleness.values < 0)
    if staleness.valid is not None:
        future &= staleness.valid
    at = np.flatnonzero(future)
    if at.size:
        named = list(dict.fromkeys(uids.take(pa.array(at)).to_pylist()))[:5]
        log.warning("sample(step=%d, %s): %d trained row(s) carry a weight version from the "
                    "future (max_global_steps >= step; staleness down to %d), e.g. groups %s: "
                    "check how the rollout side tags versions", ctx.step, ctx.partition,
                    at.size, int(staleness.values[at].min()), named,
                    extra={"replaylake_event": FUTURE_VERSIONS})


def select(state: BufferState, cfg: BufferConfig, part: PartitionState, ctx: PollContext,
           call_id: int, poll: int, acc: EvictionMetrics) -> Batch:
    aggregates.complete(part)
    chosen = part.candidates.first(ctx.batch_size)   # in the selection order
    gs = np.array([part.groups[u].dispatch_step for u in chosen], dtype=np.int64)
    plan, owner = part.payload_plan(chosen)
    batch_id = state.next_batch_id()
    spans = dict(zip(chosen, decide.group_spans(ctx.step, gs.tolist())))
    # each group its own bound in force (under per-dataset bounds its dataset's, else the default)
    bounds = group_bounds(cfg, {u: part.groups[u].dataset for u in chosen})
    if cfg.bound() is not None:
        over = [u for u in chosen if spans[u] > bounds[u]]
        if over:
            raise InvariantError(f"selected groups exceed their staleness bound "
                                 f"({cfg.stale.given()!r}): {over[:5]}")
    surplus = cfg.refill.surplus(chosen, lambda: part.candidates.first(None))
    discards = decision_rows(
        "discard", partition=ctx.partition, step=ctx.step, call_id=call_id, poll=poll,
        uids=surplus, group_span=decide.group_spans(
            ctx.step, [part.groups[u].dispatch_step for u in surplus])) if surplus else None
    if cfg.empty_batch_is_error and plan.num_rows == 0:
        if discards is not None:      # the surplus goes all the same (reported by the next batch)
            state.commit("decisions", discards)
            acc.discarded += len(surplus)
        hint = "" if cfg.uses("failure") else (
            "; set sync_refill_failed_groups=True (with refill_fn and gen_batch_size=1) to "
            "replace failure groups that produced no trajectory")
        raise EmptyBatchError(f"the {len(chosen)} selected group(s) of partition "
                              f"{ctx.partition!r} hold no trajectory at all{hint}")
    status = [part.candidates.status(u) for u in chosen]
    # mask: the groups the stale rule would have evicted are kept, marked (None: no mask)
    stale = set() if cfg.mask is None else cfg.mask.stale(
        ctx.step, {u: (int(g), s) for u, g, s in zip(chosen, gs, status)})
    stale_rows = np.array([u in stale for u in chosen], bool)[owner] if stale else None
    prefix = metric_prefix(ctx.partition)
    acc.discarded += len(surplus)     # (taken back below should the selection not be written)
    evm = acc.scalars(prefix)     # empty on a validation partition: nothing is evicted there
    if cfg.starvation.steps is not None:     # the datasets with rows in the batch
        trained = {part.groups[chosen[k]].dataset for k in np.unique(owner).tolist()}
        evm.update({f"{prefix}/{k}": v for k, v in cfg.starvation.observe(part, ctx.step,
                                                                           trained).items()})

    def make() -> tuple[pa.Table, dict[str, float], dict[str, float], Rows, pa.Table]:
        payload = plan.table()
        rows = batch_rows(payload, batch_id=batch_id, step=ctx.step, group_steps=gs[owner],
                          carry=False)
        table = with_provenance(payload, rows, per_row(status, owner, pa.string()), stale_rows)
        opm, weights = off_policy_metrics(rows, prefix=prefix)
        if cfg.mask is not None:
            opm[f"{prefix}/{MASKED_SAMPLES}"] = masked_rows(table)
        return table, opm, weights, rows, payload

    in_force, strategy = bound_in_force(cfg)
    if cfg.stale.by_dataset and in_force is not None and bounds:
        in_force = max(bounds.values())     # the loosest of its groups', as the lake's `batches`
    fields = dict(batch_id=batch_id, step=ctx.step, partition=ctx.partition, uids=chosen,
                  eviction_metrics=evm, filtered_reward_counts=dict(acc.reward_counts),
                  bound=in_force, strategy=strategy, masked=[u for u in chosen if u in stale],
                  group_bounds=bounds)
    lake = state.journal.lake is not None
    newest = part.candidates.newest_version(chosen)
    if lake or (newest is not None and staleness_at(ctx.step, newest) < 0):
        # the metric rows go to the lake now; or some row may carry a version from the future,
        # which is told now (never only when, or if, the table is read)
        table, opm, weights, rows, payload = make()
        _warn_future(rows, payload.column("uid"), ctx, opm.get(f"{prefix}/{STALENESS_MIN}"))
        batch = Batch(table, off_policy_metrics=opm, metric_weights=weights, **fields)
    else:     # memory only: table and off-policy metrics when (if ever) read
        batch = Batch.later(lambda: make()[:3], plan.num_rows, **fields)
    # what the selection records of each group (masked or not, its bound): the decision rows
    # below, and what `held` rebuilds the batch from (a restore reads them back from the rows)
    marks = {u: (MASKED if u in stale else None, bounds[u]) for u in chosen}
    selected = decision_rows(
        "select", partition=ctx.partition, step=ctx.step, call_id=call_id, poll=poll,
        uids=chosen, group_span=[spans[u] for u in chosen], batch_id=batch_id,
        reason=[marks[u][0] for u in chosen] if stale else None,
        bound=[marks[u][1] for u in chosen], strategy=strategy, request=ctx.request)
    # one write: the surplus discarded, the selection and (over a lake) the batch's metric rows;
    # without a lake the metric rows are history nothing in memory reads: none are made
    items = [("decisions", selected if discards is None else Columns.concat([discards, selected]))]
    if lake:
        items.append(("metrics", [{"partition": ctx.partition, "step": ctx.step,
                                   "batch_id": batch_id, "name": k, "value": float(v)}
                                  for k, v in batch.metrics.items()]))
    seen = state.version
    try:
        state.commit_many(items)
    except BaseException:
        if state.version == seen:       # not written: the retry discards them and counts them
            acc.discarded -= len(surplus)
        raise
    part.batch_marks[batch_id] = (marks, strategy)
    # for a call named by a request sent again (see `again`), this one's or a retry's
    part.batch_reported[batch_id] = (dict(evm), dict(acc.reward_counts))
    part.undelivered = (batch, call_id)
    return batch


def held(part: PartitionState, batch_id: int) -> Batch:
    """A held batch (across a restart too), built again from the rows memory restored and what
    its selection recorded: the same groups, rows and provenance the `sample` that chose it
    returned, its groups masked and bounded as the selection marked them (never as today's
    configuration would: a reopen may change the threshold), and its off-policy metrics (its
    eviction metrics were that call's and are not repeated)."""
    chosen = part.batches[batch_id]
    step = part.batch_step[batch_id]
    marks, strategy = part.batch_marks.get(batch_id, ({}, None))
    gs = np.array([part.groups[u].dispatch_step for u in chosen], dtype=np.int64)
    payload, owner = part.payload_of(chosen)
    rows = batch_rows(payload, batch_id=batch_id, step=step, group_steps=gs[owner], carry=False)
    status = [part.served_status(u) for u in chosen]
    stale = {u for u in chosen if marks.get(u, (None, None))[0] == MASKED}
    table = with_provenance(payload, rows, per_row(status, owner, pa.string()),
                            np.array([u in stale for u in chosen], bool)[owner] if stale else None)
    opm, weights = off_policy_metrics(rows, prefix=metric_prefix(part.partition))
    if strategy == MASK:        # the selection masked (or could have): reported as then
        opm[f"{metric_prefix(part.partition)}/{MASKED_SAMPLES}"] = masked_rows(table)
    bounds = {u: marks.get(u, (None, None))[1] for u in chosen}
    known = [b for b in bounds.values() if b is not None]
    return Batch(table, batch_id, step, part.partition, list(chosen), {}, opm, weights,
                 bound=max(known) if known else None, strategy=strategy,
                 masked=[u for u in chosen if u in stale], group_bounds=bounds)


def again(state: BufferState, part: PartitionState, batch_id: int) -> Batch:
    """The held batch a `sample` named by its ``request`` chose, for that call sent again (its
    caller never received it): as `held` rebuilds it, with the eviction metrics and zero-variance
    reward counts the call reported.

    After a restore, the metrics are the call's rows in the lake's `metrics` table (what it
    reported) and the reward counts those of the evictions it reported (the decision log). A lake
    written by replaylake before 2026-12 wrote a selection and its metric rows apart: should that
    process have died between the two, the metrics are computed from those evictions and
    discards, and their rows written now (a starved-dataset signal the batch carried is lost with
    them: it is recorded nowhere else)."""
    batch = held(part, batch_id)
    reported = part.batch_reported.get(batch_id)
    if isinstance(reported, Unreported):
        reported = part.batch_reported[batch_id] = _reported_in_lake(state, batch, reported)
    evm, counts = reported if reported is not None else ({}, {})
    return dataclasses.replace(batch, eviction_metrics=dict(evm),
                               filtered_reward_counts=dict(counts))


def _reported_in_lake(state: BufferState, batch: Batch, unreported: Unreported
                      ) -> tuple[dict[str, float], dict[float, int]]:
    acc = EvictionMetrics()
    acc.add_rows(unreported.evictions)
    acc.discarded = unreported.discards
    stored = read_table(state.lake.root, "metrics", partitions=[batch.partition],
                        keep=lambda t: pc.equal(t["batch_id"], batch.batch_id),
                        columns=["name", "value", "seq"])
    if stored.num_rows:
        evm = {n: v for n, v in zip(stored["name"].to_pylist(), stored["value"].to_pylist())
               if n not in batch.off_policy_metrics}
    else:
        evm = acc.scalars(metric_prefix(batch.partition))
        state.commit("metrics", [{"partition": batch.partition, "step": batch.step,
                                  "batch_id": batch.batch_id, "name": k, "value": float(v)}
                                 for k, v in {**evm, **batch.off_policy_metrics}.items()])
    return evm, dict(acc.reward_counts)
