"""The sample loop: poll, evict, refill, wait, select (SPEC §3-§5), shared by `sample` and
`wait_for_sampleable`. Rules live in policies/; this file only sequences them.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pipeline import decide
from pipeline.batch import Batch, with_provenance
from pipeline.candidates import FINISHED
from pipeline.errors import ConfigError, EmptyBatchError, InvariantError, SampleTimeout
from pipeline.ingest import check_partition
from pipeline.metrics import CallMetrics, EvictionMetrics, off_policy_metrics, prefix_of
from pipeline.policies.context import CallState, PollContext, PollOutcome

if TYPE_CHECKING:
    from pipeline.buffer import ReplayBuffer

log = logging.getLogger("replaylake")
WARN_EVERY_S = 60.0


def run_call(buf: ReplayBuffer, global_steps: int, partition_id: str, batch_size: int, *,
             consume: bool, timeout: float | None,
             before_poll: Callable[[], None] | None = None) -> Any:
    """One `sample` (consume=True) or `wait_for_sampleable` call. ``before_poll`` runs before each
    poll with the lock released: adapters mirror an external data plane into the buffer there."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ConfigError(f"batch_size={batch_size!r} must be a positive int")
    if isinstance(global_steps, bool) or not isinstance(global_steps, int) or global_steps < 0:
        raise ConfigError(f"global_steps={global_steps!r} must be an int >= 0")
    check_partition(partition_id)
    cfg = buf.config
    ctx = PollContext(global_steps, partition_id, batch_size)
    st, acc = CallState(), EvictionMetrics()
    start = last_warn = time.monotonic()
    deadline = None if timeout is None else start + timeout
    with buf._cond:
        call_id = buf._next_call
        buf._next_call += 1
    poll = 0
    while True:
        dispatch = 0
        if before_poll is not None:
            before_poll()
        with buf._cond:
            part = buf._part(partition_id)
            seen = buf._version
            ev = decide.evaluate(part, cfg, ctx)
            if ev.count:
                _apply_eviction(buf, part, ctx, call_id, poll, ev, acc, st)
            part.candidates.settle()
            outcome = PollOutcome(ev.count, {r: sum(v) for r, v in ev.reasons.items()},
                                  ev.empty_failures, part.candidates.alive_count,
                                  len(part.inflight))
            if cfg.refill_fn is not None:
                dispatch = cfg.refill.after_poll(outcome, st, ctx)
            if dispatch:
                buf._journal.record_rows("decisions", [{
                    "partition": partition_id, "step": global_steps, "call_id": call_id,
                    "poll": poll, "kind": "refill", "reason": type(cfg.refill).__name__,
                    "count": dispatch}])
                st.refilled += dispatch
            elif _ready(buf, part, ctx, outcome, st):
                if not consume:
                    uids = decide.oldest(part, batch_size)
                    if ctx.validation:
                        return uids, CallMetrics({}, {})
                    return uids, CallMetrics(acc.scalars(prefix_of(partition_id)), acc.reward_counts)
                return _select(buf, part, ctx, call_id, poll, acc)
            else:
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    raise SampleTimeout(
                        f"sample(global_steps={global_steps}, partition_id={partition_id!r}, "
                        f"batch_size={batch_size}) timed out after {timeout}s with "
                        f"{outcome.sampleable} sampleable group(s)", part.counts())
                if st.refilled and now - last_warn >= WARN_EVERY_S:
                    last_warn = now
                    log.warning("sample(step=%d, %s): still short of %d groups after %.0fs: "
                                "%d filtered, %d refilled, %d in flight, %d sampleable",
                                global_steps, partition_id, batch_size, now - start,
                                st.filtered, st.refilled, outcome.inflight, outcome.sampleable)
                if buf._version == seen:
                    wait = cfg.poll_interval if deadline is None else \
                        min(cfg.poll_interval, max(deadline - now, 0.0))
                    buf._cond.wait(wait)
        poll += 1
        if dispatch:
            cfg.refill_fn(dispatch)  # lock released: it registers the new groups with us


