"""Live state of one partition: groups and their lifecycle, in-flight set, candidates, payload.

Every mutation is an `apply_*` method taking rows already validated and already written to the
lake (pipeline/state/buffer_state.py calls them, for live calls and for restore alike), which is
why restarting on a lake gives back the same buffer.
"""
from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from pipeline.state.candidates import CandidateIndex
from pipeline.state.payload import Gather, TrajectoryRows

if TYPE_CHECKING:
    from pipeline.decide.policies import SelectionOrder

_SMALL = 32                 # a group keeps up to this many (session, index) keys in a tuple
_PAIRS: dict[tuple[int, int], tuple[int, int]] = {}   # one shared tuple per common key


def _pair(session: int, index: int) -> tuple[int, int]:
    """The (session, index) key, shared between groups when small (bounded: 64k pairs)."""
    key = (session, index)
    return _PAIRS.setdefault(key, key) if session < 1024 and index < 64 else key


class Group:
    """One prompt group's lifecycle and where its trajectories are stored.

    Kept compact, since a buffer holds one per prompt group (memory should stay near the Arrow
    payload): row ids are a `range` while they arrive contiguously (one put per group, the
    usual case), else a list; keys are a tuple of shared pairs up to 32 of them, else a set;
    sessions are derived from the keys. A set of a few tuples costs several times this."""

    __slots__ = ("uid", "dispatch_step", "n", "status", "rows", "keys", "removed", "batch_id",
                 "prompt_id", "dataset")

    def __init__(self, uid: str, dispatch_step: int, n: int | None, prompt_id: int | None = None,
                 dataset: str | None = None):
        # the step the group was dispatched at (`global_steps`), not a weight version
        self.uid, self.dispatch_step, self.n, self.prompt_id = uid, dispatch_step, n, prompt_id
        self.dataset = dataset
        self.status = "pending"
        self.rows: range | list[int] = range(0)
        self.keys: tuple[tuple[int, int], ...] | set[tuple[int, int]] = ()
        self.removed: str | None = None   # None while kept; else sampled|evicted|discarded
        self.batch_id: int | None = None

    @property
    def sessions(self) -> set[int]:
        return {s for s, _ in self.keys}

    def add(self, row: int, session: int, index: int) -> None:
        """Record one stored trajectory of this group."""
        self.add_run(row, row + 1, (_pair(session, index),))

    def add_run(self, start: int, stop: int, keys: Sequence[tuple[int, int]]) -> None:
        """Record the stored trajectories ``start..stop-1`` of this group, whose (session,
        index) keys are ``keys`` (shared pairs), in order: what `add` does row by row."""
        rows = self.rows
        if type(rows) is range and (not rows or rows.stop == start):
            self.rows = range(rows.start if rows else start, stop)
        else:
            if type(rows) is range:
                rows = self.rows = list(rows)
            rows.extend(range(start, stop))
        if self.keys == () and len(keys) <= _SMALL and len(set(keys)) == len(keys):
            self.keys = tuple(keys)          # a new group's sessions, all at once
            return
        for key in keys:
            self._add_key(key)

    def _add_key(self, key: tuple[int, int]) -> None:
        keys = self.keys
        if type(keys) is tuple:
            if key in keys:
                return
            if len(keys) < _SMALL:
                self.keys = keys + (key,)
                return
            keys = self.keys = set(keys)
        keys.add(key)


@dataclass(frozen=True)
class GroupView:
    """A read-only snapshot of one group, as `ReplayBuffer.lookup` returns it.

    ``removed`` is None for a kept group, `sampled` for a group in an unreleased batch and
    `retired` for one that is gone for good (released, evicted, discarded): never accepted again."""

    uid: str
    global_steps: int | None
    n: int | None
    status: str
    removed: str | None
    batch_id: int | None
    keys: frozenset[tuple[int, int]]
    prompt_id: int | None = None
    dataset: str | None = None

    @property
    def sessions(self) -> frozenset[int]:
        return frozenset(s for s, _ in self.keys)


def view(uid: str, g: Group | None, retired: bool) -> GroupView | None:
    """The frozen view of a live group, a retired marker, or None for an unknown uid."""
    if g is None:
        return GroupView(uid, None, None, "removed", "retired", None, frozenset()) \
            if retired else None
    # made as the dataclass's __init__ would, at half its cost (its frozen __setattr__ per
    # field): an adapter looks up every new group of every poll
    v = _new(GroupView)
    v.__dict__.update(uid=uid, global_steps=g.dispatch_step, n=g.n, status=g.status,
                      removed=g.removed, batch_id=g.batch_id, keys=frozenset(g.keys),
                      prompt_id=g.prompt_id, dataset=g.dataset)
    return v


_new = object.__new__


