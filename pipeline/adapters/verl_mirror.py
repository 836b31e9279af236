"""Mirrors one TransferQueue partition into the core buffer, and TransferQueue effects back.

verl's data plane is TransferQueue: prompt keys `uid` (tags `is_prompt`, `status`, `global_steps`)
and trajectory keys `{uid}_{session}_{index}` (tags with `min/max_global_steps`, fields with
`rm_scores` and `extra_fields`). Before each poll the adapter lists the partition once and feeds
the *difference* since the last listing to the core, in the order the core needs: new prompt keys
are registered, new trajectories put, then status changes applied (a group's trajectories are
always written before its terminal status, and one listing is a consistent snapshot, so this
order never rejects a trajectory verl would have used). Keys of selected groups that disappear
(the trainer clears them after the step) release the batch.

Keys the core must not accept (SPEC §9: a late write that re-creates a removed key, a trajectory
of a removed or already terminal group, a key that does not parse) are *ignored*, never cleared:
the adapter only deletes what verl's buffer would delete. Trajectory keys of a uid no prompt key
names yet (e.g. the trainer's padding rows `pad<hex>_<i>_0`) wait until one does or they vanish.
"""
from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa

from pipeline.adapters import verl_fields as vf
from pipeline.errors import IngestError, InvariantError, MissingMetricError
from schemas import TRAJECTORIES_INPUT

log = logging.getLogger("replaylake.verl")

PROMPT, TRAJ, WAITING, IGNORED = "prompt", "traj", "waiting", "ignored"
_TERMINAL = ("finished", "failure")
_RANK = {"pending": 0, "running": 1, "finished": 2, "failure": 2}


def parse_key(key: str) -> tuple[str, int, int] | None:
    """`{uid}_{session}_{index}` -> (uid, session, index); uid is the text before the first `_`
    (verl's rule, so uids must not contain `_`). None for anything else."""
    uid, sep, rest = key.partition("_")
    if not sep or not uid:
        return None
    s, sep, x = rest.partition("_")
    if not sep or not s.isdigit() or not x.isdigit():
        return None
    return uid, int(s), int(x)


