"""ReplayBuffer: the public API. It checks arguments, validates input and hands everything to the
buffer's state (pipeline/state/buffer_state.py) and the sample loop (pipeline/decide/poll.py); no
rule lives here.

Threading: producers (many threads) and one consumer share one lock; `sample` waits on a condition
that producers notify, re-polling at least every `poll_interval`. `refill_fn` is called with the
lock released, because it registers new groups through this very buffer.
"""
from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from pipeline import interrupts
from pipeline.arguments import (
    batch_id_arg,
    batch_size_arg,
    callback_arg,
    count_arg,
    dataset_list,
    flag_arg,
    partition_arg,
    prompt_id_list,
    request_arg,
    step_arg,
    timeout_arg,
    uid_list,
)
from pipeline.config import BufferConfig, async_config, preset_kwargs, sync_config
from pipeline.config.buffer_config import places
from pipeline.decide import Batch, Ready, aggregates, run_call
from pipeline.decide import evaluate as decide
from pipeline.decide import rules as declared_rules
from pipeline.decide.policies import PollContext, capacity
from pipeline.decide.selection import held as held_batch
from pipeline.errors import BufferFullError, BufferUnavailableError, ConfigError, UnknownBatchError
from pipeline.ingest import PutResult, validate_groups, validate_status, validate_trajectories
from pipeline.lake import LakeWriter
from pipeline.state import (
    BufferState,
    Columns,
    GroupView,
    Journal,
    Listener,
    candidates,
    decision_rows,
    view,
)

log = logging.getLogger("replaylake")


def _lake_arg(lake: Any) -> str | os.PathLike | None:
    """``lake``: None (memory only) or a directory path, a non-empty str or an os.PathLike
    naming a str path (e.g. a pathlib.Path); a bytes path or a number is refused."""
    path = os.fspath(lake) if isinstance(lake, os.PathLike) else lake
    if lake is None or (isinstance(path, str) and path):
        return lake
    raise ConfigError(f"lake={lake!r} must be the lake's directory: a non-empty str or a "
                      "pathlib.Path (os.PathLike of a str), e.g. lake='runs/lake'; or None to "
                      "keep everything in memory")


def _allow_changes_arg(allow_changes: Any) -> tuple[str, ...]:
    """``allow_changes``: one decision setting's name, or a tuple / list / set of them."""
    names = (allow_changes,) if isinstance(allow_changes, str) else allow_changes
    if isinstance(names, (tuple, list, set, frozenset)) and all(isinstance(n, str) for n in names):
        return tuple(names)
    raise ConfigError(f"allow_changes={allow_changes!r} must name the decision settings a reopen "
                      "may change: one name (a str) or a tuple of them, e.g. "
                      "allow_changes=('max_off_policy_threshold',); () allows none")


def _few(uids: list[str]) -> str:
    """Up to five uids for an error message, with how many more."""
    more = f" and {len(uids) - 5} more" if len(uids) > 5 else ""
    return f"{list(uids[:5])}{more}"


def _uid_elements(where: str, uids: list[Any]) -> list[str]:
    """``uids`` when each is a str (a uid); else an error naming the first that is not."""
    for i, u in enumerate(uids):
        if not isinstance(u, str):
            raise ConfigError(f"{where}: uids[{i}]={u!r} is not a uid; pass the groups' uids (str)")
    return uids


def _reason_arg(reason: Any) -> str:
    """retire's ``reason``: a non-empty str that no eviction rule records (see `retire`)."""
    if not isinstance(reason, str) or not reason.strip():
        raise ConfigError(f"retire: reason={reason!r} must be a non-empty str recorded with each "
                          "eviction, e.g. reason='vanished' (the default) or 'missing_metric'")
    if reason in declared_rules.reasons():
        raise ConfigError(
            f"retire: reason={reason!r} is the name of the {reason} eviction rule; metrics, a "
            "restored buffer and the lake's queries would count these retirements as its "
            "evictions: pass a reason of your own, e.g. reason='vanished' or "
            f"reason='{reason}_by_hand'")
    return reason


def _not_before_dispatch(step: int, uids: list[str], dispatch_steps: list[int]) -> None:
    """retire's ``global_steps`` against the groups it retires: none may be dispatched later
    (its group span would be below 1)."""
    early = [f"{u!r} (dispatched at step {g})" for u, g in zip(uids, dispatch_steps) if g > step]
    if early:
        more = f" and {len(early) - 5} more" if len(early) > 5 else ""
        raise ConfigError(
            f"retire: global_steps={step} precedes the dispatch step of {', '.join(early[:5])}"
            f"{more}; pass the trainer's current step (at least each group's dispatch step), or "
            "leave global_steps out to record each group at its own; nothing was retired")


