"""Mirrors one TransferQueue partition into the core buffer, and TransferQueue effects back.

verl's data plane is TransferQueue: prompt keys `uid` (tags `is_prompt`, `status`, `global_steps`)
and trajectory keys `{uid}_{session}_{index}` (tags with `min/max_global_steps`, fields with
`rm_scores` and `extra_fields`). Before each poll the adapter lists the partition once and feeds
the *difference* since the last listing to the core, in the order the core needs: new prompt keys
are registered, new trajectories put, then status changes applied (a group's trajectories are
always written before its terminal status, and one listing is a consistent snapshot, so this
order never rejects a trajectory verl would have used). Keys of selected groups that disappear
(the trainer clears them after the step) release the batch; taken-in trajectory keys of a group
not selected that disappear (someone else cleared them) retire the group as `vanished`, since
the core would otherwise train rows TransferQueue no longer holds.

Keys the core must not accept are *orphans*: a late write that re-creates the key of a
removed group (e.g. a status written after the prompt key was cleared), or a trajectory of a group
that is removed or already terminal. They can never be trained on, and verl leaves them in
TransferQueue forever (a leak); the adapter clears them. Keys it cannot attribute to a group it
knows (a key that parses as neither kind, and not a removed uid) are left alone: they are not its
to delete. Trajectory keys of a uid no prompt key names yet (e.g. the trainer's padding rows
`pad<hex>_<i>_0`) wait until one does or they vanish. A key listed without any tag (its put
has created it but not yet written its tags: TransferQueue does the two in turn, and a listing
may fall between them) is classified by the first listing that shows its tags, as verl, which
re-reads every key on every poll, sees it then. A trajectory key of a *selected* group that
the mirror has never seen (only after a restart on a lake) is tracked, not cleared: the trainer
may still hold that batch. A prompt key listed again *with its dispatch tags* for a group the
core has removed means TransferQueue was restored to an earlier state (verl's checkpoint resume
over a lake that went further): the lake's decision stands, the group's prompt and trajectory
keys are cleared, and one warning names the groups.

A trajectory the core refuses (a NaN reward, a token list it cannot hold, ...) fails its group
only: the group is marked `failure` (each preset evicts it as a failed rollout), its new keys
are cleared and one warning names its keys and the problem; the other groups are put as usual.

The other direction is the core's decisions, told to the mirror by the adapter's listener: an
evicted or discarded group gives up its prompt key and every trajectory key, a selected group
only its prompt key (its trajectory keys form the batch the trainer reads and later clears).
The mirror makes those `kv_clear` calls itself, or owes them to the background thread
(background.py), which makes them with `flush`. Both directions change the same maps, so they
live in one class.
"""
from __future__ import annotations

import logging
import time
from typing import Any

from pipeline.adapters.verl.fields import dataset_name, read_fields
from pipeline.adapters.verl.keys import (
    IGNORED,
    PROMPT,
    TRAJ,
    UNTAGGED,
    WAITING,
    check_prompts,
    clear,
    parse_key,
)
from pipeline.adapters.verl.rows import trajectory_rows
from pipeline.config import is_validation
from pipeline.errors import IngestError, InvariantError

log = logging.getLogger("replaylake.verl")

_TERMINAL = ("finished", "failure")
_RANK = {"pending": 0, "running": 1, "finished": 2, "failure": 2}


def refused_groups(exc: IngestError, keys: list[str]) -> dict[str, tuple[list[str], list[str]]] | None:
    """The groups a row-level refusal names: uid -> (its refused keys, the problems), where
    row r of the refused input is TransferQueue key ``keys[r]``. None when some problem names no
    row or an unknown group: then no group can be blamed alone."""
    out: dict[str, tuple[list[str], list[str]]] = {}
    for p in exc.problems:
        rows = getattr(p, "rows", ())
        if not rows or getattr(p, "kind", "invalid") != "invalid":
            return None
        why = f"{p.column}: {p.message}"
        for r in rows:
            k = keys[r]
            ks, whys = out.setdefault(k.partition("_")[0], ([], []))
            if k not in ks:
                ks.append(k)
            if why not in whys:
                whys.append(why)
    return out or None


