"""The replay's feed: the recorded rows into the replay buffer, in seq order, one window of the
record at a time, holding back refill groups until the replay's refill of their partition asks
for them.

The rows come from `Record.windows` (group events and trajectory metadata of one seq window) and
the recorded releases (one seq per recorded batch, from `Record.calls`). Within a window every
row to feed is one entry of three arrays in seq order (kind, row of its table, seq) and each
row's group one integer: no Python object per row. The window is dropped once fed; rows of a
refill group the replay has not drawn yet are copied out of it and held, per group, until its
refill draws it (or the replay ends).
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.analysis.whatif.record import Call, Record, stand_in
from pipeline.errors import ReplayLakeError

_EVENT, _TRAJ, _RELEASE = 0, 1, 2   # what a row to feed is (`_Rows.kind`)
ALL = 2**62                          # a seq past every row of any lake


class _Rows:
    """Recorded rows to feed, in seq order: group events, trajectory metadata, releases."""

    def __init__(self, events: pa.Table, traj: pa.Table, rel_seq: np.ndarray,
                 rel_ref: np.ndarray):
        self.events, self.traj = events, traj
        keys = pc.dictionary_encode(pa.concat_arrays(
            [_group_key(events), _group_key(traj)]))
        self.keys = keys.dictionary                       # group integer -> its key
        group = np.asarray(keys.indices, dtype=np.int64)
        self.ev_group, self.tr_group = group[:events.num_rows], group[events.num_rows:]
        self.ev_registered = np.asarray(pc.equal(events["event"], "registered"), dtype=bool)
        seq = np.concatenate([events["seq"].to_numpy(), traj["seq"].to_numpy(), rel_seq])
        kind = np.concatenate([np.full(events.num_rows, _EVENT, np.int8),
                               np.full(traj.num_rows, _TRAJ, np.int8),
                               np.full(len(rel_seq), _RELEASE, np.int8)])
        ref = np.concatenate([np.arange(events.num_rows), np.arange(traj.num_rows),
                              rel_ref.astype(np.int64)])
        order = np.argsort(seq, kind="stable")
        self.seq, self.kind, self.ref = seq[order], kind[order], ref[order]

    def refill_flags(self, refill_keys: pa.Array) -> np.ndarray:
        """Per group integer of this window: whether it is a recorded refill group."""
        if not hasattr(self, "_refill"):
            self._refill = np.asarray(pc.is_in(self.keys, value_set=refill_keys), dtype=bool)
        return self._refill

    def group(self, pos: int) -> int | None:
        kind, ref = self.kind[pos], self.ref[pos]
        if kind == _EVENT:
            return int(self.ev_group[ref])
        if kind == _TRAJ:
            return int(self.tr_group[ref])
        return None

    def kind_of(self, pos: int) -> str:
        kind = self.kind[pos]
        if kind == _TRAJ:
            return "traj"
        if kind == _RELEASE:
            return "release"
        return "register" if self.ev_registered[self.ref[pos]] else "status"

    def held(self, positions: list[int]) -> dict[str, list[tuple[int, str, pa.Table]]]:
        """The rows at ``positions`` copied out of the window, per group key: (seq, table, row)."""
        out: dict[str, list[tuple[int, str, pa.Table]]] = {}
        for name, code, table in (("events", _EVENT, self.events), ("traj", _TRAJ, self.traj)):
            mine = [p for p in positions if self.kind[p] == code]
            if not mine:
                continue
            rows = table.take(pa.array(self.ref[mine]))      # a copy: the window can go
            for i, p in enumerate(mine):
                key = self.keys[self.group(p)].as_py()
                out.setdefault(key, []).append((int(self.seq[p]), name, rows.slice(i, 1)))
        return out


def _group_key(t: pa.Table) -> pa.Array:
    """One string per row naming its group (partition and uid)."""
    return pc.binary_join_element_wise(t["partition"], t["uid"], "\x00").combine_chunks() \
        if t.num_rows else pa.array([], pa.string())


class Feed:
    """Feeds the recorded rows into the replay buffer in seq order (see the module doc)."""

    def __init__(self, buf, record: Record, calls: list[Call],
                 released: dict[tuple[str, int], int]):
        self.buf = buf
        # a recorded release, at the seq of its first row; `ref` indexes `releases`
        self.released = released
        self.releases = sorted(released, key=released.get)
        self.rel_seq = np.asarray([released[k] for k in self.releases], dtype=np.int64)
        # per partition, its recorded refill groups in order (`_Pool`); `late`: how many of
        # them were registered only after a later decision than their refill's
        # (`_refill_pools`); `asked_later` / `asked_earlier`: those the replay asked for at a
        # later / an earlier step (they keep the recorded dispatch step and weight versions)
        self.pools, self.late = _refill_pools(record, calls)
        self.asked_later = self.asked_earlier = 0
        self.refill_groups = {k for pool in self.pools.values() for k in pool.keys}
        self._refill_keys = pa.array(sorted(self.refill_groups), pa.string())
        self.held: dict[str, list[tuple[int, str, pa.Table]]] = {}
        self.drawn: set[str] = set()
        self.shortfall = 0
        self.end: int | None = None     # feed no row with seq >= end (a window of the record)
        # every row with a lower seq is fed (or held for its refill); known without reading
        # the next window, which `_current` would read while the caller holds a batch
        self.reached = 0
        self._windows: Iterator[tuple[pa.Table, pa.Table]] = record.windows()
        self._rel_pos = 0
        self.rows: _Rows | None = None
        self.pos = 0
        self._empty: dict[str, pa.Table] = {}     # each table's schema, from the first window
        # recorded (partition, batch_id) -> the replay's batch id for that call, until released
        self.batch_of: dict[tuple[str, int], int] = {}

    def _current(self) -> _Rows | None:
        """The window holding the next row to feed (the next one read when this one is done);
        None when the record is fed."""
        while self.rows is None or self.pos >= len(self.rows.seq):
            got = next(self._windows, None)
            if got is None:
                if self._rel_pos < len(self.rel_seq) and self._empty:   # releases after the
                    got = (self._empty["events"], self._empty["traj"])     # last row
                    hi = None
                else:
                    self.rows = None
                    return None
            else:
                hi = int(max(_last(got[0]), _last(got[1]))) + 1
                self._empty = self._empty or {"events": got[0].slice(0, 0),
                                              "traj": got[1].slice(0, 0)}
            stop = len(self.rel_seq) if hi is None else \
                int(np.searchsorted(self.rel_seq, hi))
            rel = np.arange(self._rel_pos, stop)
            self._rel_pos = stop
            self.rows, self.pos = _Rows(*got, self.rel_seq[rel], rel), 0
        return self.rows

    def handed_out(self, recorded: tuple[str, int], batch_id: int) -> None:
        """The replay's batch ``batch_id`` stands for the recorded batch ``recorded`` (partition,
        batch id): released when the feed reaches the recorded release, or at once where the
        feed is past it already (a replayed call that polled longer than the recorded one)."""
        seq = self.released.get(recorded)
        if seq is not None and seq < self.reached:
            self.buf.release(batch_id)
        else:
            self.batch_of[recorded] = batch_id

    @property
    def undrawn(self) -> int:
        """The recorded refill groups the replay has not asked for (yet)."""
        return sum(len(pool.keys) for pool in self.pools.values())

    def refill(self, n: int, step: int, partition: str) -> None:
        """The replay's refill of ``partition``, asked at ``step``: hand out the next n recorded
        refill groups of that partition (what the feed held back of them is applied in seq
        order, in as few calls as `_apply_all` can)."""
        due: list[tuple[int, str, pa.Table]] = []
        taken = self.pools[partition].take(n) if partition in self.pools else []
        for key, asked in taken:
            self.drawn.add(key)
            due += self.held.pop(key, [])
            self.asked_later += asked < step
            self.asked_earlier += asked > step
        self.shortfall += n - len(taken)
        if due:
            due.sort(key=lambda r: r[0])
            rows = _Rows(*(pa.concat_tables([self._empty[name]] + [r[2] for r in due if r[1] == name])
                           .combine_chunks() for name in ("events", "traj")),
                         np.zeros(0, np.int64), np.zeros(0, np.int64))
            self._apply_all(rows, list(range(len(rows.seq))))

    def advance(self, until: int | None) -> bool:
        """Feed every row with seq < until (None: all). Returns whether anything was left."""
        if self.end is not None:         # a window of the record: nothing generated after it
            until = self.end if until is None else min(until, self.end)
        self.reached = max(self.reached, ALL if until is None else until)
        fed = False
        while (rows := self._current()) is not None:
            stop = len(rows.seq) if until is None else int(np.searchsorted(rows.seq, until))
            if stop <= self.pos:
                break
            due, hold = list(range(self.pos, stop)), []
            if self.refill_groups:
                flags, due = rows.refill_flags(self._refill_keys), []
                for pos in range(self.pos, stop):
                    g = rows.group(pos)
                    if g is not None and flags[g] and rows.keys[g].as_py() not in self.drawn:
                        hold.append(pos)
                    else:
                        due.append(pos)
            for key, held in rows.held(hold).items():
                self.held.setdefault(key, []).extend(held)
            self.pos, fed = stop, True
            self._apply_all(rows, due)
        return fed

    def _apply_all(self, rows: _Rows, positions: list[int]) -> None:
        """Apply the rows at ``positions`` in order, each run of consecutive rows of one kind
        (trajectories, registrations, status changes) as one call.

        Nothing polls between two rows of a run (polls happen only between feed steps), and no
        recorded trajectory or registration can be refused (a group accepts rows until its
        terminal event, which comes after them), so one call leaves the buffer as the rows one
        by one would; a status run that is refused is applied row by row. Row-by-row calls
        would cost the buffer, its journal and the replay's lake one record batch per row."""
        run: list[int] = []
        run_kind, run_keys = None, set()
        for pos in positions:
            kind = rows.kind_of(pos)
            # a group's rows of one put may repeat its key; one status call takes a group once
            key = rows.group(pos) if kind == "status" else None
            if kind != run_kind or kind == "release" or key in run_keys:
                self._apply_run(rows, run_kind, run)
                run, run_kind, run_keys = [], kind, set()
            run.append(pos)
            if key is not None:
                run_keys.add(key)
        self._apply_run(rows, run_kind, run)

    def _apply_run(self, rows: _Rows, kind: str | None, run: list[int]) -> None:
        if not run:
            return
        buf = self.buf
        refs = rows.ref[run]
        if kind == "traj":
            first = int(refs[0])
            contiguous = int(refs[-1]) - first + 1 == len(refs)
            buf.put(stand_in(rows.traj.slice(first, len(refs)) if contiguous
                             else rows.traj.take(refs)))
        elif kind == "release":
            b = self.batch_of.pop(self.releases[int(refs[0])], None)
            if b is not None:    # the replay's batch leaves memory when the recorded one did
                buf.release(b)
        elif kind == "register":
            ev = rows.events.take(refs)
            buf.register({k: ev[k].to_pylist() for k in
                          ("partition", "uid", "global_steps", "n", "prompt_id", "dataset")})
        else:
            ev = rows.events.take(refs)
            parts, uids, status = (ev[k].to_pylist() for k in ("partition", "uid", "event"))
            try:
                buf.update_status({"partition": parts, "uid": uids, "status": status})
            except ReplayLakeError:
                for p, u, st in zip(parts, uids, status):   # all-or-nothing: none was applied
                    try:
                        buf.update_status(partition=p, uids=[u], status=st)
                    except ReplayLakeError:
                        pass   # a status for a group this replay evicted already (what-if)


