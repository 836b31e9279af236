"""The buffer's state, in one home: lock, version, partitions, journal, id counters, listeners.

Every change goes through `commit(table, rows)`: stamp the rows with seq numbers, write them to the
lake (when there is one), then `apply` them. Restore replays the lake through the very same
`apply`, decisions included (the refills a partition owes too), so a restarted buffer is the
buffer that was acknowledged before the crash. Callers use the methods below (the lock, the change
counter, the batch and call counters, the partitions); nothing outside this module touches the
attributes behind them.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline import interrupts
from pipeline.errors import InvariantError
from pipeline.state.decisions import decision_rows
from pipeline.state.journal import Columns, Journal, column_values, value_at
from pipeline.state.partition import PartitionState, Unreported

if TYPE_CHECKING:
    from pipeline.decide.policies import SelectionOrder

log = logging.getLogger("replaylake")
_DECISION_RUN = itemgetter(0, 1, 3, 4)   # rows of one effect: partition, kind, batch_id, step


@dataclass(frozen=True)
class RefillAsk:
    """A poll's refill decision before it is written: its rows (None: nothing to record), the
    prompts refill_fn is to be asked for now (0: none), and what the poll itself wanted, with
    the evictions it replaces."""

    rows: Columns | None
    dispatch: int
    wanted: int
    replaces: list[str]

Listener = Callable[[str, str, list[str], "int | None"], None]


def _raise_first(errors: list[BaseException]) -> None:
    """Raise the first of ``errors`` (the others as notes on it)."""
    if errors:
        for other in errors[1:]:
            errors[0].add_note(f"(and then: {other!r})")
        raise errors[0]


class BufferState:
    """Lock, partitions and journal of one buffer (see the module docstring)."""

    def __init__(self, journal: Journal, filter_metric: str | None,
                 order: SelectionOrder | None = None):
        # `locked()` hands out the RLock itself: its enter and exit are C calls, so a signal
        # cannot raise between acquiring it and entering the `with` body (a Condition's Python
        # `__enter__` could, leaving the lock held by a thread no longer in any call)
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self.journal = journal
        self.filter_metric = filter_metric
        self.order = order         # the declared selection order of every partition (None: oldest)
        self._parts: dict[str, PartitionState] = {}
        self._version = 0          # bumps on every change: a waiting sample re-polls
        self._next_batch = 0
        self._next_call = 0
        self._listeners: list[Listener] = []
        self._held_errors: list[BaseException] | None = None   # see `listeners_after`
        self.broken: str | None = None   # why memory may differ from the lake (see `commit`)
        self.closed = False              # `close` was called: waiting calls end (see `close`)

    # --- the lock and the change counter -----------------------------------------------------
    def locked(self) -> Any:
        """The buffer's lock, as a context manager (re-entrant): `with state.locked(): ...`."""
        return self._lock

    def wait(self, timeout: float | None) -> None:
        """Release the lock until a change is committed or ``timeout`` seconds pass."""
        self._cond.wait(timeout)

    def close(self) -> None:
        """Mark the buffer closed and wake every waiting call: a `sample` or a `put` waiting
        for room ends at its next check instead of waiting out its timeout (or forever)."""
        with self._lock:
            self.closed = True
            self._cond.notify_all()

    @property
    def version(self) -> int:
        """How many changes were committed: a poll that saw this value saw them all."""
        return self._version

    def add_listener(self, fn: Listener) -> None:
        with self._lock:
            self._listeners.append(fn)

    @contextmanager
    def listeners_after(self) -> Iterator[None]:
        """Within (the lock held throughout): a listener that raises stops nothing of the
        block's work, whose changes are written already; its error is raised once the block
        is done (a poll then finishes: its refill decided, its batch kept for the retry).
        An error the block raises itself goes out instead."""
        outer, self._held_errors = self._held_errors, []
        try:
            yield
        finally:
            errors, self._held_errors = self._held_errors, outer
        _raise_first(errors)

    # --- partitions and groups ---------------------------------------------------------------
    def part(self, partition: str) -> PartitionState:
        """The partition's state, made empty on first use (a call may wait for its groups)."""
        p = self._parts.get(partition)
        if p is None:
            p = self._parts[partition] = PartitionState(partition, self.filter_metric,
                                                          self.order)
        return p

    def find(self, partition: str) -> PartitionState | None:
        """The partition's state, or None when nothing ever named it."""
        return self._parts.get(partition)

    def partitions(self) -> list[tuple[str, PartitionState]]:
        """Every partition's state, by id."""
        return sorted(self._parts.items())

    def lookup(self, partition: str, uid: str) -> Any:
        p = self._parts.get(partition)
        if p is None:
            return None
        g = p.groups.get(uid)       # a live group: `PartitionState.lookup` without its call
        return g if g is not None else p.lookup(uid)

    def stored_rows(self, partition: str, uid: str) -> pa.Table:
        """The rows stored for a live group (in memory), in arrival order."""
        return self._parts[partition].payload([uid])

    def dispatch_steps(self, partitions: list[str], uids: list[str]) -> list[int]:
        """The dispatch step of each live group named (validated input: every one exists)."""
        parts = self._parts
        return [parts[p].groups[u].dispatch_step for p, u in zip(partitions, uids)]

    def held_bytes(self) -> int:
        """Trajectory payload held in memory, over every partition."""
        return sum(p.rows.held_bytes for p in self._parts.values())

    def new_call(self) -> int:
        with self._lock:
            call_id = self._next_call
            self._next_call += 1
            return call_id

    def next_batch_id(self) -> int:
        """The id the next selection's batch gets (taken when its `select` rows are applied)."""
        return self._next_batch

    @property
    def lake(self) -> Any:
        """The lake writer, or None for a buffer in memory only."""
        return self.journal.lake

    # --- refills: what is owed, through the decision rows --------------------------------------
    def refill_ask(self, partition: str, wanted: int, replaces: list[str], *,
                   step: int, call_id: int, poll: int, policy: str,
                   limit: Callable[[], int | None] | None = None) -> RefillAsk:
        """A poll's refill, decided, not written (`write_poll` writes it with the poll's
        evictions): ask for ``wanted`` new prompts plus every one the partition still owes. Its
        `refill` row, once applied, is what is owed until the ask is served (a restart replays
        it).

        ``limit()`` (asked only when something is owed; None: no limit) caps the ask, as
        admission does: the rest is held back to a later poll's ask, with the evictions it
        replaces (oldest replaced first), and a `refill_deferred` row beside the ask (or alone,
        when nothing could be asked) records it, so a restart still owes it. While an earlier
        ask is still running (`refill_asking`), everything wanted is held back that way."""
        part = self.part(partition)
        deferred, later = part.refill_deferred
        common = {"partition": partition, "step": step, "call_id": call_id, "poll": poll,
                  "reason": policy}
        total = wanted + part.refill_owed + deferred
        if part.refill_asking or not total:
            dispatch = 0
        else:
            cap = None if limit is None else limit()
            dispatch = total if cap is None else min(total, max(cap, 0))
        if not dispatch:                 # all held back (what an earlier ask owes stays owed)
            return RefillAsk(decision_rows("refill_deferred", **common, count=deferred + wanted,
                                           replaces=later + replaces) if wanted else None,
                             0, wanted, replaces)
        named = part.refill_replaces + later + replaces
        rows = decision_rows("refill", **common, count=dispatch, replaces=named[:dispatch])
        if dispatch < total:             # one prompt per eviction: the oldest replaced first
            rows = Columns.concat([rows, decision_rows(
                "refill_deferred", **common, count=total - dispatch,
                replaces=named[dispatch:])])
        return RefillAsk(rows, dispatch, wanted, replaces)

    def write_poll(self, part: PartitionState, evictions: Columns | None,
                   ask: RefillAsk | None, *, step: int,
                   owed_if_lost: Callable[[], tuple[int, list[str]]] | None = None) -> None:
        """Write a poll's evictions and the refill they earn as one write, so a crash keeps
        both or neither: never an eviction without its replacement's ask.

        Should it not be written, nothing is applied: the next poll finds the same groups
        and decides their refill again. Memory then owes only what ``owed_if_lost()`` says
        (prompts earned by evictions already written, which no poll finds again)."""
        rows = [r for r in (evictions, None if ask is None else ask.rows) if r is not None]
        if not rows:
            return
        seen = self._version
        try:
            self.commit("decisions", rows[0] if len(rows) == 1 else Columns.concat(rows))
        except BaseException:
            if self._version == seen and owed_if_lost is not None:   # nothing applied
                wanted, replaces = owed_if_lost()
                if wanted:
                    part.owe_refill(wanted, replaces)
            raise
        if ask is not None and ask.dispatch:
            part.asked_unregistered(step, ask.dispatch)  # in flight until their groups register

    def refill_served(self, partition: str, count: int, replaced: int) -> None:
        """refill_fn returned: its ``count`` prompts and the first ``replaced`` evictions they
        replace are owed no more (what later polls owed meanwhile stays owed). No row: the
        lake's readers count every `refill` without a `refill_failed` beside it as served."""
        self.part(partition).refill_served(count, replaced)

    def refill_failed(self, partition: str, *, step: int, call_id: int, poll: int,
                      error: BaseException, count: int) -> None:
        """The ask decided at ``poll`` served nothing: a `refill_failed` row named by the
        exception's type; its prompts stay owed."""
        with self._lock:
            part = self.part(partition)
            part.asked_unregistered(step, -count)   # no group of this ask is coming
            self.commit("decisions", decision_rows(
                "refill_failed", partition=partition, step=step, call_id=call_id, poll=poll,
                reason=type(error).__name__, count=count, replaces=list(part.refill_replaces)))

    # --- the one write path --------------------------------------------------------------------
    def commit(self, table: str, rows: pa.Table | Columns | list[dict]
               ) -> pa.Table | Columns | None:
        """Stamp, write durably, apply, wake waiters. Call with the lock held.

        Whole or not at all, in memory and on disk alike: an interrupt meanwhile is held to the
        end (`pipeline.interrupts`), a failed write is taken back before it raises (nothing
        applied), and a write that is on disk is always applied. Should applying it fail (a bug),
        memory no longer matches the lake: the state then refuses every later change, and
        reopening the lake restores what is on disk."""
        return self.commit_many([(table, rows)])[0]

    def commit_many(self, items: list[tuple[str, pa.Table | Columns | list[dict]]]
                    ) -> list[pa.Table | Columns | None]:
        """`commit` for one change that writes rows of several tables (``items``, applied in
        that order): one write, so a crash or a failed write keeps all of them or none."""
        if self.broken is not None:
            raise InvariantError(self.broken)
        with interrupts.held():
            done = self.journal.record_many(items)
            effects: list[tuple[str, str, list[str], int | None]] = []
            for (table, _), stamped in zip(items, done):
                if stamped is None:
                    continue
                try:
                    self.apply(table, stamped, effects)
                except BaseException as exc:
                    again = ("close it and open the lake again (a restart restores exactly what "
                             "is on disk)") if self.journal.lake is not None else "make a new one"
                    self.broken = (f"applying {stamped.num_rows} acknowledged row(s) of table "
                                   f"{table!r} to memory failed ({exc!r}): this buffer no longer "
                                   f"matches what it acknowledged and takes no more changes; "
                                   f"{again}")
                    raise InvariantError(self.broken) from exc
            self._version += 1
            self._cond.notify_all()
            # listeners last: one that raises (an adapter's data plane) leaves the state whole,
            # and every other listener and effect is still told
            errors = []
            for effect in effects:
                for fn in self._listeners:
                    try:
                        fn(*effect)
                    except Exception as exc:      # noqa: BLE001 - raised below, or after the poll
                        exc.add_note(f"(raised by a listener told of {effect[0]!r} in partition "
                                     f"{effect[1]!r} after the buffer wrote that change: the "
                                     "change stands)")
                        errors.append(exc)
            if self._held_errors is not None:
                self._held_errors.extend(errors)
            else:
                _raise_first(errors)
        return done

    def apply(self, table: str, rows: pa.Table | Columns,
              effects: list[tuple[str, str, list[str], int | None]] | None = None) -> None:
        """Apply stamped rows of one lake table (live calls and restore alike); ``effects`` gets
        what the listeners are to be told of, (kind, partition, uids, batch_id) each."""
        if table == "group_events":
            self._apply_group_events(rows)
        elif table == "trajectories":
            self._apply_trajectories(rows)
        elif table == "decisions":
            self._apply_decisions(rows, effects)
        elif table == "metrics" and effects is None:    # restore only: a live call took them
            self._apply_reports(rows)
        # metric rows are history otherwise

    def _apply_reports(self, rows: pa.Table) -> None:
        """Restore: metric rows without a batch are the eviction metrics a
        `wait_for_sampleable` reported; the evictions before them are reported, and no later
        batch repeats them."""
        for p in set(rows.filter(pc.is_null(rows.column("batch_id"))).column("partition")
                     .to_pylist()):
            part = self.part(p)
            part.restored_evictions.clear()
            part.restored_discards = 0

    def _apply_group_events(self, rows: pa.Table | Columns) -> None:
        """Row by row in order, handed to the partition a run of one partition and event at a
        time (a poll registers, then finishes, ~64 groups: one call each, not 64)."""
        uid, steps, ns, seqs, prompt_ids, datasets = (
            column_values(rows, c) for c in
            ("uid", "global_steps", "n", "seq", "prompt_id", "dataset"))
        at = 0
        for (p, ev), run in groupby(zip(column_values(rows, "partition"),
                                        column_values(rows, "event"))):
            end = at + len(list(run))
            part = self.part(p)
            if ev == "registered":
                part.apply_registered_many(uid[at:end], steps[at:end], ns[at:end],
                                           prompt_ids[at:end], datasets[at:end])
            elif ev == "reissued":
                for u, gs in zip(uid[at:end], steps[at:end]):
                    part.apply_reissued(u, gs)
            else:
                part.apply_status_many(uid[at:end], ev, seqs[at:end])
            at = end

    def _apply_trajectories(self, rows: pa.Table) -> None:
        parts = rows.column("partition").unique().to_pylist()
        for p in parts:
            sub = rows if len(parts) == 1 else rows.filter(pc.equal(rows["partition"], p))
            self.part(p).apply_trajectories(sub)

    def _apply_decisions(self, rows: pa.Table | Columns,
                         effects: list[tuple[str, str, list[str], int | None]] | None) -> None:
        cols = [column_values(rows, c) for c in
                ("partition", "kind", "uid", "batch_id", "step", "call_id")]
        calls = [c for c in cols[5] if c is not None and c >= 0]
        if calls:
            self._next_call = max(self._next_call, max(calls) + 1)
        at = 0
        for (p, kind, batch_id, step), grp in groupby(zip(*cols), key=_DECISION_RUN):
            run = list(grp)
            at += len(run)
            part = self.part(p)
            uids = list(dict.fromkeys(r[2] for r in run))   # 2 reasons -> 2 rows, 1 removal
            if batch_id is not None:
                self._next_batch = max(self._next_batch, batch_id + 1)
            if kind == "evict":
                part.apply_removed(uids, "evicted")
                if effects is None:        # restore: a call's evictions await their report
                    self._restored_evictions(part, rows.slice(at - len(run), len(run)))
            elif kind == "discard":
                part.apply_removed(uids, "discarded")
                if effects is None:        # restore: reported with the call's batch, if any
                    part.restored_discards += len(uids)
            elif kind == "select":
                part.apply_removed(uids, "sampled", batch_id, step)
                request = value_at(rows, "request", at - len(run))
                if request is not None:
                    part.batch_request[batch_id] = request
                if effects is None:   # restore; a live selection keeps its own (`select`)
                    self._batch_marks(part, batch_id, rows.slice(at - len(run), len(run)))
                    if request is not None:     # what the call reported, should it be sent again
                        part.batch_reported[batch_id] = Unreported(
                            list(part.restored_evictions), part.restored_discards)
                part.restored_evictions.clear()    # reported with this batch's metrics
                part.restored_discards = 0
            elif kind == "release":
                uids = part.apply_released(batch_id)
            else:
                # refills: the last row of the run says what is owed now (rows a few, rare)
                count, named = (value_at(rows, c, at - 1) for c in ("count", "replaces"))
                if kind == "refill":
                    part.apply_refill(count, named or [])
                elif kind == "refill_deferred":
                    part.apply_refill_deferred(count, named or [])
                elif kind == "refill_failed":
                    part.apply_refill_failed()
                continue   # refills change no group
            if effects is not None:
                effects.append((kind, p, uids, batch_id))

    @staticmethod
    def _batch_marks(part: PartitionState, batch_id: int, rows: pa.Table | Columns) -> None:
        """Keep what a selection recorded of each group (its reason: masked or not, and its
        bound) and the strategy that set the bounds, for `held_batch` to rebuild it as chosen."""
        uids, reasons, bounds, strategies = (column_values(rows, c) for c in
                                             ("uid", "reason", "bound", "strategy"))
        marks = part.batch_marks.setdefault(batch_id, ({}, None))[0]
        marks.update(zip(uids, zip(reasons, bounds)))
        part.batch_marks[batch_id] = (marks, next((x for x in strategies if x is not None), None))

    @staticmethod
    def _restored_evictions(part: PartitionState, rows: pa.Table | Columns) -> None:
        """Keep the evictions of sample calls (not `retire`'s) as (reason, group span, value):
        those no later batch of the partition reported go out with its next batch's metrics,
        as they would have in the process that took them."""
        calls, reasons, spans, values = (column_values(rows, c) for c in
                                         ("call_id", "reason", "group_span", "value"))
        part.restored_evictions.extend(
            (r, g, v) for c, r, g, v in zip(calls, reasons, spans, values) if c is not None and c >= 0)

    def settle_restored(self) -> None:
        """After restore: the last ask the lake shows without a `refill_failed` row counts as
        served (as the lake's readers count it); prompts of it no group registered are said,
        and `lost_ask_rows` owes them again when the caller says the rollout side is gone."""
        for pid, part in self._parts.items():
            lost = part.settle_asked()
            if lost:
                log.warning("restore: %d prompt(s) of the last refill ask of partition %r have "
                            "no registered group (the process stopped first); if the rollout "
                            "side stopped with it, reissue() or resume() owes them again and "
                            "the next sample asks refill_fn for them", lost, pid)

    def lost_ask_rows(self, partition: str, step: int) -> Columns | None:
        """The row that owes again the prompts of the restored lake's last ask that no group
        registered (the rollout side that was asked is gone): a `refill_deferred` row (reason
        ``reissue``), so the next poll asks for them, and a restart still owes them. None when
        there are none. Not written: the caller commits it with the rest of its change, then
        calls `lost_ask_owed`."""
        part = self.part(partition)
        lost, names = part.lost_ask
        if not lost:
            return None
        deferred, later = part.refill_deferred
        return decision_rows("refill_deferred", partition=partition, step=step, reason="reissue",
                             count=deferred + lost, replaces=later + names)

    def lost_ask_owed(self, partition: str) -> None:
        """The row of `lost_ask_rows` is written: those prompts are owed through it now."""
        self.part(partition).lost_ask = (0, [])
