"""What-if replays: run a recorded lake's rollouts through a fresh ReplayBuffer with other
settings, so eviction and selection are decided by the very rules the live buffer runs.

How the replay follows the recorded run:

* Time is the lake's `seq`. Every row of `group_events` and `trajectories` is fed back through
  the public API (`register`, `update_status`, `put`) in seq order; a recorded `release` is
  replayed as `release` of the batch the replay handed out for that call.
* Each recorded sample call (`call_id`, its step, partition and number of selected groups) becomes
  one `sample(step, partition, batch_size)`. Before each poll (`before_poll`) the feed advances to
  the next recorded decision point (the first seq of a recorded poll that decided something), so
  a poll sees exactly what the recorded poll saw. When the recorded points run out the feed moves
  on into later recorded data, as a slower trainer would have waited for it.
* Groups that a refill registered in the recorded run (the `count` registrations that follow each
  refill decision) form a pool: the replay's `refill_fn(n)` hands out the next `n` of them, and
  their events are fed from then on. A refill group the replay never asks for never appears; a
  refill the pool cannot serve is counted as `refill_shortfall`. A run recorded without a
  `refill_fn` is replayed without one (unless the settings filter groups, which needs one).

With the recorded settings this reproduces every recorded batch (tests/analysis/test_whatif.py checks it
on a scripted run and on a demo lake), which also shows the decision log holds every input the
decisions depend on. Not replayable: re-issues after a restart (`reissued` events; the public
API has no call for them) and refills issued by a `refill_fn` that registered groups other than
right after its refill decision while other producers registered too (the pool attribution
assumes the `count` registrations that follow the decision belong to it).

What the replay cannot make real: rollouts keep the weight versions they were recorded with. When
other settings evict more, the feed reaches rollouts the recorded run generated later, with newer
weights, and a sample call can train rows whose newest version is not older than its step. The
live buffer warns about such rows on every call; the replay counts them per step instead
(`Outcome.future_rows`, see pipeline.analysis.whatif.outcome) and leaves the summary to its caller.

Memory: the feed reads the recorded metadata once (`record.read_metadata`: no token payload; each
put gets a stand-in payload of the recorded lengths, `record.stand_in`), keeps its rows to feed
as three arrays in seq order and each group as an integer, and puts every run of consecutive
trajectory rows in one call (not row by row: each call costs the buffer, its journal and the
replay's lake a record batch). The replay buffer holds only what its own decisions keep: each
replayed batch is released where the recorded run released its batch. The recorded batches of
the replay are read back from its decision log alone, not its payload.
"""
from __future__ import annotations

import bisect
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.analysis.whatif.outcome import Outcome, future_rows, future_warnings_held
from pipeline.analysis.whatif.record import read_metadata, stand_in
from pipeline.errors import ConfigError, LakeError, ReplayLakeError

SAMPLE_TIMEOUT_S = 600.0   # a safety net only: an unfillable call ends when the feed runs dry
_EVENT, _TRAJ, _RELEASE = 0, 1, 2   # what a row to feed is (`_Feed.kind`)
IDLE_POLLS = 3             # polls in a row with nothing left to feed: the batch cannot fill


class _Unfillable(Exception):
    """The recorded run has nothing more to feed and the replay's batch is still short."""


def recorded_settings(lake: Path) -> dict[str, Any]:
    """The sample settings recorded in the lake's configuration (`async`/`sync` keywords, the
    opt-in rules as ``rules``; a lake from before the mapping records its rules the same way)."""
    from pipeline.config import opt_in_rules
    from pipeline.lake import config as lake_config
    from pipeline.lake import require_lake
    cfg = lake_config.current(require_lake(lake))
    if cfg is None:
        raise LakeError(f"{lake} records no configuration ({lake_config.FILE}); give every setting")
    keys = ("preset", "max_off_policy_threshold", "max_off_policy_strategy",
            "filter_groups_metric")
    missing = [k for k in keys if k not in cfg]
    if missing:
        raise LakeError(f"{Path(lake) / lake_config.FILE} records no {', '.join(missing)}: the replay needs "
                        "the settings the run was made with; restore the file from a backup")
    # the opt-in rules as a `rules=` mapping; the others follow from the keywords above; a lake
    # recorded before the selection order was a setting chose oldest first
    return {**{k: cfg[k] for k in keys}, "rules": opt_in_rules(cfg.get("rules")),
            "selection_order": cfg.get("selection_order", "oldest")}