class _Pool:
    """One partition's recorded refill groups in the order they were registered, each with the
    step its refill was asked at."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.steps: list[int] = []

    def add(self, keys: list[str], step: int) -> None:
        self.keys += keys
        self.steps += [step] * len(keys)

    def take(self, n: int) -> list[tuple[str, int]]:
        """The next n groups (fewer where the pool runs out), each with its refill's step."""
        got = list(zip(self.keys[:n], self.steps[:n]))
        del self.keys[:n], self.steps[:n]
        return got


def _refill_pools(record: Record, calls: list[Call]) -> tuple[dict[str, _Pool], int]:
    """Per partition, the groups its recorded refills registered: the `count` registrations of
    that partition that follow each served refill decision of it. The buffer asks refill_fn
    for the partition that polled, and refill_fn registers its groups there, so another
    partition's registrations are never taken for them.

    Also how many of them were registered only after the recorded decision point that followed
    their refill decision (a refill_fn that returned before registering; one that registers
    before it returns is done before its call polls again). Their attribution is a guess: the
    trainer or another producer may have registered groups of the partition meanwhile."""
    pools: dict[str, _Pool] = {}
    regs = _registrations(record)
    points = np.sort(np.fromiter((s for c in calls for s in c.points.values()), np.int64))
    cursor: dict[str, int] = {}
    late = 0
    none = (np.zeros(0, np.int64),) * 2
    for seq, count, step, part in record.refills():
        idx, seqs = regs.get(part, none)
        j = max(cursor.get(part, 0), int(np.searchsorted(seqs, seq)))
        took = idx[j:j + count]
        cursor[part] = j + len(took)
        keys = record.registered_key.take(pa.array(took, pa.int64())).to_pylist()
        pools.setdefault(part, _Pool()).add(keys, step)
        late += _registered_late(seqs[j:j + count], seq, points)
    return pools, late


def _registrations(record: Record) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per partition, the positions of its registrations among the record's (`Record.check`)
    and their seqs, in seq order."""
    codes = pc.dictionary_encode(record.registered_partition)
    index = np.asarray(codes.indices, dtype=np.int64)
    mine = {name: np.flatnonzero(index == i)
            for i, name in enumerate(codes.dictionary.to_pylist())}
    return {name: (idx, record.registered_seq[idx]) for name, idx in mine.items()}


def _registered_late(seqs: np.ndarray, asked: int, points: np.ndarray) -> int:
    """How many of a refill's registrations (at ``seqs``) come after the first recorded decision
    point after its refill decision (at ``asked``); none where no decision followed it."""
    nxt = int(np.searchsorted(points, asked, side="right"))
    return int(np.count_nonzero(seqs > points[nxt])) if nxt < len(points) else 0


def _last(t: pa.Table) -> int:
    return int(t["seq"][-1].as_py()) if t.num_rows else -1