def _missing(group: Any) -> list[int] | None:
    """The session ids a resumed group still needs (None: its ``n`` is unknown)."""
    return None if group.n is None else sorted(set(range(group.n)) - group.sessions)


_STATUSES = ("pending", "running", "finished", "failure", "sampled")


class ReplayBuffer:
    """The live buffer over an optional on-disk lake (``lake=None``: memory only).

    Opening an existing lake directory restores the buffer exactly as the last acknowledged
    write left it. The lake records its configuration: a reopen whose decision settings differ
    (preset, filter metric, threshold, strategy, rules) is refused naming the keys, unless they
    are listed in ``allow_changes`` (a name or a tuple of names; see pipeline/lake/config.py)."""

    def __init__(self, config: BufferConfig | None = None, *, lake: str | os.PathLike | None = None,
                 fsync: bool = False, allow_changes: tuple[str, ...] | str = (),
                 max_live_bytes: int | None = None):
        if config is not None and not isinstance(config, BufferConfig):
            raise ConfigError(f"config={config!r} must be a BufferConfig (use sync_config() / "
                              "async_config(), or ReplayBuffer.sync(...) / ReplayBuffer.async_(...))")
        self.config = config or sync_config()
        # every argument is checked before the lake is opened (and its lock taken)
        self.lake_dir = lake = _lake_arg(lake)
        fsync = flag_arg("fsync", fsync)
        allow_changes = _allow_changes_arg(allow_changes)
        if max_live_bytes is not None:
            max_live_bytes = count_arg("max_live_bytes", max_live_bytes, "(bytes of trajectory "
                                       "payload held in memory), or None for no budget")
        self.max_live_bytes = max_live_bytes
        writer = LakeWriter(lake, fsync=fsync) if lake is not None else None
        self._state = BufferState(Journal(writer), self.config.aggregated_metric,
                                  self.config.order)
        self._warned: set[str] = set()
        if lake is not None:
            from pipeline.lake import config as lake_config
            from pipeline.state import restore
            try:
                restore(self._state, lake)
                lake_config.check_and_record(lake, self.config, self._state.journal.next_seq,
                                             allow_changes)
            except BaseException:
                writer.close()          # give the lake's lock back
                raise

    @classmethod
    def sync(cls, *, lake: str | os.PathLike | None = None, fsync: bool = False,
             allow_changes: tuple[str, ...] | str = (), max_live_bytes: int | None = None,
             **verl_kwargs: Any) -> ReplayBuffer:
        """verl's `ReplayBuffer` preset (keywords as verl's)."""
        return cls(sync_config(**preset_kwargs("ReplayBuffer.sync", sync_config, verl_kwargs)),
                   lake=lake, fsync=fsync, allow_changes=allow_changes,
                   max_live_bytes=max_live_bytes)

    @classmethod
    def async_(cls, *, lake: str | os.PathLike | None = None, fsync: bool = False,
               allow_changes: tuple[str, ...] | str = (), max_live_bytes: int | None = None,
               **verl_kwargs: Any) -> ReplayBuffer:
        """verl's `ReplayBufferAsync` preset (keywords as verl's)."""
        return cls(async_config(**preset_kwargs("ReplayBuffer.async_", async_config, verl_kwargs)),
                   lake=lake, fsync=fsync, allow_changes=allow_changes,
                   max_live_bytes=max_live_bytes)

    # --- producers -----------------------------------------------------------------------------
    def add_listener(self, fn: Listener) -> None:
        """Call ``fn(kind, partition, uids, batch_id)`` after every evict / discard / select /
        release, under the buffer's lock (adapters mirror these effects onto their data plane).
        The change is written before ``fn`` is told; an exception ``fn`` raises leaves it
        standing, and reaches the caller once the call's own work is done (a `sample` keeps its
        batch for the retry)."""
        self._state.add_listener(fn)

    def register(self, data: Any = None, *, partition: str | None = None,
                 uids: list[str] | None = None, global_steps: int | None = None,
                 n: int | None = None, prompt_ids: list[int | None] | None = None,
                 dataset: str | list[str | None] | None = None,
                 partition_id: str | None = None) -> None:
        """Register prompt groups as `pending` (rows of partition, uid, global_steps[, n,
        prompt_id, dataset]), or the shorthand ``register(partition=, uids=[...], global_steps=,
        n=, prompt_ids=[...], dataset=...)``. ``prompt_ids`` (one int or None per uid, e.g. the
        dataset index) names the prompt each group answers, so the lake can tell which prompts
        keep getting evicted. ``dataset`` (one name for all, or one name or None per uid) names
        the dataset each group's prompt came from: it picks the group's staleness bound when
        ``max_off_policy_threshold`` maps datasets, and the starvation signal counts by it.
        All-or-nothing."""
        if data is None:
            uids = uid_list("register", uids)
            partition = partition_arg(partition, partition_id, "register", check=False)
            data = {"partition": [partition] * len(uids), "uid": uids,
                    "global_steps": [global_steps] * len(uids), "n": [n] * len(uids)}
            if prompt_ids is not None:
                data["prompt_id"] = prompt_id_list("register", prompt_ids, len(uids))
            if dataset is not None:
                data["dataset"] = dataset_list("register", dataset, len(uids))
        elif prompt_ids is not None or dataset is not None:
            raise ConfigError("register: prompt_ids= and dataset= go with the uids= shorthand; "
                              "with rows, give each row a `prompt_id` / `dataset`")
        with self._state.locked():
            n, cols = validate_groups(data, self._state.lookup)
            self._state.commit("group_events", Columns("group_events", n,
                                                       {**cols, "event": "registered"}))

    def update_status(self, data: Any = None, *, partition: str | None = None,
                      uids: list[str] | None = None, status: str | None = None,
                      partition_id: str | None = None) -> None:
        """Move groups forward (pending -> running -> finished | failure). All-or-nothing."""
        if data is None:
            uids = uid_list("update_status", uids)
            partition = partition_arg(partition, partition_id, "update_status", check=False)
            data = {"partition": [partition] * len(uids), "uid": uids,
                    "status": [status] * len(uids)}
        with self._state.locked():
            n, cols = validate_status(data, self._state.lookup)
            partitions, uids = cols["partition"], cols["uid"]
            self._state.commit("group_events", Columns("group_events", n, {
                "partition": partitions, "uid": uids, "event": cols["status"],
                "global_steps": self._state.dispatch_steps(partitions, uids)}))

    def put(self, trajectories: Any, timeout: float | None = 0.0) -> PutResult:
        """Accept trajectories for in-flight groups; returns how many were stored, as an int
        whose ``already_stored`` counts the rows that were stored identically before.
        All-or-nothing.

        Retries are idempotent: a row whose (uid, session_id, index) is already stored with the
        very same content (a producer sending again a put whose reply it never saw) is a no-op,
        counted in ``already_stored``; one stored with different content is refused as a
        duplicate naming the key (nothing of the call accepted). A call mixing new and identical
        rows stores the new ones. The comparison runs only for rows whose key is stored.

        Back-pressure: with ``max_live_bytes`` set, a put that would take the payload held in
        memory past it waits up to ``timeout`` seconds (None: as long as it takes) for the
        trainer to release batches, then raises `BufferFullError` (nothing of the call
        accepted). A single put larger than the whole budget is accepted when the buffer holds
        nothing else, so it can never deadlock; one that finds every held byte in groups still
        in flight raises at once (no batch can be released to make room)."""
        timeout = timeout_arg("put", timeout)
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        with self._state.locked():
            while True:   # validated again after every wait: a group may have settled meanwhile
                rows, repeated = validate_trajectories(trajectories, self._state.lookup,
                                                       self.config.filter_metric,
                                                       self._state.stored_rows)
                if repeated and not rows.num_rows:          # all a retry's: nothing to write
                    return PutResult(0, repeated)
                if self.max_live_bytes is None or self._has_room(rows.nbytes, deadline):
                    return PutResult(self._state.commit("trajectories", rows).num_rows, repeated)

    def _has_room(self, nbytes: int, deadline: float) -> bool:
        """True when the payload fits the budget; else wait for a change (False) or raise."""
        budget = self.max_live_bytes
        if budget is None:
            return True
        live = self._state.held_bytes()
        if live == 0 or live + nbytes <= budget:
            return True
        if nbytes > budget:       # could only ever fit into an empty buffer: say so at once
            raise BufferFullError(
                f"put of {nbytes:,} payload bytes is larger than the whole max_live_bytes="
                f"{budget:,} budget ({live:,} held in memory), so waiting cannot make room: split "
                "it into smaller puts or raise the budget; nothing of this call was accepted (a "
                "put that large is accepted only while the buffer holds nothing else)")
        if self._only_unfinishable():
            raise BufferFullError(
                f"put of {nbytes:,} payload bytes would exceed max_live_bytes={budget:,}, and "
                f"the {live:,} bytes held all belong to groups still in flight that lack "
                "sessions (pending or running): none of them can finish, be sampled and "
                "released to make room without more puts, so waiting cannot help; raise "
                "max_live_bytes so that every group in flight fits whole, or dispatch fewer "
                "groups at a time; nothing of this call was accepted")
        left = deadline - time.monotonic()
        if left <= 0:
            raise BufferFullError(
                f"put of {nbytes:,} payload bytes would exceed max_live_bytes={budget:,} "
                f"({live:,} held in memory); sample and release batches, raise the budget, or "
                "pass put(..., timeout=seconds) to wait; nothing of this call was accepted")
        if not self._state.closed:
            self._state.wait(None if left == math.inf else left)
        if self._state.closed:
            raise BufferUnavailableError("put: the buffer was closed while this call waited for "
                                         "room; nothing of this call was accepted")
        return False

    def _only_unfinishable(self) -> bool:
        """Whether every group memory holds is in flight and still lacks sessions of its known
        ``n`` (a deadlock for a waiting put: no batch can be released, no group can finish
        without the puts that wait). Call with the lock held."""
        for _, part in self._state.partitions():
            if len(part.inflight) != len(part.groups):     # a terminal or selected group
                return False
            if any(not _missing(part.groups[u]) for u in part.inflight):   # n unknown, or all in
                return False
        return True

    def reissue(self, global_steps: int, partition: str | None = None, *,
                partition_id: str | None = None, release_held: bool = False
                ) -> dict[str, list[str]]:
        """After a restart: every pending/running group (of ``partition``, or of all) goes back to
        `pending` at the resume step and loses its partial trajectories; returns
        {partition: uids} for the caller to re-dispatch whole (their rollout workers died with
        the old process). `resume` keeps the completed sessions instead. Prompts the restored
        lake's last refill ask never saw registered are owed again: the next `sample` asks
        refill_fn for them.

        Batches the trainer held when the process died are restored as `sampled` (their rows stay
        in memory, `held_batches` lists them). A trainer that resumes from a checkpoint taken
        before those steps will not train on them: ``release_held=True`` releases them here (their
        rows stay in the lake; `replaylake export` can still read them). Keep them (the default)
        to hand them to the trainer again."""
        return self._reissue("reissue", global_steps, partition, partition_id, release_held,
                             keep=False)

    def resume(self, global_steps: int, partition: str | None = None, *,
               partition_id: str | None = None, release_held: bool = False
               ) -> dict[str, list[tuple[str, list[int] | None]]]:
        """`reissue` with sibling reuse: every pending/running group goes back to `pending` at
        the resume step *keeping* its completed sessions; returns {partition: [(uid, missing
        session ids), ...]} for the caller to dispatch only those (None: the group was
        registered without ``n``, so which are missing is the rollout side's to say; its stored
        sessions are `lookup(...).sessions`). The group finishes when they arrive; the kept
        siblings keep their own min/max versions (older weights), so the group's versions and
        spans count them honestly. A session counts as complete once one of its trajectories
        is stored (a session's outputs come in one put).

        In the lake, the kept rows are written again after the group's `reissued` event (the
        rows before it read as dropped, as for `reissue`): every reader then sees the group as
        the live buffer does. A crash between the two writes leaves the group as `reissue`
        would (nothing kept); resuming again reports every session missing."""
        return self._reissue("resume", global_steps, partition, partition_id, release_held,
                             keep=True)

    def _reissue(self, where: str, global_steps: int, partition: str | None,
                 partition_id: str | None, release_held: bool, *, keep: bool) -> dict:
        global_steps = step_arg(where, global_steps)
        release_held = flag_arg("release_held", release_held, where)
        only = None if partition is None and partition_id is None else \
            partition_arg(partition, partition_id, where)
        out: dict[str, list] = {}
        with self._state.locked(), interrupts.held():
            chosen = [(pid, part) for pid, part in self._state.partitions()
                      if only is None or pid == only]
            # one write for every partition and table: a crash or a failed write leaves all of
            # it or none (the events without the rows they keep would lose those rows)
            owed, events, kept = [], [], []
            uids_of = {pid: sorted(part.inflight) for pid, part in chosen}
            for pid, part in chosen:
                rows = self._state.lost_ask_rows(pid, global_steps)   # asked, never registered
                if rows is not None:
                    owed.append(rows)
                for u in uids_of[pid]:
                    g = part.groups[u]
                    if keep and g.keys:
                        kept.append(self._state.stored_rows(pid, u))
                    events.append({"partition": pid, "uid": u, "event": "reissued",
                                   "global_steps": global_steps,
                                   "kept_rows": len(g.keys) if keep else 0})
            items: list[tuple[str, Any]] = []
            if owed:
                items.append(("decisions", owed[0] if len(owed) == 1 else Columns.concat(owed)))
            if events:
                items.append(("group_events", events))
            if kept:
                items.append(("trajectories",
                              pa.concat_tables(kept).drop_columns(["seq", "ts"])))
            if items:
                self._state.commit_many(items)
            for pid, part in chosen:
                self._state.lost_ask_owed(pid)
                uids = uids_of[pid]
                if uids:
                    out[pid] = [(u, _missing(part.groups[u])) for u in uids] if keep else uids
                if release_held:
                    for batch_id in sorted(part.batches):
                        self.release(batch_id)
        return out

    # --- the consumer --------------------------------------------------------------------------
    def _context(self, where: str, global_steps: Any, partition: str | None,
                 partition_id: str | None, batch_size: Any, size_name: str = "batch_size",
                 mirrored: bool = False, request: str | None = None) -> PollContext:
        """The call's context; warns once of a partition with no group while others have some
        (a misspelt name, most often), unless ``mirrored``: an adapter's ``before_poll`` brings
        the partition's groups in at the first poll."""
        global_steps = step_arg(where, global_steps)
        p = partition_arg(partition, partition_id, where)
        batch_size = batch_size_arg(where, batch_size, size_name)
        if mirrored:
            return PollContext(global_steps, p, batch_size, request)
        with self._state.locked():
            known = self._state.find(p)
            with_groups = [q for q, s in self._state.partitions() if s.groups]
            if (known is None or not known.groups) and p not in self._warned and with_groups:
                self._warned.add(p)
                log.warning("%s: partition %r has no group yet (known: %s); waiting for one",
                            where, p, with_groups)
        return PollContext(global_steps, p, batch_size, request)

    def sample(self, global_steps: int, partition: str | None = None,
               batch_size: int | None = None, timeout: float | None = None, *,
               partition_id: str | None = None,
               before_poll: Callable[[], None] | None = None,
               request: str | None = None) -> Batch:
        """Whole groups, oldest dispatch first, after the configured evictions and refills.

        Blocks until the preset's condition holds; ``timeout`` (seconds) raises `SampleTimeout`
        with the group counts. ``before_poll`` runs before every poll with the lock released
        (adapters mirror an external data plane into the buffer there).

        ``request`` names the call (a str, unique per call): should the caller not receive the
        batch (its process, or the buffer's, died with the call in flight), the call sent again
        with the same ``request`` returns the very batch it chose, as long as that batch is
        held (not released), after a restart on the same lake too, instead of choosing
        another. The key of a held batch with another step or batch size is refused.

        Without a lake, the batch's ``table`` and off-policy metrics are made when first read
        (the same ones whenever that is, after `release` too); over a lake, at once."""
        ctx = self._context("sample", global_steps, partition, partition_id, batch_size,
                            mirrored=before_poll is not None,
                            request=request_arg("sample", request))
        return run_call(self._state, self.config, ctx, consume=True,
                        timeout=timeout_arg("sample", timeout),
                        before_poll=callback_arg("sample", "before_poll", before_poll))

    def wait_for_sampleable(self, global_steps: int, partition: str | None = None,
                            target_count: int | None = None, timeout: float | None = None, *,
                            partition_id: str | None = None,
                            before_poll: Callable[[], None] | None = None) -> Ready:
        """Evict and refill as `sample` would until `target_count` groups are sampleable and the
        gate is open; consumes nothing (a following `sample` gets these groups). Returns `Ready`:
        the `target_count` oldest uids and the call's eviction metrics, whose ``reward_counts``
        attribute is the `{value: count}` of the zero-variance groups it evicted."""
        ctx = self._context("wait_for_sampleable", global_steps, partition, partition_id,
                            target_count, "target_count", mirrored=before_poll is not None)
        return run_call(self._state, self.config, ctx, consume=False,
                        timeout=timeout_arg("wait_for_sampleable", timeout),
                        before_poll=callback_arg("wait_for_sampleable", "before_poll",
                                                 before_poll))

    def retire(self, partition: str | None = None, uids: list[str] | None = None,
               reason: str = "vanished", global_steps: int | None = None, *,
               partition_id: str | None = None) -> list[str]:
        """Remove live, unselected groups that disappeared from an external data plane (e.g.
        verl's trainer cleared the partition): each gets an `evict` decision with ``reason`` and
        is never sampled or accepted again. Returns the uids retired, each once and in the order
        given (unknown or already removed ones are skipped; a uid named twice is retired once).

        ``reason`` is a non-empty str recorded with each eviction, e.g. 'vanished' or
        'missing_metric'. The name of an eviction rule ('stale', 'zero_variance', 'failure',
        'overlong', ...) is refused: the metrics, the restored buffer and the lake's queries
        count an eviction by its reason, so a retirement under a rule's name would read as that
        rule's eviction (a stale group's span, a zero-variance group's reward). ``global_steps``
        (the trainer's step; default: each group's own dispatch step) may not precede the
        dispatch step of a group it retires (that would record a negative group span). A call
        that raises retires nothing."""
        partition = partition_arg(partition, partition_id, "retire")
        uids = list(dict.fromkeys(_uid_elements("retire", uid_list("retire", uids))))
        reason = _reason_arg(reason)
        if global_steps is not None:
            global_steps = step_arg("retire", global_steps)
        with self._state.locked():
            part = self._state.find(partition)
            if part is None:
                return []
            kept = [u for u in uids if u in part.groups and part.groups[u].removed is None]
            if not kept:
                return []
            gs = [part.groups[u].dispatch_step for u in kept]
            if global_steps is None:      # no trainer step at hand: the group's own dispatch step
                steps, spans = gs, [1] * len(gs)
            else:
                _not_before_dispatch(global_steps, kept, gs)
                steps, spans = [global_steps] * len(gs), decide.group_spans(global_steps, gs)
            # `replaces` as rows of None: the layout these rows always had in the lake
            self._state.commit("decisions", decision_rows(
                "evict", partition=partition, step=steps, uids=kept, reason=reason,
                group_span=spans, replaces=[None] * len(kept)))
            return kept

    def _held(self, batch: Any, where: str) -> tuple[int, str, Any]:
        """(batch id, partition id, partition) of the held batch ``batch`` names: a Batch, or its
        integer id. A Batch must be the held one: its partition and uids are checked, so a Batch
        of another buffer (or one whose id a restart gave to another batch) never names this
        buffer's batch. Raises UnknownBatchError when none is held. Call with the lock held."""
        batch_id = batch.batch_id if isinstance(batch, Batch) else batch_id_arg(batch, where)
        for pid, part in self._state.partitions():
            if batch_id not in part.batches:
                continue
            held = part.batches[batch_id]
            if isinstance(batch, Batch) and (batch.partition != pid or
                                             sorted(batch.uids) != sorted(held)):
                raise UnknownBatchError(
                    f"{where}: this Batch (partition {batch.partition!r}, uids "
                    f"{_few(batch.uids)}) is not batch {batch_id} of this buffer (partition "
                    f"{pid!r}, uids {_few(held)}): it came from another buffer, or from before a "
                    "restart that gave its id to another batch; pass the Batch this buffer's "
                    f"sample() or held_batch() returned, or {where}({batch_id}) for the held one")
            return batch_id, pid, part
        raise UnknownBatchError(f"batch {batch_id} is not held by this buffer (never sampled, or "
                                "already released); held_batches(partition) lists the held ones")

    def release(self, batch: Batch | int) -> None:
        """The trainer is done with the batch: its trajectories leave memory (not the lake).
        ``batch``: the Batch `sample` returned (its partition and uids must be those of the
        batch this buffer holds under its id), or its integer batch id."""
        with self._state.locked(), interrupts.held():
            batch_id, pid, part = self._held(batch, "release")
            uids = part.batches[batch_id]
            nulls = [None] * len(uids)   # laid out as rows of None (not `pa.nulls`)
            self._state.commit("decisions", decision_rows(
                "release", partition=pid, step=part.batch_step[batch_id], uids=uids,
                reason=nulls, batch_id=batch_id, replaces=nulls))

    # --- reads: none of them changes a group's fate ----------------------------------------------
    def get_sampleable_count(self, global_steps: int, partition: str | None = None, *,
                             partition_id: str | None = None) -> int:
        """How many groups `sample` could hand out now; evicts, refills and removes nothing."""
        global_steps = step_arg("get_sampleable_count", global_steps)
        p = partition_arg(partition, partition_id, "get_sampleable_count")
        with self._state.locked():
            part = self._state.find(p)
            if part is None:
                return 0
            ev = decide.evaluate(part, self.config.rules_for(p), global_steps,
                                 self.config.filter_metric)
            return part.candidates.alive_count - ev.count

    def dispatch_capacity(self, global_steps: int, partition: str | None = None, *,
                          partition_id: str | None = None,
                          batch_size: int | None = None) -> int:
        """How many more groups the rollout side may dispatch now, registered with
        ``global_steps``, so that none can be trained over the staleness bound T
        (`max_off_policy_threshold`) when the trainer takes ``batch_size`` groups per step
        (default: the preset's `train_batch_size`), oldest dispatch first.

        ``max(0, T x B - selected - sampleable - in_flight)``: a group registered at step g must
        be trained at one of the steps g .. g + T - 1 (group span s - g + 1 <= T), which hold
        T x B places; ``selected`` counts the groups already selected at steps >= g (step g's
        own batch when ``sample(g)`` ran before this call, 0 before it), and every sampleable
        and in-flight group was dispatched at g or before, so it is ahead of the new ones (in
        flight: registered groups not yet terminal, and prompts ``refill_fn`` was asked for at
        ``global_steps`` that no registration has matched yet). Ask
        with the step the new groups will be registered with, at any point of that step. The
        guarantee holds when every group finishes before the next step's sample. Sampleable
        groups are counted as `get_sampleable_count` counts them (after the eviction rules, so
        a group the next poll evicts frees its place). A read: it evicts, refills and removes
        nothing. The formula is `sql/policies/dispatch_capacity.sql`. Under per-dataset bounds
        T is the tightest of them: the new groups' datasets are not known yet, and a group of
        the tightest dataset must keep its bound too."""
        global_steps = step_arg("dispatch_capacity", global_steps)
        p = partition_arg(partition, partition_id, "dispatch_capacity")
        threshold = self.config.stale.bounds().tightest()
        if threshold is None or self.config.stale.strategy is None:
            raise ConfigError("dispatch_capacity needs a staleness bound: this buffer has none "
                              f"(preset {self.config.preset!r}, max_off_policy_threshold="
                              f"{threshold!r}); use the async preset with a threshold")
        batch = self.config.train_batch_size if batch_size is None else batch_size
        if batch is None:
            raise ConfigError("dispatch_capacity needs the groups trained per step: pass "
                              "batch_size=, or give the preset train_batch_size=")
        batch = batch_size_arg("dispatch_capacity", batch)
        try:
            places(threshold, batch)
        except ConfigError as exc:
            raise ConfigError(f"dispatch_capacity: {exc}") from None
        with self._state.locked():
            part = self._state.find(p)
            if part is None:
                return capacity(threshold, batch, 0, 0, 0)
            # sampleable as `get_sampleable_count` counts it: what the next poll will evict
            # (a stale group, say) is no longer ahead of a new group
            ev = decide.evaluate(part, self.config.rules_for(p), global_steps,
                                 self.config.filter_metric)
            # prompts refill_fn was asked for at this step and that are not registered yet
            # count as in flight (as admission counts them)
            return capacity(threshold, batch, part.selected_since(global_steps),
                            part.candidates.alive_count - ev.count,
                            len(part.inflight) + part.unregistered(global_steps))

    def lookup(self, partition: str | None = None, uid: str | None = None, *,
               partition_id: str | None = None) -> GroupView | None:
        """A frozen view of the group (uid, global_steps, n, status, removed, keys,
        prompt_id), a retired marker (``removed == 'retired'``: never accepted again), or None
        when never seen."""
        partition = partition_arg(partition, partition_id, "lookup")
        if not isinstance(uid, str):
            raise ConfigError(f"lookup: uid={uid!r} must be the group's uid (a str)")
        with self._state.locked():
            part = self._state.find(partition)
            if part is None:
                return None
            return view(uid, part.groups.get(uid), uid in part.removed_uids)

    def lookup_many(self, partition: str | None = None, uids: list[str] | None = None, *,
                    partition_id: str | None = None) -> list[GroupView | None]:
        """`lookup` of many uids of one partition, in their order, under one hold of the lock
        (an adapter looks up a poll's few hundred keys at once)."""
        partition = partition_arg(partition, partition_id, "lookup_many")
        uids = uid_list("lookup_many", uids)
        odd = next((u for u in uids if type(u) is not str), None)
        if odd is not None:
            raise ConfigError(f"lookup_many: uid {odd!r} must be a group's uid (a str)")
        with self._state.locked():
            part = self._state.find(partition)
            if part is None:
                return [None] * len(uids)
            groups, removed = part.groups, part.removed_uids
            return [view(u, groups.get(u), u in removed) for u in uids]

    def held_batches(self, partition: str | None = None, *, partition_id: str | None = None
                     ) -> dict[int, list[tuple[str, int, int]]]:
        """Selected, unreleased batches: batch id -> its (uid, session_id, index) keys."""
        partition = partition_arg(partition, partition_id, "held_batches")
        with self._state.locked():
            part = self._state.find(partition)
            if part is None:
                return {}
            return {b: [(u, s, x) for u in uids for s, x in sorted(part.groups[u].keys)]
                    for b, uids in part.batches.items()}

    def held_batch(self, batch_id: int) -> Batch:
        """A selected, unreleased batch again, as `sample` returned it (its rows, provenance and
        off-policy metrics; the eviction metrics stay with the call that chose it): after a
        restart, the batch the trainer held when the process died, to train on it and release
        it (`held_batches` lists their ids)."""
        with self._state.locked():
            batch_id, _, part = self._held(batch_id, "held_batch")
            # as its selection marked it (masked groups, bounds), not as today's configuration
            # would: a reopen may change the threshold, a validation partition masks nothing
            return held_batch(part, batch_id)

    def sampleable_uids(self, partition: str | None = None, *,
                        partition_id: str | None = None) -> list[str]:
        """Every group the last poll left sampleable, in the selection order (oldest first
        unless one is declared; evicts nothing)."""
        partition = partition_arg(partition, partition_id, "sampleable_uids")
        with self._state.locked():
            part = self._state.find(partition)
            if part is None:
                return []
            if part.candidates.order is not None:   # keyed once their aggregates are known
                aggregates.complete(part)
            return part.candidates.first(None)

    def prepare(self, partition: str | None = None, *, partition_id: str | None = None) -> None:
        """Compute now the aggregates of the groups that turned terminal since the last poll,
        which the next poll would compute first (a group's aggregates never change once it is
        terminal, so the poll then decides exactly as it would have). Decides nothing; for a
        thread that feeds the buffer between calls."""
        partition = partition_arg(partition, partition_id, "prepare")
        with self._state.locked():
            part = self._state.find(partition)
            if part is not None:
                aggregates.complete(part)

    def candidates(self, partition: str | None = None, *, partition_id: str | None = None
                   ) -> pa.Table:
        """The candidate table of a partition (schemas.CANDIDATES): every terminal group not yet
        sampled, evicted or discarded, with the aggregates the rules read, oldest first."""
        partition = partition_arg(partition, partition_id, "candidates")
        with self._state.locked():
            part = self._state.find(partition)
            if part is None:
                return candidates.table([])
            aggregates.complete(part)
            alive = part.candidates.alive
            return candidates.table([alive[u] for u in part.candidates.oldest(None)])

    def counts(self, partition: str | None = None, *,
               partition_id: str | None = None) -> dict[str, int]:
        """Live groups of a partition per status (selected, unreleased groups: `sampled`)."""
        p = partition_arg(partition, partition_id, "counts")
        with self._state.locked():
            part = self._state.find(p)
            return part.counts() if part else dict.fromkeys(_STATUSES, 0)

    def partitions(self) -> list[str]:
        """The partitions that hold or held a group (a partition only named by a call, e.g. a
        `sample` of a misspelt id that timed out, is not one: a restart would not know it)."""
        with self._state.locked():
            return [p for p, part in self._state.partitions() if part.groups or part.removed_uids]

    @property
    def lake(self) -> LakeWriter | None:
        """The lake this buffer writes (its ``root`` and ``lock``), or None in memory only."""
        return self._state.lake

    # --- the end ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Finish the lake's open segments and give its writer lock back (idempotent). A call
        waiting in another thread (a `sample`, a `put` waiting for room) ends with
        `BufferUnavailableError` instead of waiting on."""
        self._state.close()
        if self._state.lake is not None:
            self._state.lake.close()

    def __enter__(self) -> ReplayBuffer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