@dataclass(frozen=True)
class Unreported:
    """What a restored lake says of the eviction metrics a held batch's `sample` reported: the
    evictions and discards of the calls it reported (read back from the decision log); its
    metric rows are read from the lake only if that call is sent again."""

    evictions: list[tuple[str, int | None, float | None]]    # (reason, group span, value)
    discards: int


class PartitionState:
    """Groups, in-flight set, candidate index and trajectory payload of one partition."""

    def __init__(self, partition: str, filter_metric: str | None,
                 order: SelectionOrder | None = None):
        self.partition = partition
        self.filter_metric = filter_metric   # aggregated everywhere; rules skip validation
        self.groups: dict[str, Group] = {}
        self.inflight: dict[str, int] = {}       # uid -> global_steps of pending/running groups
        self._inflight_heap: list[tuple[int, str]] = []
        self.candidates = CandidateIndex(order)   # order: the declared selection order
        self.rows = TrajectoryRows()
        self.batches: dict[int, list[str]] = {}  # selected, not yet released
        self.batch_step: dict[int, int] = {}     # batch id -> step it was sampled at
        # batch id -> what its selection recorded per group: uid -> (reason, bound), and the
        # strategy (a held batch is rebuilt from these, never from today's configuration)
        self.batch_marks: dict[int, tuple[dict[str, tuple[str | None, int | None]], str | None]] = {}
        # batch id -> the request key its `sample` named, and what that call reported (eviction
        # metrics, zero-variance reward counts), or after a restore what the lake says of it
        # (`pipeline.decide.selection.again`); held batches only
        self.batch_request: dict[int, str] = {}
        self.batch_reported: dict[int, Any] = {}
        self.selected_at: dict[int, int] = {}    # step -> groups selected at it (released too)
        self._selected_ascending = True          # selected_at's keys came in ascending order
        self.removed_uids: set[str] = set()           # removed uids: never accepted again
        self.refill_owed = 0                     # prompts decided, not yet served (see below)
        self.refill_replaces: list[str] = []     # the evicted uids those prompts replace
        self.refill_deferred: tuple[int, list[str]] = (0, [])   # owed, held back by admission
        self._asked: tuple[int, int] | None = None   # (count, replaced) of the last ask in the
        #                                          lake not yet known served or failed
        self._registered_since_ask = 0           # groups registered since that ask's row
        self.lost_ask: tuple[int, list[str]] = (0, [])   # restore: prompts of the last ask no
        #                  group registered after (owed again by `reissue` / `resume`)
        self.restored_evictions: list[tuple[str, int | None, float | None]] = []   # restore:
        #                  (reason, group span, value) of evictions by calls no batch reported
        self.restored_discards = 0               # restore: groups discarded by calls no batch
        #                  reported (a crash between a call's discard and its selection)
        self._unregistered = (-1, 0)             # (step, prompts) asked at it, not registered yet
        self.refill_asking = False               # refill_fn still running past a call's deadline
        self.refill_done: Any = None             # ... and the threading.Event it sets on return
        self.refill_thread: int | None = None    # ... and the thread running refill_fn
        self.unreported: Any = None              # EvictionMetrics of calls that raised
        self.starving: dict[str, int] = {}       # dataset -> consecutive steps without a row
        self.starving_step: int | None = None    # the last step the starvation signal counted
        self.undelivered: Any = None             # (Batch, call id) a sample chose and has
        #                  not returned yet (see pipeline.decide.selection)
        self.examined: Any = None                # what the rules said of each group at the
        #                  current step (pipeline.decide.evaluate.Examined), made by its first poll

    # --- producers ---------------------------------------------------------------------------
    def _fly(self, uid: str, gs: int) -> None:
        self.inflight[uid] = gs
        heapq.heappush(self._inflight_heap, (gs, uid))

    def _land(self, uid: str) -> None:
        """The group is in flight no more. Its heap entry is dropped lazily; once most entries
        are stale the heap is rebuilt from the in-flight set (amortised O(1) per group), so
        settled groups do not keep an entry each."""
        self.inflight.pop(uid, None)
        if len(self._inflight_heap) > 2 * len(self.inflight) + 1024:
            self._inflight_heap = [(gs, u) for u, gs in self.inflight.items()]
            heapq.heapify(self._inflight_heap)

    def apply_registered(self, uid: str, gs: int, n: int | None,
                         prompt_id: int | None = None, dataset: str | None = None) -> None:
        self.apply_registered_many((uid,), (gs,), (n,), (prompt_id,), (dataset,))

    def apply_registered_many(self, uids: Sequence[str], steps: Sequence[int],
                              ns: Sequence[int | None], prompt_ids: Sequence[int | None],
                              datasets: Sequence[str | None] | None = None) -> None:
        """`apply_registered` of each row in order, in one loop (a poll registers ~64)."""
        groups, inflight, push = self.groups, self.inflight, heapq.heappush
        step, asked = self._unregistered
        if asked:
            self._unregistered = (step, max(asked - len(uids), 0))
        self._registered_since_ask += len(uids)
        if datasets is None:
            datasets = [None] * len(uids)
        for uid, gs, n, prompt_id, dataset in zip(uids, steps, ns, prompt_ids, datasets):
            groups[uid] = Group(uid, gs, n, prompt_id, dataset)
            inflight[uid] = gs                           # `_fly`, inline
            push(self._inflight_heap, (gs, uid))

    def apply_status(self, uid: str, status: str, seq: int) -> None:
        self.apply_status_many((uid,), status, (seq,))

    def served_status(self, uid: str) -> str:
        """The status a batch serves group ``uid`` with (after it left the candidates, e.g. a
        batch held across a restart): 'failure' when it failed or holds no rows, else
        'finished'."""
        group = self.groups[uid]
        return "failure" if group.status == "failure" or not group.keys else "finished"

    def apply_status_many(self, uids: Sequence[str], status: str, seqs: Sequence[int]) -> None:
        """`apply_status` of each group in order, all to the same ``status``."""
        groups = self.groups
        if status not in ("finished", "failure"):
            for uid in uids:
                groups[uid].status = status
            return
        add = self.candidates.add
        for uid, seq in zip(uids, seqs):
            g = groups[uid]
            g.status = status
            self._land(uid)
            add(g.uid, g.dispatch_step, seq, status)                # the registered uid's one string

    def apply_reissued(self, uid: str, gs: int) -> None:
        """In-flight group back to pending at the resume step; its partial trajectories dropped."""
        g = self.groups[uid]
        self.rows.drop(g.rows)
        self.groups[uid] = Group(uid, gs, g.n, g.prompt_id, g.dataset)
        self._fly(uid, gs)

    def apply_trajectories(self, rows: pa.Table) -> None:
        """Store the rows; each run of one group's rows is recorded at once (a put sends a
        group's sessions together: 64 runs for 256 rows, not 256 calls)."""
        groups, pairs = self.groups, _PAIRS
        first = self.rows.append(rows).start
        keys = [pairs.setdefault(k, k) if k[0] < 1024 and k[1] < 64 else k for k in
                zip(rows.column("session_id").to_pylist(), rows.column("index").to_pylist())]
        at = 0
        for u, run in groupby(rows.column("uid").to_pylist()):
            n = len(list(run))
            groups[u].add_run(first + at, first + at + n, keys[at:at + n])
            at += n

    # --- refills -----------------------------------------------------------------------------
    # A `refill` row asks for everything owed (its count and replaces are the whole debt), so
    # applying it sets what is owed; a `refill_failed` row leaves the debt as it is. Serving an
    # ask writes no row (the lake's readers count an ask served unless it failed), so restore
    # settles the last ask it saw as served once the lake is replayed.
    #
    # Prompts admission held back are owed too: a `refill_deferred` row after the ask (or alone,
    # when nothing could be asked) records them, so a restart owes them as the run did.
    def apply_refill(self, count: int, replaces: list[str]) -> None:
        self.refill_owed, self.refill_replaces = count, list(replaces)
        self._asked = (count, len(replaces))
        self._registered_since_ask = 0
        self.refill_deferred = (0, [])      # an ask takes what was held back (a row after it
        #                                    holds back what it could not take)

    def apply_refill_deferred(self, count: int, replaces: list[str]) -> None:
        self.refill_deferred = (count, list(replaces))

    def apply_refill_failed(self) -> None:
        self._asked = None

    def owe_refill(self, wanted: int, replaces: list[str]) -> None:
        """Prompts a poll wanted that no row asked for yet (the next ask includes them)."""
        self.refill_owed += wanted
        self.refill_replaces = self.refill_replaces + replaces

    def refill_served(self, count: int, replaced: int) -> None:
        self.refill_owed -= count
        self.refill_replaces = self.refill_replaces[replaced:]
        self._asked = None

    def asked_unregistered(self, step: int, count: int) -> None:
        """An ask of ``count`` prompts decided at ``step`` (negative: an ask that failed): in
        flight for admission until as many groups are registered (see `unregistered`)."""
        at, asked = self._unregistered
        self._unregistered = (step, max((asked if at == step else 0) + count, 0))

    def unregistered(self, step: int) -> int:
        """Prompts refill_fn was asked for at ``step`` that no registration has matched yet.

        A refill_fn may hand its ask to the rollout side and return before the new groups are
        registered (they are in flight, only not yet visible); admission counts them with the
        groups in flight from the ask on, or the next poll would see the same room and ask
        again (a refill_fn that registers before it returns has matched them by then). Any group
        registered in the partition counts against them (registrations carry nothing that ties
        them to an ask); prompts never registered count only within their step, so a lost ask
        holds no place for good. Memory only: a restart starts from 0, as before any ask."""
        at, asked = self._unregistered
        return asked if at == step else 0

    def settle_asked(self) -> int:
        """After restore: the last ask in the lake (neither failed nor followed by another)
        counts as served, as the lake's readers count it. Its prompts that no group registered
        after it (the process stopped first) are kept aside in `lost_ask`: `reissue` / `resume`
        (the rollout side died with the process) owe them again. Returns how many there are."""
        if self._asked is None:
            return 0
        count, replaced = self._asked
        served = min(count, self._registered_since_ask)
        names = self.refill_replaces[min(replaced, served):replaced]
        self.refill_served(count, replaced)
        self.lost_ask = (count - served, names)
        return count - served

    # --- the consumer ------------------------------------------------------------------------
    def apply_removed(self, uids: list[str], how: str, batch_id: int | None = None,
                      step: int | None = None) -> None:
        """Selected groups keep their rows until release; evicted/discarded groups leave memory
        now (the lake keeps them). Either way the uid is retired: never accepted again."""
        self.candidates.remove(uids)
        inflight, groups, removed = self.inflight, self.groups, self.removed_uids
        removed.update(uids)
        for u in uids:
            if u in inflight:          # a group retired while in flight; terminal ones landed
                self._land(u)
        if how == "sampled":
            self._count_selected(step, len(uids))
            batch = self.batches.setdefault(batch_id, [])
            for u in uids:
                g = groups[u]
                g.removed, g.batch_id = how, batch_id
                batch.append(u)
            self.batch_step[batch_id] = step
        else:
            for u in uids:
                self.rows.drop(groups.pop(u).rows)

    def _count_selected(self, step: int, n: int) -> None:
        at = self.selected_at
        if step not in at and at and step < next(reversed(at)):
            self._selected_ascending = False
        at[step] = at.get(step, 0) + n

    def selected_since(self, step: int) -> int:
        """Groups selected at steps >= ``step``, released or not (the places of those steps that
        admission counts as taken). Steps normally grow, so only the newest few are summed."""
        at = self.selected_at
        if not self._selected_ascending:
            return sum(n for s, n in at.items() if s >= step)
        total = 0
        for s in reversed(at):
            if s < step:
                break
            total += at[s]
        return total

    def requested(self, request: str) -> int | None:
        """The held batch a `sample` named ``request`` chose, if any."""
        return next((b for b, r in self.batch_request.items() if r == request), None)

    def apply_released(self, batch_id: int) -> list[str]:
        self.batch_step.pop(batch_id, None)
        self.batch_marks.pop(batch_id, None)
        self.batch_request.pop(batch_id, None)
        self.batch_reported.pop(batch_id, None)
        uids = self.batches.pop(batch_id, [])
        groups = self.groups
        self.rows.drop_all([groups.pop(u).rows for u in uids])
        return uids

    def lookup(self, uid: str) -> Group | GroupView | None:
        """The live group, a retired marker for a removed uid, or None for an unknown one."""
        g = self.groups.get(uid)
        if g is None and uid in self.removed_uids:
            return view(uid, None, True)
        return g

    # --- reads -------------------------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        """Live groups per status (selected-but-unreleased groups count as `sampled`)."""
        out = {"pending": 0, "running": 0, "finished": 0, "failure": 0, "sampled": 0}
        for g in self.groups.values():
            out["sampled" if g.removed == "sampled" else g.status] += 1
        return out

    def oldest_inflight(self) -> int | None:
        """The smallest dispatch step of a pending/running group (a lazily cleaned heap)."""
        h = self._inflight_heap
        while h and self.inflight.get(h[0][1]) != h[0][0]:
            heapq.heappop(h)
        return h[0][0] if h else None

    def payload(self, uids: list[str]) -> pa.Table:
        return self.payload_of(uids)[0]

    def payload_of(self, uids: list[str]) -> tuple[pa.Table, np.ndarray]:
        """The stored trajectories of ``uids`` in arrival order, and for each row its group's
        position in ``uids`` (what per-group values are spread to the rows by)."""
        plan, owner = self.payload_plan(uids)
        return plan.table(), owner

    def payload_plan(self, uids: list[str]) -> tuple[Gather, np.ndarray]:
        """`payload_of` still to be copied out (`Gather.table`); valid after the rows leave."""
        rows: list[int] = []
        owners: list[int] = []
        for k, u in enumerate(uids):
            got = self.groups[u].rows
            rows.extend(got)
            owners.extend([k] * len(got))
        ids = np.asarray(rows, dtype=np.int64)
        owner = np.asarray(owners, dtype=np.int64)[np.argsort(ids, kind="stable")]
        return self.rows.plan(ids), owner