def _ready(buf: ReplayBuffer, part, ctx: PollContext, o: PollOutcome, st: CallState) -> bool:
    if o.sampleable < ctx.batch_size:
        return False
    if not buf.config.stale.gate_open(ctx, part.oldest_inflight()):
        return False
    if buf.config.refill.drains and not ctx.validation:
        return st.draining and o.inflight == 0
    return True


def _apply_eviction(buf, part, ctx, call_id, poll, ev, acc, st) -> None:
    rows = []
    for i, uid in enumerate(ev.uids):
        for reason, hits in ev.reasons.items():
            if hits[i]:
                value = ev.values[i] if reason == "zero_variance" else None
                rows.append({"partition": ctx.partition, "step": ctx.step, "call_id": call_id,
                             "poll": poll, "kind": "evict", "uid": uid, "reason": reason,
                             "span": ev.spans[i], "value": value, "count": 1})
    buf._journal.record_rows("decisions", rows)
    part.apply_removed(ev.uids, "evicted")
    buf._emit("evict", ctx.partition, ev.uids, None)
    hits = ev.reasons
    acc.add_stale([s for s, h in zip(ev.spans, hits.get("stale", [])) if h])
    zv = [v for v, h in zip(ev.values, hits.get("zero_variance", [])) if h]
    acc.add_filtered(zv)
    st.filtered += len(zv)
    acc.failures += sum(hits.get("failure", []))


def _select(buf, part, ctx: PollContext, call_id: int, poll: int, acc: EvictionMetrics) -> Batch:
    cfg = buf.config
    chosen = decide.oldest(part, ctx.batch_size)
    bound = cfg.stale.bound()
    if bound is not None and not ctx.validation:
        over = [u for u in chosen if ctx.step - part.groups[u].gs + 1 > bound]
        if over:
            raise InvariantError(f"selected groups exceed the staleness bound {bound}: {over[:5]}")
    if cfg.refill.drains and not ctx.validation:
        chosen_set = set(chosen)
        surplus = [u for u in decide.oldest(part, None) if u not in chosen_set]
        if surplus:
            buf._journal.record_rows("decisions", [
                {"partition": ctx.partition, "step": ctx.step, "call_id": call_id, "poll": poll,
                 "kind": "discard", "uid": u, "span": ctx.step - part.groups[u].gs + 1,
                 "count": 1} for u in surplus])
            part.apply_removed(surplus, "discarded")
            buf._emit("discard", ctx.partition, surplus, None)
            acc.discarded += len(surplus)
    payload = part.payload(chosen)
    prefix = prefix_of(ctx.partition)
    if cfg.empty_batch_is_error and not ctx.validation and payload.num_rows == 0:
        hint = "" if cfg.failure.evict == "empty" else (
            "; set sync_refill_failed_groups=True (with refill_fn and gen_batch_size=1) to "
            "replace failure groups that produced no trajectory")
        raise EmptyBatchError(f"the {len(chosen)} selected group(s) of partition "
                              f"{ctx.partition!r} hold no trajectory at all{hint}")
    batch_id = buf._next_batch
    buf._next_batch += 1
    status = {u: ("finished" if part.candidates.alive[u].status == FINISHED else "failure")
              for u in chosen}
    steps = {u: part.groups[u].gs for u in chosen}
    buf._journal.record_rows("decisions", [
        {"partition": ctx.partition, "step": ctx.step, "call_id": call_id, "poll": poll,
         "kind": "select", "uid": u, "span": ctx.step - steps[u] + 1, "batch_id": batch_id,
         "count": 1} for u in chosen])
    part.apply_removed(chosen, "selected", batch_id, ctx.step)
    buf._emit("select", ctx.partition, chosen, batch_id)
    table = with_provenance(payload, batch_id=batch_id, step=ctx.step, group_steps=steps,
                            group_status=status)
    evm = {} if ctx.validation else acc.scalars(prefix)
    opm, weights = off_policy_metrics(table, ctx.step, prefix)
    metrics = {**evm, **opm}
    if metrics:
        buf._journal.record_rows("metrics", [
            {"partition": ctx.partition, "step": ctx.step, "batch_id": batch_id, "name": k,
             "value": float(v)} for k, v in metrics.items()])
    return Batch(table, batch_id, ctx.step, ctx.partition, chosen, evm, opm, weights,
                 {} if ctx.validation else dict(acc.reward_counts))