def _calls(decisions: pa.Table) -> list[dict]:
    """Recorded sample calls in order: call id, step, partition, groups selected, poll points."""
    rows = decisions.filter(pc.greater_equal(decisions["call_id"], 0)).to_pylist()
    calls: dict[int, dict] = {}
    for r in rows:
        c = calls.setdefault(r["call_id"], {"call_id": r["call_id"], "step": r["step"],
                                            "partition": r["partition"], "uids": [],
                                            "points": {}})
        c["points"].setdefault(r["poll"], r["seq"])
        c["points"][r["poll"]] = min(c["points"][r["poll"]], r["seq"])
        if r["kind"] == "select":
            c["uids"].append(r["uid"])
    return [c for _, c in sorted(calls.items()) if c["uids"]]


class _Feed:
    """Feeds the recorded rows into the replay buffer in seq order, holding back refill groups
    until the replay's refill asks for them."""

    def __init__(self, buf: Any, tables: dict[str, pa.Table]):
        self.buf = buf
        ev = tables["group_events"]
        if pc.any(pc.equal(ev["event"], "reissued")).as_py():
            raise LakeError("the lake holds re-issued groups (a restore); a what-if replay "
                            "cannot re-issue through the public API")
        tr = tables["trajectories"]
        self.traj = tr      # metadata only: each put gets a stand-in payload (`record.stand_in`)
        self.events = ev
        dec = tables["decisions"]
        # a recorded release has one row per group of its batch; the first one releases it
        rel = dec.filter(pc.equal(dec["kind"], "release"))
        first: dict[tuple[str, int], int] = {}
        for s, p, b in zip(rel["seq"].to_pylist(), rel["partition"].to_pylist(),
                           rel["batch_id"].to_pylist()):
            first.setdefault((p, b), s)
        self.releases = list(first)
        # every row to feed as three arrays in seq order (kind, row of its table, seq), and
        # each event's and trajectory's group as one integer: no Python object per row
        group = pc.dictionary_encode(pa.concat_arrays(
            [_group_key(ev).combine_chunks(), _group_key(tr).combine_chunks()])).indices
        group = np.asarray(group, dtype=np.int64)
        self.ev_group, self.tr_group = group[:ev.num_rows], group[ev.num_rows:]
        self.ev_registered = np.asarray(pc.equal(ev["event"], "registered"), dtype=bool)
        seq = np.concatenate([ev["seq"].to_numpy(), tr["seq"].to_numpy(),
                              np.asarray(list(first.values()), dtype=np.int64)])
        kind = np.concatenate([np.full(ev.num_rows, _EVENT, np.int8),
                               np.full(tr.num_rows, _TRAJ, np.int8),
                               np.full(len(first), _RELEASE, np.int8)])
        ref = np.concatenate([np.arange(ev.num_rows), np.arange(tr.num_rows),
                              np.arange(len(first))])
        order = np.argsort(seq, kind="stable")
        self.seq, self.kind, self.ref = seq[order], kind[order], ref[order]
        self.pool, self.refill_groups = self._refill_pool(dec)
        self.held: dict[int, list[int]] = {}    # refill group -> positions held back
        self.drawn: set[int] = set()
        self.pos = 0
        self.end: int | None = None     # feed no row with seq >= end (a window of the record)
        # recorded (partition, batch_id) -> the replay's batch id for that call, until released
        self.batch_of: dict[tuple[str, int], int] = {}

    def _refill_pool(self, dec: pa.Table) -> tuple[list[int], set[int]]:
        failed = {(r["partition"], r["call_id"], r["poll"]) for r in
                  dec.filter(pc.equal(dec["kind"], "refill_failed")).to_pylist()}
        refills = [r for r in dec.filter(pc.equal(dec["kind"], "refill")).to_pylist()
                   if (r["partition"], r["call_id"], r["poll"]) not in failed]   # served asks
        reg_seq = self.events["seq"].to_numpy()[self.ev_registered]
        reg_group = self.ev_group[self.ev_registered]
        pool: list[int] = []
        j = 0
        for r in sorted(refills, key=lambda x: x["seq"]):
            j = max(j, int(np.searchsorted(reg_seq, r["seq"])))
            take = reg_group[j:j + r["count"]].tolist()
            pool += take
            j += len(take)
        return pool, set(pool)

    def refill(self, n: int) -> None:
        """The replay's refill_fn: hand out the next n recorded refill groups (what the feed
        held back of them is applied in seq order, in as few calls as `_apply_all` can)."""
        due: list[int] = []
        for key in self.pool[:n]:
            self.drawn.add(key)
            due += self.held.pop(key, [])
        self._apply_all(sorted(due))
        self.shortfall = getattr(self, "shortfall", 0) + max(n - len(self.pool), 0)
        del self.pool[:n]

    def _key(self, pos: int) -> int | None:
        kind, ref = self.kind[pos], self.ref[pos]
        if kind == _EVENT:
            return int(self.ev_group[ref])
        if kind == _TRAJ:
            return int(self.tr_group[ref])
        return None

    def advance(self, until: int | None) -> bool:
        """Feed every row with seq < until (None: all). Returns whether anything was left."""
        start = self.pos
        if self.end is not None:         # a window of the record: nothing generated after it
            until = self.end if until is None else min(until, self.end)
        stop = len(self.seq) if until is None else int(np.searchsorted(self.seq, until))
        due: list[int] = []
        for pos in range(start, max(stop, start)):
            key = self._key(pos)
            if key in self.refill_groups and key not in self.drawn:
                self.held.setdefault(key, []).append(pos)
            else:
                due.append(pos)
        self.pos = max(stop, start)
        self._apply_all(due)
        return self.pos > start

    def _apply_all(self, positions: list[int]) -> None:
        """Apply the rows at ``positions`` in order, each run of consecutive rows of one kind (trajectories,
        registrations, status changes) as one call.

        Nothing polls between two rows of a run (polls happen only between feed steps), and no
        recorded trajectory or registration can be refused (a group accepts rows until its
        terminal event, which comes after them), so one call leaves the buffer as the rows one
        by one would; a status run that is refused is applied row by row. Row-by-row calls
        would cost the buffer, its journal and the replay's lake one record batch per row."""
        run: list[int] = []
        run_kind, run_keys = None, set()
        for pos in positions:
            kind = self._kind(pos)
            # a group's rows of one put may repeat its key; one status call takes a group once
            key = self._key(pos) if kind == "status" else None
            if kind != run_kind or kind == "release" or key in run_keys:
                self._apply_run(run_kind, run)
                run, run_kind, run_keys = [], kind, set()
            run.append(pos)
            if key is not None:
                run_keys.add(key)
        self._apply_run(run_kind, run)

    def _kind(self, pos: int) -> str:
        kind = self.kind[pos]
        if kind == _TRAJ:
            return "traj"
        if kind == _RELEASE:
            return "release"
        return "register" if self.ev_registered[self.ref[pos]] else "status"

    def _apply_run(self, kind: str | None, run: list[int]) -> None:
        if not run:
            return
        buf = self.buf
        rows = self.ref[run]
        if kind == "traj":
            first = int(rows[0])
            contiguous = int(rows[-1]) - first + 1 == len(rows)
            buf.put(stand_in(self.traj.slice(first, len(rows)) if contiguous
                             else self.traj.take(rows)))
        elif kind == "release":
            b = self.batch_of.pop(self.releases[int(rows[0])], None)
            if b is not None:    # the replay's batch leaves memory when the recorded one did
                buf.release(b)
        elif kind == "register":
            ev = self.events.take(rows)
            buf.register({k: ev[k].to_pylist() for k in
                          ("partition", "uid", "global_steps", "n", "prompt_id", "dataset")})
        else:
            ev = self.events.take(rows)
            parts, uids, status = (ev[k].to_pylist() for k in ("partition", "uid", "event"))
            try:
                buf.update_status({"partition": parts, "uid": uids, "status": status})
            except ReplayLakeError:
                for p, u, st in zip(parts, uids, status):   # all-or-nothing: none was applied
                    try:
                        buf.update_status(partition=p, uids=[u], status=st)
                    except ReplayLakeError:
                        pass   # a status for a group this replay evicted already (what-if)