class PartitionMirror:
    """What the adapter knows of one partition's keys, and how to bring the core up to date.

    ``fields``: which trajectory fields to read for new keys (see verl.py, `mirror_fields`):
    `decisions` reads only what a decision needs, `rewards` also every reward for the lake,
    `full` also the token payload."""

    def __init__(self, core: Any, tq: Any, partition: str, fields: str,
                 filter_metric: str | None):
        self.core, self.tq, self.partition, self.fields = core, tq, partition, fields
        self.filter_metric = None if partition == "val" else filter_metric
        self.kind: dict[str, str] = {}              # every listed key -> PROMPT | TRAJ | ...
        self.by_uid: dict[str, list[str]] = {}      # uid -> its listed trajectory keys
        self.order: dict[str, int] = {}             # mirrored trajectory key -> arrival number
        self.waiting: dict[str, tuple[str, int, int]] = {}
        self.watch: dict[str, str] = {}             # in-flight prompt uid -> mirrored status
        self.batches: dict[int, list[str]] = {}     # selected, unreleased batch -> its keys
        self.zv_values: dict[str, float] = {}       # fresh zero-variance groups -> their value
        self.listing: dict[str, dict] = {}
        self.ignored_count = 0
        self._arrivals = 0

    # --- TransferQueue -> core ----------------------------------------------------------------
    def sync(self) -> None:
        """List the partition once and apply the difference to the core (one poll's input)."""
        listing = self.tq.kv_list(partition_id=self.partition).get(self.partition, {})
        self.listing = listing
        gone = self.kind.keys() - listing.keys() if len(self.kind) else ()
        for k in gone:
            self._forget_key(k)
        new = self._new_keys(listing)
        registers, reissue = self._classify(new, listing)
        if reissue is not None:
            self.core.reissue(reissue, self.partition)
        if registers:
            self.core.register({"partition": [self.partition] * len(registers), "uid": registers,
                                "global_steps": [int(listing[u]["global_steps"])
                                                 for u in registers]})
        held = self._put_waiting(listing)
        self._apply_statuses(listing, held)
        self._release_cleared(listing)
        self._note_fresh_zero_variance()

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
        registers: list[str] = []
        reissue: int | None = None
        for k in new:
            tag = listing[k]
            if tag.get("is_prompt", False):
                g = self.core._lookup(self.partition, k)
                if g is None:
                    if "global_steps" not in tag:
                        raise IngestError("verl prompt key", [
                            f"prompt key {k!r} of partition {self.partition!r} has no "
                            "'global_steps' tag (verl's trainer always sets it)"])
                    registers.append(k)
                    self.kind[k] = PROMPT
                    self.watch[k] = "pending"
                elif g.removed:
                    self._ignore(k, "re-created prompt key of a removed group")
                else:                                # known from a restored lake
                    self.kind[k] = PROMPT
                    if g.status not in _TERMINAL:
                        self.watch[k] = g.status
                        if tag.get("status") == "pending" and tag.get("global_steps") != g.gs:
                            reissue = int(tag["global_steps"])   # verl re-issued after resume
                continue
            parsed = parse_key(k)
            if parsed is None:
                self._ignore(k, "neither a prompt key nor {uid}_{session}_{index}")
                continue
            self.kind[k] = WAITING
            self.waiting[k] = parsed
            self.by_uid.setdefault(parsed[0], []).append(k)
        return registers, reissue

    def _put_waiting(self, listing: dict[str, dict]) -> set[str]:
        """Put the waiting trajectories whose group is known and in flight; returns the uids
        whose terminal status must wait (a key with no data in storage yet)."""
        todo: list[tuple[str, tuple[str, int, int], Any]] = []
        for k, parsed in list(self.waiting.items()):
            g = self.core._lookup(self.partition, parsed[0])
            if g is None:
                continue                              # no prompt key yet: keep waiting
            del self.waiting[k]
            if g.removed or g.status in _TERMINAL:
                self.kind[k] = IGNORED               # late write: SPEC §9, never joins a group
                self.ignored_count += 1
                log.warning("verl adapter: ignoring trajectory key %r of partition %r: its "
                            "group is %s", k, self.partition, g.removed or g.status)
                continue
            if (parsed[1], parsed[2]) in g.keys:     # restored from the lake
                self._mark_mirrored(k)
                continue
            todo.append((k, parsed, g))
        if not todo:
            return set()
        rows, held = self._rows(todo, listing)
        if rows is not None:
            self.core.put(rows)
        return held

    def _rows(self, todo: list, listing: dict[str, dict]) -> tuple[pa.Table | None, set[str]]:
        keys = [k for k, _, _ in todo]
        tags = [listing[k] for k in keys]
        need_rm = self.fields != "decisions" or self.filter_metric == "reward"
        need_extra = self.fields != "decisions" or self.filter_metric not in (None, "reward")
        extra_keys = keys if need_extra else [k for k, t in zip(keys, tags)
                                              if not vf.has_tag_versions(t)]
        read = vf.read_fields(self.tq, self.partition, keys, ["rm_scores"] if need_rm else [])
        if extra_keys:
            ex = vf.read_fields(self.tq, self.partition, extra_keys, ["extra_fields"])
            pos = {k: i for i, k in enumerate(extra_keys)}
            extra_rows = [ex["extra_fields"][pos[k]] if k in pos else None for k in keys]
        else:
            extra_rows = [None] * len(keys)
        tokens = {}
        if self.fields == "full":
            tokens = vf.read_fields(self.tq, self.partition, keys,
                                    ["prompts", "responses", "response_mask", "rollout_log_probs"])
        rm_rows = read.get("rm_scores", [None] * len(keys))
        held: set[str] = set()
        keep: list[int] = []
        for i, (k, parsed, _) in enumerate(todo):
            rows_of_key = [rm_rows[i], extra_rows[i], *(tokens[f][i] for f in tokens)]
            if any(r is vf.NOT_READY for r in rows_of_key):
                self.waiting[k] = parsed              # read it again next poll
                held.add(parsed[0])
            else:
                keep.append(i)
        missing_rm = [todo[i][0] for i in keep
                      if need_rm and self.filter_metric == "reward" and rm_rows[i] is vf.MISSING]
        if missing_rm:
            for i in keep:
                self.waiting[todo[i][0]] = todo[i][1]
            raise MissingMetricError(
                f"{len(missing_rm)} trajectory key(s) of partition {self.partition!r} have no "
                f"'rm_scores' field, which filter_groups_metric='reward' needs: "
                f"{sorted({k.split('_')[0] for k in missing_rm})[:5]} (keys {missing_rm[:5]})")
        if not keep:
            return None, held
        cols: dict[str, list] = {c: [] for c in (
            "uid", "session_id", "index", "min_global_steps", "max_global_steps", "reward",
            "reward_info", "is_padding", "versions_inferred")}
        for i in keep:
            k, (uid, s, x), g = todo[i]
            extra = vf.extra_of(extra_rows[i])
            lo, hi, inferred = vf.versions_of(tags[i], extra, g.gs)
            reward = vf.reward_of(rm_rows[i])
            cols["uid"].append(uid)
            cols["session_id"].append(s)
            cols["index"].append(x)
            cols["min_global_steps"].append(lo)
            cols["max_global_steps"].append(hi)
            cols["reward"].append(0.0 if reward is None else reward)
            cols["reward_info"].append(vf.reward_info_of(extra))
            cols["is_padding"].append(bool(tags[i].get("is_padding", False)))
            cols["versions_inferred"].append(inferred)
        n = len(keep)
        data = {f.name: pa.array(cols[f.name], type=f.type) for f in TRAJECTORIES_INPUT
                if f.name in cols}
        data["partition"] = pa.array([self.partition] * n, pa.string())
        empty = pa.array([[]] * n, pa.list_(pa.int32()))
        data["prompt_ids"], data["response_ids"] = empty, empty
        for name, src, typ in (("prompt_ids", "prompts", pa.int32()),
                               ("response_ids", "responses", pa.int32()),
                               ("response_mask", "response_mask", pa.int8()),
                               ("rollout_log_probs", "rollout_log_probs", pa.float32())):
            if src in tokens:
                arr = vf.token_lists([tokens[src][i] for i in keep], typ)
                if name in ("prompt_ids", "response_ids"):
                    arr = arr.fill_null([]) if arr.null_count else arr
                data[name] = arr
        table = pa.table({f.name: data[f.name] if f.name in data else pa.nulls(n, f.type)
                          for f in TRAJECTORIES_INPUT}, schema=TRAJECTORIES_INPUT)
        for i in keep:
            self._mark_mirrored(todo[i][0])
        return table, held

    def _apply_statuses(self, listing: dict[str, dict], held: set[str]) -> None:
        uids, statuses = [], []
        for uid, cur in list(self.watch.items()):
            tag = listing.get(uid)
            if tag is None:
                continue          # cleared by someone else: verl forgets it; we keep its state
            s = tag.get("status")
            if s == cur or (s in _RANK and cur in _RANK and _RANK[s] < _RANK[cur]):
                continue
            if s in _TERMINAL and (uid in held or self._has_waiting(uid)):
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

    def _has_waiting(self, uid: str) -> bool:
        return any(self.kind.get(k) == WAITING for k in self.by_uid.get(uid, ()))

    def _release_cleared(self, listing: dict[str, dict]) -> None:
        """A selected batch whose trajectory keys are all gone was cleared by the trainer."""
        for batch_id, keys in list(self.batches.items()):
            if not any(k in listing for k in keys):
                del self.batches[batch_id]
                self.core.release(batch_id)

    def _note_fresh_zero_variance(self) -> None:
        """Remember the value of each newly terminal zero-variance group (the core's own
        classification), so evictions during `wait_for_sampleable` can report reward counts."""
        if self.filter_metric is None:
            return
        from pipeline.candidates import ZV_YES
        with self.core._cond:
            part = self.core._parts.get(self.partition)
            if part is None:
                return
            for u in part.candidates.fresh:
                c = part.candidates.alive.get(u)
                if c is not None and c.zv == ZV_YES:
                    self.zv_values[u] = c.value

    # --- bookkeeping ---------------------------------------------------------------------------
    def _mark_mirrored(self, k: str) -> None:
        self.kind[k] = TRAJ
        self.order[k] = self._arrivals
        self._arrivals += 1

    def _ignore(self, k: str, why: str) -> None:
        self.kind[k] = IGNORED
        self.ignored_count += 1
        log.warning("verl adapter: ignoring key %r of partition %r (%s)", k, self.partition, why)

    def _forget_key(self, k: str) -> None:
        kind = self.kind.pop(k)
        self.order.pop(k, None)
        self.waiting.pop(k, None)
        if kind == PROMPT:
            self.watch.pop(k, None)
            return
        parsed = parse_key(k)
        if parsed is not None:
            keys = self.by_uid.get(parsed[0])
            if keys is not None:
                if k in keys:
                    keys.remove(k)
                if not keys:
                    del self.by_uid[parsed[0]]

    # --- core -> TransferQueue (called from the core's listener, under its lock) --------------
    def on_remove(self, uids: list[str]) -> list[str]:
        """Evicted / discarded groups: their prompt key and every trajectory key (verl's set)."""
        keys = list(uids)
        for u in uids:
            self.kind.pop(u, None)
            self.watch.pop(u, None)
            self.zv_values.pop(u, None)
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
            self.zv_values.pop(u, None)
        return traj

    def batch_keys(self, batch_id: int, expected_rows: int) -> list[str]:
        keys = self.batches.get(batch_id, [])
        if len(keys) != expected_rows:
            raise InvariantError(f"batch {batch_id}: {len(keys)} TransferQueue keys for "
                                 f"{expected_rows} trajectories")
        return keys


def clear(tq: Any, partition: str, keys: list[str]) -> None:
    """kv_clear, never with an empty key list (TransferQueue raises on one)."""
    if keys:
        tq.kv_clear(keys=keys, partition_id=partition)