def _tagless(key: str, listing: dict[str, dict]) -> bool:
    """A key listed without tags whose group's terminal status is listed: a group's
    trajectories are written, tags included, before its status, so the key was written without
    any tag (its versions then come from `extra_fields`), not caught between its put's two
    writes."""
    tag = listing.get(key.partition("_")[0])
    return tag is not None and tag.get("status") in _TERMINAL


class OwedClears:
    """The keys whose kv_clear a partition's mirror deferred, with the TransferQueue and
    partition to clear them in, and nothing else: what an adapter collected without `close()`
    still clears (background.py) must not hold the adapter, through its core, alive."""

    __slots__ = ("tq", "partition", "keys")

    def __init__(self, tq: Any, partition: str):
        self.tq, self.partition, self.keys = tq, partition, []

    def flush(self) -> int:
        """Clear every key owed (in the order deferred); returns how many. If TransferQueue
        refuses, every key stays owed and the error propagates."""
        if not self.keys:
            return 0
        keys = self.keys[:]
        clear(self.tq, self.partition, keys)
        del self.keys[:len(keys)]
        return len(keys)


class PartitionMirror:
    """What the adapter knows of one partition's keys, and how to bring the core up to date.

    ``fields``: which trajectory fields to read for new keys (the drop-in's option `mirror_fields`):
    `decisions` reads only what a decision needs, `rewards` also every reward for the lake,
    `full` also the token payload."""

    def __init__(self, core: Any, tq: Any, partition: str, fields: str,
                 filter_metric: str | None, reuse: bool = False,
                 dataset_field: str | None = None):
        self.core, self.tq, self.partition, self.fields = core, tq, partition, fields
        self.dataset_field = dataset_field   # prompt field naming its dataset (None: not read)
        self.datasets_unread = 0             # prompts registered without it (field not readable)
        self.reuse = reuse        # verl re-issued prompts keep their completed sessions
        self.missing: dict[str, list[int] | None] = {}   # ... and these are still to generate
        self.filter_metric = None if is_validation(partition) else filter_metric
        self.kind: dict[str, str] = {}              # every listed key -> PROMPT | TRAJ | ...
        self.by_uid: dict[str, list[str]] = {}      # uid -> its listed trajectory keys
        self.order: dict[str, int] = {}             # mirrored trajectory key -> arrival number
        self.waiting: dict[str, tuple[str, int, int]] = {}
        self.watch: dict[str, str] = {}             # in-flight prompt uid -> mirrored status
        self.batches: dict[int, list[str]] = {}     # selected, unreleased batch -> its keys
        self.listing: dict[str, dict] = {}
        # listed keys without any tag yet, in listing order: TransferQueue's put creates a key
        # before it writes the key's tags, so a listing taken meanwhile shows `{}`; each later
        # listing classifies those that have their tags by then (verl re-reads every key per poll)
        self.untagged: dict[str, None] = {}
        for batch_id, keys in core.held_batches(partition).items():   # restored from a lake
            self.batches[batch_id] = [f"{u}_{s}_{x}" for u, s, x in keys]
        self.orphans_cleared = 0
        self._warned_status: dict[str, Any] = {}   # uid -> the unknown status warned about
        self.rolled_back: dict[str, str] = {}   # removed uid whose prompt key came back -> fate
        self._new_rolled_back: list[str] = []
        self.failed_refused = 0     # groups failed because the core refused a trajectory of theirs
        self.ignored_count = 0
        self._orphans: list[str] = []
        self._arrivals = 0
        # the background mirror's bookkeeping (background.py): `epoch` grows with every
        # listing applied and every clear (made or deferred); `fresh_epoch` is the epoch right
        # after the last listing was applied; `listed_at` when that listing began
        # (time.monotonic()); `deferred`: keys whose kv_clear the background thread still owes
        self.epoch = 0
        self.fresh_epoch = -1
        self.listed_at: float | None = None
        self.owed = OwedClears(tq, partition)

    @property
    def deferred(self) -> list[str]:
        """Keys whose kv_clear the background thread still owes (in the order deferred)."""
        return self.owed.keys

    # --- TransferQueue -> core ----------------------------------------------------------------
    def sync(self, clear_orphans: bool = True) -> None:
        """List the partition once and apply the difference to the core (one poll's input).

        A prompt key that vanished without the adapter removing it (the trainer cleared the
        partition, an operator reset it) retires its group in the core: verl re-lists on every
        poll, so for verl that group is simply gone. ``clear_orphans=False`` (depth queries)
        leaves TransferQueue untouched; orphans found are cleared by the next full sync."""
        self.flush()              # a listing must never see keys the mirror already let go
        began = time.monotonic()
        self.apply(self.list_keys(), began, clear_orphans)

    def list_keys(self) -> dict[str, dict]:
        """The partition's keys and tags, as TransferQueue lists them now."""
        return self.tq.kv_list(partition_id=self.partition).get(self.partition, {})

    def apply(self, listing: dict[str, dict], began: float, clear_orphans: bool = True) -> None:
        """Bring the core up to `listing` (taken at `began`); see `sync`."""
        self.epoch += 1
        self.listed_at = None
        self.listing = listing
        gone = self.kind.keys() - listing.keys() if len(self.kind) else set()
        vanished, lost = self._forget(gone)
        if vanished:
            retired = self.core.retire(self.partition, vanished, reason="vanished")
            if retired:
                log.warning("verl adapter: %d group(s) of partition %r vanished from "
                            "TransferQueue and were retired: %s", len(retired), self.partition,
                            retired[:5])
        if lost:
            retired = self.core.retire(self.partition, list(lost), reason="vanished")
            if retired:
                log.warning(
                    "verl adapter: %d group(s) of partition %r lost trajectory keys the buffer "
                    "had taken in (cleared by something other than the trainer's batch "
                    "clear): %s; the buffer cannot train a group without them, so they were "
                    "retired as 'vanished' and their other keys cleared",
                    len(retired), self.partition, {u: lost[u][:3] for u in retired[:5]})
        new = self._new_keys(listing)
        if self.untagged:
            ready = [k for k in self.untagged if listing[k] or _tagless(k, listing)]
            for k in ready:
                del self.untagged[k], self.kind[k]
            new = ready + new          # listed before the new tail: listing order is kept
        registers, reissue = self._classify(new, listing)
        self._warn_rolled_back()
        if reissue is not None:       # verl re-issued in-flight prompts after a resume
            if self.reuse:
                again = self.core.resume(reissue, self.partition).get(self.partition, [])
                self.missing.update(again)
                uids = [u for u, _ in again]
            else:
                uids = self.core.reissue(reissue, self.partition).get(self.partition, [])
            for u in uids:
                if u in self.watch:
                    self.watch[u] = "pending"
        if registers:
            rows = {"partition": [self.partition] * len(registers), "uid": registers,
                    "global_steps": [listing[u]["global_steps"] for u in registers]}
            if self.dataset_field is not None:
                rows["dataset"] = self._datasets(registers)
            try:
                self.core.register(rows)
            except Exception:
                for u in registers:          # rejected whole: they are new again next poll
                    self.kind.pop(u, None)
                    self.watch.pop(u, None)
                raise
        held = self._put_waiting(listing)
        self._apply_statuses(listing, held)
        self._release_cleared(listing)
        if clear_orphans:
            self._clear_orphans()
        self.listed_at = began
        self.fresh_epoch = self.epoch

    def _datasets(self, uids: list[str]) -> list[str | None]:
        """Each new prompt's dataset: its ``dataset_field`` field (one read for all of them). A
        prompt without it (verl's sync trainer mode stores no prompt fields; or not written yet)
        or with a value that is not a non-empty name gets None, the mapping's default bound;
        the first such poll warns, naming them (`datasets_unread` counts them all)."""
        got = read_fields(self.tq, self.partition, uids, [self.dataset_field])[self.dataset_field]
        out = [dataset_name(v) for v in got]
        unread = [u for u, d in zip(uids, out) if d is None]
        if unread:
            first = self.datasets_unread == 0
            self.datasets_unread += len(unread)
            say = log.warning if first else log.debug
            say("verl adapter: %d prompt(s) of partition %r have no readable %r field and are "
                "registered without a dataset (the default bound applies): %s; verl stores "
                "prompt fields only outside trainer_mode='sync'", len(unread), self.partition,
                self.dataset_field, unread[:5])
        return out

    def _new_keys(self, listing: dict[str, dict]) -> list[str]:
        """Keys not seen before, in listing (= TransferQueue registration) order. New keys are
        always appended at the end of the listing, so only its tail is walked."""
        missing = len(listing) - len(self.kind)
        if missing <= 0:
            return []
        out = []
        for k in reversed(listing):
            if k not in self.kind:
                out.append(k)
                if len(out) == missing:
                    break
        out.reverse()
        return out

    def _classify(self, new: list[str], listing: dict[str, dict]) -> tuple[list[str], int | None]:
        lookup, part = self.core.lookup, self.partition
        prompts = [k for k in new if listing[k].get("is_prompt", False)]
        known = dict(zip(prompts, self.core.lookup_many(part, prompts))) if prompts else {}
        check_prompts(part, known, listing)
        registers: list[str] = []
        reissue: int | None = None
        kind, waiting, by_uid = self.kind, self.waiting, self.by_uid
        for k in new:
            if not listing[k] and not _tagless(k, listing):   # its put has not written them yet
                kind[k] = UNTAGGED
                self.untagged[k] = None
                continue
            if k in known:
                tag, g = listing[k], known[k]
                if g is None:
                    registers.append(k)
                    self.kind[k] = PROMPT
                    self.watch[k] = "pending"
                elif g.removed:
                    self._rolled_back(k, g.removed)
                else:                                # known from a restored lake
                    self.kind[k] = PROMPT
                    if g.status not in _TERMINAL:
                        self.watch[k] = g.status
                        if tag.get("status") == "pending" and tag.get("global_steps") != g.global_steps:
                            reissue = int(tag["global_steps"])   # verl re-issued after resume
                continue
            parsed = parse_key(k)
            if parsed is None:
                g = lookup(part, k)
                if g is not None and g.removed:
                    self._orphan(k, "key of a removed group re-created by a late tag write")
                else:
                    self._ignore(k, "neither a prompt key nor {uid}_{session}_{index} with "
                                    "session and index in ASCII digits below 2**31")
                continue
            kind[k] = WAITING
            waiting[k] = parsed
            by_uid.setdefault(parsed[0], []).append(k)
        return registers, reissue

    def _put_waiting(self, listing: dict[str, dict]) -> set[str]:
        """Put the waiting trajectories whose group is known and in flight; returns the uids
        whose terminal status must wait (a key with no data in storage yet)."""
        todo: list[tuple[str, tuple[str, int, int], Any]] = []
        waiting = self.waiting
        if not waiting:
            return set()
        uids = list(dict.fromkeys(parsed[0] for parsed in waiting.values()))
        groups = dict(zip(uids, self.core.lookup_many(self.partition, uids)))  # one per group
        if all(g is not None and not g.removed and not g.keys and g.status not in _TERMINAL
               for g in groups.values()):
            # the usual poll: every waiting key belongs to a group in flight with nothing
            # stored yet, so each is put (what the loop below decides key by key)
            todo = [(k, parsed, groups[parsed[0]]) for k, parsed in waiting.items()]
            waiting.clear()
        for k, parsed in list(waiting.items()):
            g = groups[parsed[0]]
            if g is None:
                continue                              # no prompt key yet: keep waiting
            del waiting[k]
            if g.removed and parsed[0] in self.rolled_back:
                self._orphan(k, f"trajectory of group {parsed[0]!r}, rolled back", quiet=True)
                continue
            if (parsed[1], parsed[2]) in g.keys or g.removed == "sampled":
                self._mark_mirrored((k,))            # known from a restored lake
                continue
            if g.removed or g.status in _TERMINAL:   # late write: never joins a group
                self._orphan(k, f"trajectory of a group that is {g.removed or g.status}")
                continue
            todo.append((k, parsed, g))
        if not todo:
            return set()
        try:
            todo, kept, late = self._put_rows(todo, listing)
        except Exception:
            for k, parsed, _ in todo:               # nothing was accepted: try again next poll
                if self.kind.get(k) == WAITING:     # (a failed group's keys are orphans now)
                    self.waiting[k] = parsed
            raise
        self._mark_mirrored([todo[i][0] for i in kept])
        for i in late:                              # no data in storage yet: read it next poll
            self.waiting[todo[i][0]] = todo[i][1]
        return {todo[i][1][0] for i in late}

    def _put_rows(self, todo: list, listing: dict[str, dict]) -> tuple[list, list[int], list[int]]:
        """Read and put the new trajectories ``todo``; returns (the entries still in play, the
        indices of those put, of those without data yet). A group with a trajectory the core
        (or the conversion before it) refuses is taken out, failed and its keys cleared
        (`_fail_refused`), and the rest is put again: one bad group never blocks a partition."""
        while True:
            keys = [k for k, _, _ in todo]
            try:
                rows, kept, late = trajectory_rows(
                    self.tq, self.partition, [(k, p, g.global_steps) for k, p, g in todo],
                    [listing[k] for k in keys], self.fields, self.filter_metric)
            except IngestError as exc:
                todo = self._fail_refused(exc, keys, todo)   # its rows: indices into todo
                continue
            try:
                if rows is not None:
                    self.core.put(rows)
            except IngestError as exc:
                todo = self._fail_refused(exc, [keys[i] for i in kept], todo)
                continue
            return todo, kept, late

    def _fail_refused(self, exc: IngestError, keys: list[str], todo: list) -> list:
        """Take the groups owning the rows ``exc`` names (``keys[row]``) out of ``todo``: each
        is marked `failure` in the core (so each preset evicts it as it evicts a failed rollout,
        asking for a replacement where it refills failures), its new keys are cleared, and one
        warning names them and the problems. Re-raises ``exc`` when a problem names no row or
        an unknown group (nothing to isolate)."""
        refused = refused_groups(exc, keys)
        if refused is None:
            raise exc
        for u, (ks, why) in refused.items():
            log.warning(
                "verl adapter: group %r of partition %r has TransferQueue key(s) %s the buffer "
                "cannot take (%s); the group is marked 'failure' and evicted like a failed "
                "rollout, its keys cleared, and the other groups go on; fix what writes these "
                "fields (the reward function, the agent loop) for later groups.",
                u, self.partition, ks[:5], "; ".join(why))
        self.core.update_status({"partition": [self.partition] * len(refused),
                                 "uid": list(refused), "status": ["failure"] * len(refused)})
        self.failed_refused += len(refused)
        kept = []
        for entry in todo:
            u = entry[1][0]
            if u in refused:
                self.watch.pop(u, None)             # its TransferQueue status changes nothing
                self._drop_from_group(entry[0])
                self._orphan(entry[0], f"trajectory of group {u!r}, failed", quiet=True)
            else:
                kept.append(entry)
        return kept

    def _drop_from_group(self, k: str) -> None:
        """Take a trajectory key out of its group's list (it is cleared on its own)."""
        uid = k.partition("_")[0]
        keys = self.by_uid.get(uid)
        if keys is not None and k in keys:
            keys.remove(k)
            if not keys:
                del self.by_uid[uid]

    def _apply_statuses(self, listing: dict[str, dict], held: set[str]) -> None:
        uids, statuses = [], []
        for uid, cur in list(self.watch.items()):
            tag = listing.get(uid)
            if tag is None:
                continue          # cleared by someone else: verl forgets it; we keep its state
            s = tag.get("status")
            if s not in _RANK:
                self._unknown_status(uid, s)
                continue
            if s == cur or (cur in _RANK and _RANK[s] < _RANK[cur]):
                continue
            if s in _TERMINAL and (uid in held or (self.waiting and self._has_waiting(uid))):
                continue          # a trajectory of it is not readable yet: next poll
            uids.append(uid)
            statuses.append(s)
        if not uids:
            return
        self.core.update_status({"partition": [self.partition] * len(uids), "uid": uids,
                                 "status": statuses})
        for u, s in zip(uids, statuses):
            if s in _TERMINAL:
                del self.watch[u]
            else:
                self.watch[u] = s

    def _unknown_status(self, uid: str, status: Any) -> None:
        """A prompt key whose `status` tag is none of verl's: the group keeps the status it has
        (verl, too, only acts on the ones it knows); one warning per key and value."""
        if status is None or self._warned_status.get(uid) == status:
            return
        self._warned_status[uid] = status
        log.warning("verl adapter: prompt key %r of partition %r has status %r, none of %s; "
                    "the group stays %r until a status verl writes is listed", uid,
                    self.partition, status, list(_RANK), self.watch.get(uid))

    def _has_waiting(self, uid: str) -> bool:
        return any(self.kind.get(k) == WAITING for k in self.by_uid.get(uid, ()))

    def _release_cleared(self, listing: dict[str, dict]) -> None:
        """A selected batch whose trajectory keys are all gone was cleared by the trainer."""
        for batch_id, keys in list(self.batches.items()):
            if not any(k in listing for k in keys):
                del self.batches[batch_id]
                self.core.release(batch_id)

    # --- core -> TransferQueue (called from the core's listener, under its lock) --------------
    def on_remove(self, uids: list[str]) -> list[str]:
        """Evicted / discarded groups: their prompt key and every trajectory key (verl's set)."""
        keys = list(uids)
        for u in uids:
            self.kind.pop(u, None)
            self.watch.pop(u, None)
            for k in self.by_uid.pop(u, ()):
                keys.append(k)
                self.kind.pop(k, None)
                self.order.pop(k, None)
                self.waiting.pop(k, None)
        return keys

    def on_select(self, uids: list[str], batch_id: int) -> list[str]:
        """Selected groups: only their prompt keys go; their trajectory keys form the batch."""
        traj = [k for u in uids for k in self.by_uid.get(u, ()) if self.kind.get(k) == TRAJ]
        traj.sort(key=self.order.__getitem__)
        self.batches[batch_id] = traj
        for u in uids:
            self.kind.pop(u, None)
            self.watch.pop(u, None)
        return traj

    def batch_keys(self, batch_id: int, expected_rows: int) -> list[str]:
        """A selected batch's trajectory keys, in arrival order; a count other than the batch's
        rows means the mirror and the core disagree, which must never reach the trainer."""
        keys = self.batches.get(batch_id, [])
        if len(keys) != expected_rows:
            raise InvariantError(f"batch {batch_id}: {len(keys)} TransferQueue keys for "
                                 f"{expected_rows} trajectories")
        return keys

    # --- clears, at once or owed to the background thread --------------------------------------
    def clear_keys(self, keys: list[str], defer: bool = False) -> None:
        """kv_clear (never with an empty list); afterwards no listing taken before counts as
        current (the epoch moves on once the clear has returned). ``defer``: only note the keys;
        `flush` clears them (the background thread right after the call, or the next listing
        before it lists), and until then no listing counts as current either."""
        if not keys:
            return
        if defer:
            self.deferred.extend(keys)
        else:
            clear(self.tq, self.partition, keys)
        self.epoch += 1

    def flush(self) -> int:
        """Make the deferred clears (in the order they were deferred); returns how many keys.
        If TransferQueue refuses, every key stays owed and the error propagates."""
        n = self.owed.flush()
        if n:
            self.epoch += 1
        return n

    def mark_stale(self) -> None:
        """No call may use the mirrored state without listing first (the background thread's
        listing failed in the core: the next call lists and raises it to its caller)."""
        self.fresh_epoch = -1

    # --- bookkeeping ---------------------------------------------------------------------------
    def _mark_mirrored(self, keys: Any) -> None:
        """The keys are in the core now, numbered in arrival order (a batch lists them so)."""
        keys = list(keys)
        n = self._arrivals
        self.kind.update(dict.fromkeys(keys, TRAJ))
        self.order.update(zip(keys, range(n, n + len(keys))))
        self._arrivals = n + len(keys)

    def _orphan(self, k: str, why: str, quiet: bool = False) -> None:
        """Clear `k` with the next full sync; ``quiet``: a warning of its own named it already."""
        self.kind[k] = IGNORED
        self._orphans.append(k)
        (log.debug if quiet else log.warning)(
            "verl adapter: clearing orphan key %r of partition %r (%s)", k, self.partition, why)

    def _rolled_back(self, uid: str, fate: str) -> None:
        """A prompt key listed again, with its dispatch tags, for a group the core has removed:
        only a TransferQueue restored to an earlier state (verl's checkpoint resume over a lake
        that went further) writes that. The lake's decision stands; the prompt key and every
        trajectory key of the group are cleared (`_put_waiting` clears those)."""
        self.rolled_back[uid] = fate
        self._new_rolled_back.append(uid)
        self._orphan(uid, f"prompt key of a group already {fate}, rolled back", quiet=True)

    def _warn_rolled_back(self) -> None:
        """One warning for the groups a listing found rolled back (see `_rolled_back`)."""
        if not self._new_rolled_back:
            return
        found, self._new_rolled_back = self._new_rolled_back, []
        log.warning(
            "verl adapter: TransferQueue partition %r holds %d group(s) the buffer has already "
            "sampled or removed: %s (their prompt keys are back with their dispatch tags: a "
            "TransferQueue checkpoint older than the lake was loaded, e.g. verl resumed from an "
            "earlier step; or a uid was used twice; or the last process stopped within "
            "milliseconds of a sample, before its thread had cleared those keys). The lake's "
            "decisions stand: they are not "
            "trained again, and their keys are cleared (except those of a batch the trainer "
            "still holds). To train them again, restore the lake "
            "together with the checkpoint (copy lake_dir when verl saves one), or give lake_dir "
            "a new directory on resume.",
            self.partition, len(found), {u: self.rolled_back[u] for u in found[:5]})

    def _clear_orphans(self) -> None:
        if self._orphans:
            keys, self._orphans = self._orphans, []
            self.clear_keys(keys)
            self._forget(set(keys))
            self.orphans_cleared += len(keys)

    def _ignore(self, k: str, why: str) -> None:
        self.kind[k] = IGNORED
        self.ignored_count += 1
        log.warning("verl adapter: ignoring key %r of partition %r (%s)", k, self.partition, why)

    def _forget(self, gone: set[str]) -> tuple[list[str], dict[str, list[str]]]:
        """Drop keys that left TransferQueue from every map (one loop, locals only: a poll
        forgets the trainer's whole previous batch). Returns the prompt keys among them, and the
        *lost* trajectories: uid -> its mirrored trajectory keys that left while the group is
        still live (its prompt key listed, never selected). The trainer clears only selected
        groups' keys, so someone else cleared those; the core holds their rows, and a group
        cannot be trained on rows TransferQueue no longer has."""
        kind, order, waiting, watch, by_uid = (self.kind, self.order, self.waiting, self.watch,
                                               self.by_uid)
        untagged = self.untagged
        vanished: list[str] = []
        lost: dict[str, list[str]] = {}
        for k in gone:
            order.pop(k, None)
            if waiting:
                waiting.pop(k, None)
            if untagged:
                untagged.pop(k, None)
            was = kind.pop(k)
            if was == PROMPT:
                vanished.append(k)
                watch.pop(k, None)
                self._warned_status.pop(k, None)
                continue
            uid = k.partition("_")[0]     # parse_key's uid; a key it rejects is in no list
            if was == TRAJ and uid not in gone and kind.get(uid) == PROMPT:
                lost.setdefault(uid, []).append(k)
            keys = by_uid.get(uid)
            if keys is not None and k in keys:
                keys.remove(k)
                if not keys:
                    del by_uid[uid]
        return vanished, lost