def _group_key(t: pa.Table) -> pa.ChunkedArray:
    """One string per row naming its group (partition and uid)."""
    return pc.binary_join_element_wise(t["partition"], t["uid"], "\x00")


# settings whose None is a value of its own (no filter, no bound), kept when given as None
NULLABLE = ("filter_groups_metric", "max_off_policy_threshold")


def chosen_settings(lake: Path, settings: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The preset and buffer keywords a replay of ``lake`` with ``settings`` runs under: the
    recorded settings with the given ones on top (``rules`` entry by entry, see `replay`).
    Checked as the buffer checks them, without a lake, so a bad value is refused before any
    replay starts."""
    from pipeline.config import async_config, preset_kwargs, sync_config, with_sugar
    from pipeline.config.rule_knobs import SUGAR
    given = {k: v for k, v in settings.items() if v is not None or k in NULLABLE}
    changed = with_sugar(given.pop("rules", None), **{k: given.pop(k) for k in SUGAR if k in given})
    chosen = recorded_settings(lake)
    chosen = {**chosen, **given, "rules": {**chosen["rules"], **changed}}
    preset = chosen.pop("preset")
    if chosen.get("max_off_policy_strategy") == "admit":
        raise ConfigError(
            "what-if cannot replay max_off_policy_strategy='admit': admission paces the "
            "rollout side's dispatches, and a replay feeds the recorded groups as they were "
            "dispatched; replay with --strategy drop or wait, or compare real runs (chart each "
            "with the dispatch_pacing query); `--compare strategy=admit` approximates it")
    if preset not in ("async", "sync"):
        raise ConfigError(f"what-if replays the async and sync presets; the lake's is {preset!r}")
    kwargs = {k: v for k, v in chosen.items() if v is not None or k in NULLABLE}
    make = async_config if preset == "async" else sync_config
    preset_kwargs(f"ReplayBuffer.{'async_' if preset == 'async' else 'sync'}", make, kwargs)
    make(**kwargs, refill_fn=lambda n: None)     # the replay's refill_fn stands in
    return preset, kwargs


def replay(lake: str | os.PathLike, out_lake: str | os.PathLike | None = None, *,
           max_calls: int | None = None, **settings: Any) -> Outcome:
    """Replay ``lake`` with ``settings`` (the recorded ones where not given); the replay writes
    its own lake (``out_lake`` or a temporary directory) so both can be compared with SQL.

    ``max_calls``: replay only the first that many recorded sample calls, fed only the rows the
    recorded run had written by the end of the last of them (a quick look at the start of a
    long run: every policy gets the same rollouts, and the replay's lake covers that window).

    ``rules`` changes the recorded opt-in rules one by one (``{"overlong": None}`` switches one
    off, a rule not named keeps its recorded parameters); ``max_response_length`` is shorthand
    for the overlong entry, as for the presets. A setting given as None is not given, except
    ``filter_groups_metric=None`` (no filter) and ``max_off_policy_threshold=None`` (no
    bound)."""
    from pipeline import ReplayBuffer
    lake = Path(lake)
    preset, kwargs = chosen_settings(lake, settings)
    tables = read_metadata(lake)
    calls = _calls(tables["decisions"])
    if max_calls is not None:
        if max_calls < 1:
            raise ConfigError(f"max_calls={max_calls}: give a number of sample calls >= 1")
        calls = calls[:max_calls]
        dec = tables["decisions"]
        last = pc.equal(dec["call_id"], calls[-1]["call_id"]) if calls else None
        # the record up to the end of the window's last call: every policy gets the rollouts
        # the recorded run had generated by then, and none from later
        window_end = pc.max(dec.filter(last)["seq"]).as_py() + 1 if calls else 0
    out = Path(out_lake) if out_lake is not None else Path(tempfile.mkdtemp(prefix="whatif-"))
    holder: dict[str, _Feed] = {}
    make = ReplayBuffer.async_ if preset == "async" else ReplayBuffer.sync
    # a run recorded without refill_fn is replayed without one (unless the settings need it): a
    # refill the record cannot serve would end the poll, and the next one sees later rows, which
    # changes the batch of any order that does not rank new groups last
    refill_fn = (lambda n: holder["feed"].refill(n)) if _refills(lake, kwargs) else None
    buf = make(lake=out / "lake", refill_fn=refill_fn, poll_interval=0.001, **kwargs)
    result = Outcome(lake=out / "lake")
    with buf, future_warnings_held():
        feed = holder["feed"] = _Feed(buf, tables)
        if max_calls is not None:
            feed.end = window_end
        del tables["trajectories"], tables["group_events"]   # the feed holds what it needs
        points = sorted(s for c in calls for s in c["points"].values())
        for c in calls:
            # the recorded points after the feed's position (sorted: one bisection per call)
            ahead = points[bisect.bisect_right(points, feed_seq(feed)):]
            # the first poll's feed step is taken before the call, so that the call finds its
            # partition's groups registered as the recorded call did (a validation partition
            # otherwise looks unknown to the buffer's typo check when the call starts)
            first = [feed.advance(ahead.pop(0) if ahead else None)]
            idle, idle_drawn = [0], [len(feed.drawn)]

            def before_poll(ahead: list[int] = ahead, idle: list[int] = idle,
                            idle_drawn: list[int] = idle_drawn, first: list = first) -> None:
                # the replay is synchronous: a poll with nothing new to feed (and no refill
                # drawn since the last one) sees exactly the state the last poll saw
                drawn = len(feed.drawn)
                if first:
                    fed = first.pop()
                else:
                    fed = feed.advance(ahead.pop(0) if ahead else None)
                if not fed and not ahead:
                    fed = feed.advance(None)
                idle[0] = 0 if fed or drawn != idle_drawn[0] else idle[0] + 1
                idle_drawn[0] = len(feed.drawn)
                if idle[0] >= IDLE_POLLS:
                    raise _Unfillable
            try:
                b = buf.sample(c["step"], c["partition"], len(c["uids"]),
                               timeout=SAMPLE_TIMEOUT_S, before_poll=before_poll)
            except (ReplayLakeError, _Unfillable):
                result.unfilled.append(c["step"])
                result.batches.append([])
                continue
            feed.batch_of[(c["partition"], _recorded_batch_id(tables, c))] = b.batch_id
            result.batches.append(list(dict.fromkeys(b.table["uid"].to_pylist())))
            future = future_rows(b.table)
            if future:
                result.future_rows[c["step"]] = result.future_rows.get(c["step"], 0) + future
        if max_calls is None:          # the rest of the record: what was left at the end
            feed.advance(None)
        result.refill_shortfall = getattr(feed, "shortfall", 0)
    # the batches as the replay's own decision log orders them (as `recorded` reads a lake)
    result.batches = recorded(result.lake).batches
    return result


def _refills(lake: Path, settings: dict[str, Any]) -> bool:
    """Whether the replay needs a refill_fn: the recorded run had one (a lake that does not
    record it is assumed to), or the settings filter groups, which needs one."""
    from pipeline.lake import config as lake_config
    cfg = lake_config.current(lake) or {}
    return cfg.get("refill_fn", "unrecorded") is not None or \
        settings.get("filter_groups_metric") is not None


def feed_seq(feed: _Feed) -> int:
    """The seq of the next row the feed has not applied (-1 before the first)."""
    return int(feed.seq[feed.pos]) - 1 if feed.pos < len(feed.seq) else 2**62


def _recorded_batch_id(tables: dict[str, pa.Table], call: dict) -> int:
    dec = tables["decisions"]
    sel = dec.filter(pc.and_(pc.equal(dec["call_id"], call["call_id"]),
                             pc.equal(dec["kind"], "select")))
    return sel["batch_id"][0].as_py()


def recorded(lake: str | os.PathLike) -> Outcome:
    """What the recorded run handed out, in the same shape as a replay's outcome."""
    from pipeline.analysis.views import read_lake
    calls = _calls(read_lake(Path(lake), tables=("decisions",))["decisions"])
    return Outcome(batches=[c["uids"] for c in calls], lake=Path(lake))
