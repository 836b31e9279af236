"""The sample loop: poll, evict, refill, wait, select; shared by `sample` and
`wait_for_sampleable`. Rules live in sql/rules/, refill in policies/, the batch's making in
selection.py; this file only sequences them.

One poll works on one consistent snapshot (the buffer's lock is held from evaluation to the
decision rows), so the groups it evicts are gone before anything else is decided; it is also one
change an interrupt cannot cut (`pipeline.interrupts`). Between polls the lock is released:
producers keep writing, `refill_fn` registers new groups, adapters mirror their data plane
(`before_poll`), and Ctrl-C stops a waiting call at once.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from pipeline import interrupts
from pipeline.config import BufferConfig, ask_refill, metric_prefix
from pipeline.decide import aggregates
from pipeline.decide import evaluate as decide
from pipeline.decide.batch import Batch
from pipeline.decide.metrics import CallMetrics, EvictionMetrics
from pipeline.decide.policies import CallState, PollContext, PollOutcome
from pipeline.decide.policies.stale import WaitGate, blocks
from pipeline.decide.selection import again, select
from pipeline.errors import BufferUnavailableError, ConfigError, SampleTimeout
from pipeline.state import BufferState, Columns, PartitionState, RefillAsk, decision_rows

log = logging.getLogger("replaylake")
WARN_EVERY_S = 60.0


@dataclass(frozen=True)
class Ready:
    """What `wait_for_sampleable` returns: the oldest sampleable uids and the call's eviction
    metrics (``metrics.reward_counts``: the filtered reward counts). Unpacks as (uids, metrics)."""

    uids: list[str]
    metrics: CallMetrics

    def __iter__(self):
        return iter((self.uids, self.metrics))


def run_call(state: BufferState, cfg: BufferConfig, ctx: PollContext, *, consume: bool,
             timeout: float | None, before_poll: Callable[[], None] | None = None
             ) -> Batch | Ready:
    """One `sample` (consume=True) or `wait_for_sampleable` call (arguments already checked)."""
    call = _Call(state, cfg, ctx, consume, timeout)
    try:
        return call.run(before_poll)
    except BaseException:
        # the evictions of a call that raises (a refill_fn that failed, a timeout, Ctrl-C) are
        # in the lake already: their metrics go out with the partition's next call, not lost
        # (unless the call chose its batch: they are in that batch's metrics)
        with state.locked():
            part = state.part(ctx.partition)
            if part.undelivered is not None and part.undelivered[1] == call.call_id:
                raise
            if part.unreported is not None:
                call.acc.merge(part.unreported)
            part.unreported = call.acc
        raise


class _Call:
    """One call's fixed inputs and what its polls accumulate.

    Each poll's work under the lock (evaluate, evict, decide a refill, select) is one change that
    an interrupt cannot cut (`interrupts.held`): Ctrl-C lands before or after it, and only the
    waits between polls stop at once. A `sample` interrupted after it chose its batch keeps the
    batch for the caller's retry: the next `sample` of that partition at the same step and batch
    size returns it (a notebook cell run again trains it once, not never or twice); one chosen
    under a request waits for that request (`_undelivered`)."""

    def __init__(self, state: BufferState, cfg: BufferConfig, ctx: PollContext, consume: bool,
                 timeout: float | None):
        # the partition's own configuration: a validation partition's has no rule and no refill
        self.state, self.cfg, self.ctx, self.consume, self.timeout = \
            state, cfg.for_partition(ctx.partition), ctx, consume, timeout
        self.st = CallState()
        self.start = self.last_warn = time.monotonic()
        self.deadline = None if timeout is None else self.start + timeout
        self.call_id = state.new_call()
        self.uses = self.cfg.rules
        self.asked: tuple[int, int] | None = None   # (poll, prompts) of a refill not yet asked
        with state.locked():
            part = state.part(ctx.partition)
            self.acc, part.unreported = part.unreported or EvictionMetrics(), None
            if part.restored_evictions:     # a restored lake's evictions no batch reported
                self.acc.add_rows(part.restored_evictions)
                part.restored_evictions = []
            self.acc.discarded += part.restored_discards    # ... and its discards
            part.restored_discards = 0

    def run(self, before_poll: Callable[[], None] | None) -> Batch | Ready:
        try:
            return self._run(before_poll)
        except BaseException as exc:
            if self.asked is not None:     # a refill was decided and logged, never asked for
                self._ask_failed(*self.asked, exc)
            raise

    def _run(self, before_poll: Callable[[], None] | None) -> Batch | Ready:
        state, poll = self.state, 0
        while True:
            # every iteration is one poll: mirror, evaluate + evict, then refill, finish or wait
            self._await_ask()
            if before_poll is not None:
                before_poll()
            with state.locked():
                if state.closed:
                    raise BufferUnavailableError(
                        f"{_call(self.ctx, self.consume)}: the buffer was closed while this "
                        "call waited; nothing was chosen (open the lake again to go on)")
                part = state.part(self.ctx.partition)
                if self.consume and part.undelivered is not None:
                    batch = self._undelivered(part)
                    if batch is not None:
                        return batch
                if self.consume and self.ctx.request is not None:   # (chosen meanwhile too)
                    batch = self._requested(part)
                    if batch is not None:
                        return batch
                with interrupts.held(), state.listeners_after():
                    result, dispatch, wait = self._poll(part, poll)
                if result is not None:
                    if self.consume:
                        part.undelivered = None       # the caller has it now
                    return result
                if wait is not None:
                    state.wait(wait)
            poll += 1
            if dispatch:
                self._refill(part, dispatch, poll - 1)

    def _undelivered(self, part: PartitionState) -> Batch | None:
        """The batch an interrupted `sample` chose, if this call is its retry: same step and
        batch size, and no other request than the one that chose it (a batch chosen under a
        request waits for that request; handed to a call without one, or to the call that
        named none, the key then names this call's batch)."""
        batch, ctx = part.undelivered[0], self.ctx
        key = part.batch_request.get(batch.batch_id)
        if key is not None and key != ctx.request:
            return None              # another named call's: its retry gets it
        if (batch.step, len(batch.uids)) == (ctx.step, ctx.batch_size) and \
                batch.batch_id in part.batches:
            self._leave_metrics(part)
            part.undelivered = None
            if ctx.request is not None:
                part.batch_request[batch.batch_id] = ctx.request
            return batch
        part.undelivered = None
        if batch.batch_id in part.batches:
            log.warning("sample(step=%d, %s): batch %d, chosen at step %d by a sample that was "
                        "interrupted before it returned, stays held (held_batches lists it; "
                        "release it or train on it)", self.ctx.step, self.ctx.partition,
                        batch.batch_id, batch.step)
        return None

    def _requested(self, part: PartitionState) -> Batch | None:
        """The held batch a `sample` named with this call's ``request`` chose: this call is that
        one sent again, its caller never having received the batch (see `selection.again`)."""
        ctx = self.ctx
        batch_id = part.requested(ctx.request)
        if batch_id is None:
            return None
        chosen = (part.batch_step[batch_id], len(part.batches[batch_id]))
        if chosen != (ctx.step, ctx.batch_size):
            raise ConfigError(
                f"sample(global_steps={ctx.step}, batch_size={ctx.batch_size}): "
                f"request={ctx.request!r} names held batch {batch_id} of partition "
                f"{ctx.partition!r}, chosen at global_steps={chosen[0]} with {chosen[1]} "
                "group(s); a request names one call: send it again with the same arguments, or "
                "name a new call with a new request")
        self._leave_metrics(part)
        return again(self.state, part, batch_id)

    def _leave_metrics(self, part: PartitionState) -> None:
        """This call hands out a batch chosen earlier, whose metrics that choice reported: the
        evictions this call gathered stay owed to the partition's next batch."""
        if self.acc.counts or self.acc.discarded:
            part.unreported, self.acc = self.acc, EvictionMetrics()

    def _poll(self, part: PartitionState, poll: int
              ) -> tuple[Batch | Ready | None, int, float | None]:
        """One poll under the lock: (the call's result or None, prompts to refill, how long to
        wait before the next poll or None)."""
        state, cfg, ctx, st, acc = self.state, self.cfg, self.ctx, self.st, self.acc
        seen = state.version
        ev = decide.evaluate(part, self.uses, ctx.step, cfg.filter_metric)
        evictions = _eviction_rows(ctx, self.call_id, poll, ev) if ev.count else None
        before = st.copy() if ev.count and cfg.refill_fn is not None else None
        for r, n in ev.by_reason().items():
            st.evicted[r] = st.evicted.get(r, 0) + n
        outcome = _outcome(part, ev)
        ask = None
        if cfg.refill_fn is not None:
            try:
                ask = self._ask(part, outcome, poll)
            except BaseException:
                # the refill policy or admission refused (a cap reached): the evictions stand,
                # as they would had the poll asked for nothing
                self._write(part, ev, evictions, None, None)
                raise
        self._write(part, ev, evictions, ask, before)
        dispatch = 0 if ask is None else ask.dispatch
        now = time.monotonic()
        if dispatch:
            st.refilled += dispatch
            self.asked = (poll, dispatch)
        elif _ready(cfg, part, ctx, outcome, st):
            if not self.consume:
                if part.candidates.order is not None:   # a declared order keys groups
                    aggregates.complete(part)           # when their aggregates are known
                uids = part.candidates.first(ctx.batch_size)
                scalars = acc.scalars(metric_prefix(ctx.partition))
                if scalars:    # reported here, not by the next batch: the lake says so (restore)
                    state.commit("metrics", [
                        {"partition": ctx.partition, "step": ctx.step, "batch_id": None,
                         "name": k, "value": float(v)} for k, v in scalars.items()])
                return Ready(uids, CallMetrics(scalars, acc.reward_counts)), 0, None
            return select(state, cfg, part, ctx, self.call_id, poll, acc), 0, None
        _check_time(ctx, self.timeout, self.deadline, now, part, state, st, cfg, self.consume)
        if st.refilled and now - self.last_warn >= WARN_EVERY_S:
            self.last_warn = now
            log.warning("sample(step=%d, %s): still short of %d groups after %.0fs: "
                        "evicted %s, %d refilled, %d in flight, %d sampleable",
                        ctx.step, ctx.partition, ctx.batch_size, now - self.start, st.evicted,
                        st.refilled, outcome.inflight, outcome.sampleable)
        if dispatch or state.version != seen:
            return None, dispatch, None
        return None, 0, cfg.poll_interval if self.deadline is None else \
            min(cfg.poll_interval, max(self.deadline - now, 0.0))

    def _write(self, part: PartitionState, ev: decide.Eviction, evictions: Columns | None,
               ask: RefillAsk | None, before: CallState | None) -> None:
        """Write the poll's evictions and its refill as one (`BufferState.write_poll`), then
        count the evictions for the call's metrics. Should the write fail, the call still owes
        what a refill of the poll would have asked had it evicted nothing (asked of ``before``,
        the call's state before the poll; without evictions, all it wanted)."""
        if ask is None:
            owed = None
        elif before is None:
            owed = lambda: (ask.wanted, ask.replaces)    # noqa: E731
        else:
            owed = partial(self._earlier, before, part)
        self.state.write_poll(part, evictions, ask, step=self.ctx.step, owed_if_lost=owed)
        if ev.count:
            self.acc.add(ev)
        part.candidates.settle()

    def _ask(self, part: PartitionState, outcome: PollOutcome, poll: int) -> RefillAsk:
        """The poll's refill, decided by the refill policy and capped by admission (not yet
        written). While an earlier ask has not returned, what is wanted is held back: never
        asked twice."""
        cfg, ctx, st = self.cfg, self.ctx, self.st
        st.replaces = []
        wanted = cfg.refill.after_poll(outcome, st, ctx)
        # the row asks for what is owed too; should it fail to be written, the next poll (of
        # this or a later call) still owes these prompts, as when refill_fn raises. The
        # admission value caps the ask (admit: the dispatch capacity), the rest stays owed
        return self.state.refill_ask(ctx.partition, wanted, st.replaces, step=ctx.step,
                                     call_id=self.call_id, poll=poll, policy=cfg.refill.name,
                                     limit=partial(cfg.admission.room, ctx, outcome, part))

    def _earlier(self, before: CallState, part: PartitionState) -> tuple[int, list[str]]:
        """What the poll would have asked for had it evicted nothing (credit earlier polls
        earned, in sync DAPO): owed in memory should its write fail, for the evictions that
        earned it are written already and no poll finds them again. Asked of a copy of the
        call's state from before the poll, with nothing applied (the write failed)."""
        try:
            wanted = self.cfg.refill.after_poll(_outcome(part, None), before, self.ctx)
        except Exception:      # noqa: BLE001 - the policy would refuse: nothing is owed
            return 0, []
        return wanted, before.replaces

    def _refill(self, part: PartitionState, dispatch: int, poll: int) -> None:
        """Ask ``refill_fn`` for ``dispatch`` prompts, the lock released: it registers the new
        groups through this very buffer. If it raises, the lake records the ask as failed (a
        `refill_failed` row beside its `refill` row: readers count only served asks) and the
        prompts stay owed: the next poll, of this or a later call, asks again.

        While it runs the ask is in flight (`refill_asking`): no poll of another call asks
        again (what polls want meanwhile is owed, and asked once it has returned), and a call
        that starts waits for it before its first poll. With a deadline, refill_fn runs in a
        helper thread that the call waits for until the deadline only: a rollout side that
        stops answering ends `sample` in `SampleTimeout` naming refill_fn, never holds it. The
        ask then stays in flight until refill_fn returns, which settles it as if the call had
        waited."""
        self.asked = None          # from here on, the ask's own end settles it
        replaced = len(part.refill_replaces)
        done = threading.Event()

        def ask() -> None:
            part.refill_thread = threading.get_ident()
            try:
                ask_refill(self.cfg.refill_fn, dispatch, self.ctx.partition,
                           self.cfg.refill_takes_partition)
            except BaseException as exc:
                with self.state.locked():
                    part.refill_asking = False
                self._ask_failed(poll, dispatch, exc)
                raise
            finally:
                part.refill_thread = None
            with self.state.locked(), interrupts.held():   # what was owed meanwhile stays owed
                part.refill_asking = False
                self.state.refill_served(self.ctx.partition, dispatch, replaced)

        with self.state.locked():
            part.refill_asking, part.refill_done = True, done
        if self.deadline is None:
            try:
                ask()
            finally:
                with self.state.locked():
                    if part.refill_done is done:   # an interrupt before the ask began, too
                        part.refill_asking = False
                done.set()
            return
        errors: list[BaseException] = []

        def run() -> None:
            try:
                ask()
            except BaseException as exc:  # noqa: BLE001 - re-raised by the waiting call
                errors.append(exc)
                if time.monotonic() >= self.deadline:
                    log.warning("refill_fn(%d) of %s raised after the call timed out: %r "
                                "(the prompts stay owed)", dispatch, _call(self.ctx, self.consume), exc)
            finally:
                done.set()

        threading.Thread(target=run, name="replaylake-refill", daemon=True).start()
        if not done.wait(max(self.deadline - time.monotonic(), 0.0)):
            with self.state.locked():
                raise SampleTimeout(
                    f"{_call(self.ctx, self.consume)} timed out after {self.timeout}s: refill_fn({dispatch}) "
                    "has not returned (the rollout side is not answering); the ask stays in "
                    "flight and its groups count as soon as they arrive", part.counts())
        if errors:
            raise errors[0]

    def _await_ask(self) -> None:
        """Before a poll: wait (until the deadline) for a refill an earlier call asked for and
        left in flight when it timed out or was interrupted, so that this call decides on what
        that ask registered as a whole, as the earlier call would have, never on half of it."""
        with self.state.locked():
            part = self.state.part(self.ctx.partition)
            done = part.refill_done if part.refill_asking else None
        if done is None or done.is_set() or part.refill_thread == threading.get_ident():
            return      # (a call made by refill_fn itself owes, and never waits for its ask)
        left = None if self.deadline is None else max(self.deadline - time.monotonic(), 0.0)
        if not done.wait(left):
            with self.state.locked():
                raise SampleTimeout(
                    f"{_call(self.ctx, self.consume)} timed out after {self.timeout}s: a "
                    "refill_fn an earlier call asked has not returned (the rollout side is not "
                    "answering); its groups count as soon as they arrive", part.counts())

    def _ask_failed(self, poll: int, dispatch: int, exc: BaseException) -> None:
        """Record that the refill decided at ``poll`` served nothing (refill_fn raised, or the
        call raised before asking): a `refill_failed` row, named by the exception's type."""
        self.asked = None
        self.state.refill_failed(self.ctx.partition, step=self.ctx.step, call_id=self.call_id,
                                 poll=poll, error=exc, count=dispatch)


def _call(ctx: PollContext, consume: bool = True) -> str:
    """The call as its caller wrote it: `sample` or `wait_for_sampleable`."""
    if not consume:
        return (f"wait_for_sampleable(global_steps={ctx.step}, partition={ctx.partition!r}, "
                f"target_count={ctx.batch_size})")
    return (f"sample(global_steps={ctx.step}, partition={ctx.partition!r}, "
            f"batch_size={ctx.batch_size})")


def _check_time(ctx: PollContext, timeout: float | None, deadline: float | None, now: float,
                part: PartitionState, state: BufferState, st: CallState,
                cfg: BufferConfig, consume: bool) -> None:
    """Every poll honours the timeout, also one that just asked for a refill; the error says
    why the batch is short as far as the buffer can tell."""
    if deadline is None or now < deadline:
        return
    hint = ""
    if st.refilled:
        flying = len(part.inflight)
        seen = ", ".join(f"{n} {r}" for r, n in sorted(st.evicted.items()) if n) or "none"
        hint = (f"; this call asked refill_fn for {st.refilled} new prompt(s) and "
                + (f"{flying} group(s) still in flight (pending/running) have not finished: "
                   "their rollouts are late or stalled" if flying else
                   "none of them is in flight: refill_fn returned without registering them, "
                   f"or they were evicted in turn (evicted in this call: {seen})"))
    elif part.candidates.alive_count >= ctx.batch_size and cfg.gate is not None and \
            not cfg.gate.open(ctx.step, part.oldest_inflight()):
        hint = _gate_hint(ctx, part, cfg.gate)
    elif not part.groups and not part.removed_uids and not part.candidates.alive_count:
        known = [p for p, s in state.partitions() if p != ctx.partition and s.groups]
        hint = (f"; partition {ctx.partition!r} has never received a group (known partitions: "
                f"{known or 'none'})")
    raise SampleTimeout(f"{_call(ctx, consume)} timed out after {timeout}s with "
                        f"{part.candidates.alive_count} sampleable group(s){hint}", part.counts())


def _gate_hint(ctx: PollContext, part: PartitionState, gate: WaitGate) -> str:
    """Why a call with enough sampleable groups did not return under `wait`: the in-flight
    groups old enough to block it, oldest first."""
    late = sorted((gs, u) for u, gs in part.inflight.items() if blocks(ctx.step, gs, gate.threshold))
    spans = decide.group_spans(ctx.step, [gs for gs, _ in late[:3]])
    named = ", ".join(f"{u!r} (dispatched at step {gs}, group span {s})"
                      for (gs, u), s in zip(late, spans))
    more = f" and {len(late) - 3} more" if len(late) > 3 else ""
    return (f"; max_off_policy_strategy='wait' holds the batch while an in-flight group has "
            f"group span >= {gate.threshold}: {len(late)} such group(s), {named}{more}. Finish or "
            "fail them (update_status), reissue them, or retire them")


def _ready(cfg: BufferConfig, part: PartitionState, ctx: PollContext, o: PollOutcome,
           st: CallState) -> bool:
    """Whether the call may hand out its batch: enough sampleable groups, the gate (if any)
    open, and the refill policy done (sync DAPO waits for its in-flight groups)."""
    if o.sampleable < ctx.batch_size:
        return False
    gate = cfg.gate
    if gate is not None and not gate.open(ctx.step, part.oldest_inflight()):
        return False
    return cfg.refill.may_finish(o, st)


def _eviction_rows(ctx: PollContext, call_id: int, poll: int, ev: decide.Eviction) -> Columns:
    """The poll's `evict` rows: one per group and reason, with the value the rule saw."""
    fired = ev.rows()
    return decision_rows(
        "evict", partition=ctx.partition, step=ctx.step, call_id=call_id, poll=poll,
        uids=[ev.uids[i] for i, _ in fired], reason=[r for _, r in fired],
        group_span=[ev.group_spans[i] for i, _ in fired],
        value=[ev.values[r][i] if r in ev.values else None for i, r in fired])


def _outcome(part: PartitionState, ev: decide.Eviction | None) -> PollOutcome:
    """What the poll found, as its refill policy sees it: with its evictions applied (they are
    written in the same write as the refill they decide, so they are not applied yet here), or,
    ``ev`` None, as if it had evicted nothing."""
    sampleable, inflight = part.candidates.alive_count, len(part.inflight)
    if ev is None or not ev.count:
        return PollOutcome(0, {}, 0, 0, sampleable, inflight)
    gone = set(ev.uids)
    return PollOutcome(ev.count, ev.by_reason(), sum(ev.credits),
                       sum(1 for c in ev.credits if c >= 2),
                       sampleable - part.candidates.count_of(gone),
                       inflight,      # (a poll evicts candidates only: terminal groups)
                       free_credit=sum(c for c in ev.credits if c < 2),
                       uids=tuple(ev.uids), credits=tuple(ev.credits))
