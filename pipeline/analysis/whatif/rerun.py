"""What-if replays: run a recorded lake's rollouts through a fresh ReplayBuffer with other
settings, so eviction and selection are decided by the very rules the live buffer runs.

How the replay follows the recorded run:

* Time is the lake's `seq`. Every row of `group_events` and `trajectories` is fed back through
  the public API (`register`, `update_status`, `put`) in seq order; a recorded `release` is
  replayed as `release` of the batch the replay handed out for that call (at once, where the
  replayed call polled past the recorded release).
* Each recorded sample call that handed out a batch (`call_id`, its step, partition and number
  of selected groups) becomes one `sample(step, partition, batch_size)`. Its polls follow the
  recorded call's own decision points (the first seq of each of its polls that decided
  something): before its k-th poll (`before_poll`) the feed advances to the recorded call's
  k-th point, so the poll sees exactly what the recorded poll saw. A call that needs more polls
  than the recorded one had waits as a slower trainer would: a poll right after a refill sees
  the refill's groups, and otherwise the feed moves on to the next recorded decision point (of
  any later call) that brings something new, then to the end of the record. When a call ends
  the feed advances to the recorded call's last point, so the next call starts from what its
  recorded counterpart started from, however many polls the replay took (`_Polls`).
* A recorded call that evicted or refilled and handed out no batch (a sample that timed out,
  was interrupted, was killed with its process or whose refill_fn raised; or a
  `wait_for_sampleable`) becomes one `wait_for_sampleable` over the same points: it evicts and
  refills as the recorded call did and takes no batch, and ends after its last recorded poll
  (at a poll whose recorded refill_fn raised, the replay's raises an exception of the same
  name). The record keeps no batch size for it: it takes that of its partition's next call
  that handed out a batch, else the last one before. A call that decided nothing wrote no row
  and is not replayed.
* Groups that a refill registered in the recorded run (the `count` registrations of the asking
  partition that follow each refill decision) form a pool per partition: the replay's
  `refill_fn(n)`, called by a poll of one replayed call, hands out the next `n` of that call's
  partition, and their events are fed from then on. A refill group the replay never asks for
  never appears; a refill the pool cannot serve is counted as `refill_shortfall`. A run recorded without a
  `refill_fn` is replayed without one (unless the settings filter groups, which needs one).

With the recorded settings this reproduces every recorded batch (tests/analysis/test_whatif.py checks it
on a scripted run and on a demo lake), which also shows the decision log holds every input the
decisions depend on. Not replayable: re-issues after a restart (`reissued` events; the public
API has no call for them) and refills issued by a `refill_fn` that registered groups other than
right after its refill decision while other producers registered in the same partition too (the
pool attribution assumes the `count` registrations of the partition that follow the decision
belong to it; `Outcome.refill_late` counts the groups registered only after the next recorded
decision, where that assumption is a guess).

What the replay cannot make real: rollouts keep the weight versions they were recorded with. When
other settings evict more, the feed reaches rollouts the recorded run generated later, with newer
weights, and a sample call can train rows whose newest version is not older than its step. The
live buffer warns about such rows on every call; the replay counts them per step instead
(`Outcome.future_rows`, see pipeline.analysis.whatif.outcome) and leaves the summary to its caller.
Refill groups likewise keep the dispatch step and versions of the recorded refill that made
them, whatever step the replay asks for them at (`Outcome.refill_later` / `refill_earlier`
count those asked for at another step).

Memory: the feed streams the recorded metadata one seq window at a time (`record.Record`: no
token payload, no table held whole; each put sends the recorded response lengths without
tokens, `record.stand_in`), keeps a window's rows to feed as three arrays in seq order and each group as
an integer (`feed.Feed`), and puts every run of consecutive trajectory rows in one call (not
row by row: each call costs the buffer, its journal and the replay's lake a record batch). The
replay buffer holds only what its own decisions keep: each replayed batch is released where the
recorded run released its batch. The replay's lake writes its batches compressed. Each replayed
batch is noted by its groups alone (`Batch.uids`, in the
order the decision log lists them), never its payload.
"""
from __future__ import annotations

import bisect
import itertools
import os
import tempfile
from pathlib import Path
from typing import Any

from pipeline.analysis.whatif.feed import Feed
from pipeline.analysis.whatif.outcome import Outcome, future_rows, future_warnings_held
from pipeline.analysis.whatif.record import Call, Record
from pipeline.errors import (
    ConfigError,
    EmptyBatchError,
    LakeError,
    MissingMetricError,
    RefillLimitError,
    SampleTimeout,
)

SAMPLE_TIMEOUT_S = 600.0   # a safety net only: an unfillable call ends when the feed runs dry
IDLE_POLLS = 3             # polls in a row with nothing left to feed: the batch cannot fill


class _Unfillable(Exception):
    """The recorded run has nothing more to feed and the replay's batch is still short."""


class _Ended(Exception):
    """A replayed call that handed out no batch in the record has had its recorded polls."""


class _RefillFailed(Exception):
    """The recorded refill_fn raised at this poll; the replay's raises as it did."""


# the refill knobs a configuration records in its `refill` block, given back as keywords
REFILL_KEYWORDS = ("train_batch_size", "gen_batch_size", "max_inflight_gen_batches",
                   "max_num_gen_batches")


def recorded_settings(lake: Path) -> dict[str, Any]:
    """The sample settings recorded in the lake's configuration (`async`/`sync` keywords, the
    opt-in rules as ``rules``; a lake from before the mapping records its rules the same way),
    with the refill knobs the run's refill policy recorded (`_refill_keywords`)."""
    from pipeline.lake import config as lake_config
    from pipeline.lake import require_lake
    cfg = lake_config.current(require_lake(lake))
    if cfg is None:
        raise LakeError(f"{lake} records no configuration ({lake_config.FILE}): a what-if replays "
                        "the run under the settings it was made with, changing only those you "
                        "give, so it needs that file; restore it from a backup (a copy or sync "
                        "tool that skips names starting with `_` leaves it out)")
    missing = [k for k in _KEYWORDS if k not in cfg]
    if missing:
        raise LakeError(f"{Path(lake) / lake_config.FILE} records no {', '.join(missing)}: the replay needs "
                        "the settings the run was made with; restore the file from a backup")
    return _settings_of(cfg)


_KEYWORDS = ("preset", "max_off_policy_threshold", "max_off_policy_strategy",
             "filter_groups_metric")


def _settings_of(cfg: dict[str, Any]) -> dict[str, Any]:
    """The replay's settings of one recorded configuration: the opt-in rules as a `rules=`
    mapping (the others follow from the keywords); a lake recorded before the selection order
    was a setting chose oldest first."""
    from pipeline.config import opt_in_rules
    return {**{k: cfg.get(k) for k in _KEYWORDS}, "rules": opt_in_rules(cfg.get("rules")),
            "selection_order": cfg.get("selection_order", "oldest"), **_refill_keywords(cfg)}


def settings_changed(lake: Path) -> str | None:
    """When the run was reopened under other settings (the lake recorded several
    configurations that a replay would run differently), one sentence saying so: a replay runs
    the whole record under one set of settings, the newest (plus those given)."""
    from pipeline.lake import config as lake_config
    rec = lake_config.read(lake)
    versions = rec["versions"] if rec else []
    changes = []
    for before, after in zip(versions, versions[1:]):
        a, b = _settings_of(before["config"]), _settings_of(after["config"])
        diff = [f"{k} {a.get(k)!r} -> {b.get(k)!r}" for k in dict.fromkeys([*a, *b])
                if a.get(k) != b.get(k)]
        if diff:
            changes.append(f"from seq {after.get('from_seq')}: {', '.join(diff)}")
    if not changes:
        return None
    return (f"settings: the run was reopened under other settings ({'; '.join(changes)}); a "
            "replay runs the whole record under one set, the newest (with any you give), so "
            "the calls made under the earlier settings need not come out as recorded")


def _refill_keywords(cfg: dict[str, Any]) -> dict[str, Any]:
    """The keywords behind the recorded refill policy: the batch sizes and limits it records
    (sync DAPO's credit counts with them; async's refill limit is `max_num_gen_batches`), and
    for the sync preset `sync_refill_failed_groups=True` when it evicted failures (only that
    switch does there, and it replaces them one prompt at a time: gen_batch_size 1)."""
    refill = cfg.get("refill") or {}
    out = {k: refill[k] for k in REFILL_KEYWORDS if refill.get(k) is not None}
    if cfg["preset"] == "sync" and "failure" in (cfg.get("rules") or {}):
        out["sync_refill_failed_groups"] = True
        out.setdefault("gen_batch_size", 1)
    return out


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
    if max_calls is not None and max_calls < 1:
        raise ConfigError(f"max_calls={max_calls}: give a number of sample calls >= 1")
    out = Path(out_lake) if out_lake is not None else Path(tempfile.mkdtemp(prefix="whatif-"))
    new_lake(out / "lake", lake)
    holder: dict[str, Any] = {}
    make = ReplayBuffer.async_ if preset == "async" else ReplayBuffer.sync
    # a run recorded without refill_fn is replayed without one (unless the settings need it): a
    # refill the record cannot serve would end the poll, and the next one sees later rows, which
    # changes the batch of any order that does not rank new groups last
    refill_fn = (lambda n: holder["polls"].refill(n)) if _refills(lake, kwargs) else None
    result = Outcome(lake=out / "lake", settings_changed=settings_changed(lake))
    with Record(lake) as record:
        record.check()
        calls, released = record.calls()
        if max_calls is not None:
            calls = _window(calls, max_calls)
        buf = make(lake=out / "lake", refill_fn=refill_fn, poll_interval=0.001, **kwargs)
        # no payload: compressed, the replay's lake takes a fraction of its metadata's room
        buf.lake.compression = "zstd"
        with buf, future_warnings_held():
            feed = Feed(buf, record, calls, released)
            if max_calls is not None:
                # the record up to the end of the window's last call: every policy gets the
                # rollouts the recorded run had generated by then, and none from later
                feed.end = calls[-1].last_seq + 1 if calls else 0
            _replay_calls(buf, feed, calls, result, holder)
            if max_calls is None:          # the rest of the record: what was left at the end
                feed.advance(None)
            result.refill_shortfall = feed.shortfall
            result.refill_undrawn, result.refill_late = feed.undrawn, feed.late
            result.refill_later, result.refill_earlier = feed.asked_later, feed.asked_earlier
    return result


def new_lake(path: Path, recorded: Path) -> None:
    """Refuse to write a replay's lake where a lake already is: a buffer opened there would
    append to it (a replay of the same settings into an earlier replay's lake fails half-way,
    and one whose directory holds the recorded lake would write into the record)."""
    if path.exists() and path.resolve() == recorded.resolve():
        raise ConfigError(f"the replay's lake would be {path}, which is the recorded lake: give "
                          f"--out a directory of its own (the replay writes its lake to "
                          f"OUT/lake)")
    if path.exists() and any(path.iterdir()):
        raise ConfigError(f"{path} already holds a lake (an earlier replay's, or another): give "
                          f"--out a new directory, or remove {path} first")


def _window(calls: list[Call], max_calls: int) -> list[Call]:
    """The recorded calls up to the ``max_calls``-th that handed out a batch."""
    seen = 0
    for i, c in enumerate(calls):
        seen += bool(c.selected)
        if seen == max_calls:
            return calls[:i + 1]
    return calls


def _replay_calls(buf: Any, feed: Feed, calls: list[Call], result: Outcome,
                  holder: dict[str, Any]) -> None:
    """Each recorded call repeated at its step, the feed stepped before each poll as `_Polls`
    says (``holder["polls"]``: the call's, whose `refill` is the replay's refill_fn), and
    advanced past everything the recorded call saw once it ends. ``result.batches`` gets the
    replay's batch of each recorded call that handed one out ([] where it never filled)."""
    import pyarrow as pa
    pool = pa.default_memory_pool()
    points = sorted(s for c in calls for s in c.points.values())
    sizes = _batch_sizes(calls)
    for i, c in enumerate(calls):
        polls = holder["polls"] = _Polls(feed, c, points)
        # the first poll's feed step is taken before the call, so that the call finds its
        # partition's groups registered as the recorded call did (a validation partition
        # otherwise looks unknown to the buffer's typo check when the call starts)
        polls.start()
        if c.selected:
            result.batches.append(_sample(buf, feed, c, polls, result))
            if polls.waited and result.batches[-1]:
                result.waited.append(c.step)
        else:
            _no_batch(buf, c, polls, sizes[i])
            result.no_batch.append(c.step)
        feed.advance(c.last_point)
        # a batch holds its rows (the buffer copies them out of the groups' chunks): dropped by
        # now, not while the next call builds its own, and its memory handed back
        pool.release_unused()


class _Polls:
    """How far the feed goes before each poll of one replayed call (`before_poll`).

    The k-th poll sees what the recorded call's k-th deciding poll saw: the feed advances to
    that poll's first seq (`Call.points`, in poll order). A replayed call that needs more polls
    than the recorded one had waits as a slower trainer would: a further poll right after a
    refill sees that refill's groups, any other advances the feed to the next recorded decision
    point of any call that brings it something new, and past the last one to the end of the
    record. A call that handed out no batch in the record ends after its recorded polls
    (`_Ended`), as the recorded call did.

    It also stands in the replay's refill_fn (`refill`): at a poll whose recorded refill_fn
    raised, the replay's raises too, and the recorded call's end follows."""

    def __init__(self, feed: Feed, call: Call, points: list[int]):
        self.feed, self.call, self.points = feed, call, points
        self.own = [(p, call.points[p]) for p in sorted(call.points)]
        self.poll: int | None = None     # the recorded poll the replay is at; None past them
        self.waited = False              # polled past the recorded call's polls
        self.first: bool | None = None   # the first poll's step, taken before the call
        self.idle, self.drawn = 0, len(feed.drawn)

    def start(self) -> None:
        self.first = self._step(drawn=False)

    def __call__(self) -> None:
        drawn = len(self.feed.drawn) != self.drawn    # a refill drawn since the last poll
        self.drawn = len(self.feed.drawn)
        fed = self._step(drawn) if self.first is None else self.first
        self.first = None
        # the replay is synchronous: a poll with nothing new to feed (and no refill drawn since
        # the last one) sees exactly the state the last poll saw
        self.idle = 0 if fed or drawn else self.idle + 1
        if self.idle >= IDLE_POLLS:
            raise _Unfillable

    def _step(self, drawn: bool) -> bool:
        """Feed what the next poll sees; whether it may see something new (a recorded poll
        always may: the replay's decisions before it differ). Past the recorded polls, a poll
        right after a refill sees the refill's groups before any later rollout, as a live one
        would."""
        if self.own:
            self.poll, seq = self.own.pop(0)
            self.feed.advance(seq)
            return True
        if not self.call.selected:
            raise _Ended
        self.poll = None
        if drawn:
            return True
        self.waited = True
        first = bisect.bisect_right(self.points, self.feed.reached)
        for seq in itertools.islice(self.points, first, None):
            if self.feed.advance(seq):
                return True
        return self.feed.advance(None)

    def refill(self, n: int) -> None:
        """The replay's refill_fn: the feed's refill of the call's partition (the buffer asks on
        behalf of the partition that polled), or the recorded refill_fn's failure."""
        if self.poll in self.call.failed:
            # named as the recorded exception, which the replay's lake records as it did
            raise type(self.call.failed[self.poll], (_RefillFailed,), {})(
                f"the recorded refill_fn raised at poll {self.poll} of the call at step "
                f"{self.call.step}")
        self.feed.refill(n, self.call.step, self.call.partition)


def _sample(buf: Any, feed: Feed, c: Call, polls: _Polls, result: Outcome) -> list[str]:
    """A recorded call that handed out a batch, repeated with its batch size: the groups of
    the replay's batch in the order they were selected (as the decision log lists them), none
    (its step counted unfilled) where it never filled."""
    try:
        b = buf.sample(c.step, c.partition, len(c.selected), timeout=SAMPLE_TIMEOUT_S,
                       before_poll=polls)
    except MissingMetricError as exc:     # the settings, not the replay: say so at once
        raise _metric_error(c, exc) from exc
    except (SampleTimeout, EmptyBatchError, RefillLimitError, _Unfillable, _RefillFailed):
        result.unfilled.append(c.step)
        return []
    feed.handed_out((c.partition, c.batch_id), b.batch_id)
    future = future_rows(b.table)
    if future:
        result.future_rows[c.step] = result.future_rows.get(c.step, 0) + future
    return list(b.uids)


def _no_batch(buf: Any, c: Call, polls: _Polls, size: int) -> None:
    """A recorded call that handed out no batch, repeated as `wait_for_sampleable` (evictions
    and refills as a sample's, no batch taken) up to its last recorded poll."""
    try:
        buf.wait_for_sampleable(c.step, c.partition, size, timeout=SAMPLE_TIMEOUT_S,
                                before_poll=polls)
    except MissingMetricError as exc:
        raise _metric_error(c, exc) from exc
    except (_Ended, _RefillFailed, SampleTimeout, EmptyBatchError, RefillLimitError):
        pass


def _metric_error(c: Call, exc: MissingMetricError) -> ConfigError:
    return ConfigError(
        f"what-if at step {c.step}: {exc.args[0].split('; add it to')[0]}; a what-if "
        "filters by the scalar reward or by a reward_info metric the recorded run "
        "reported: choose one of those")


def _batch_sizes(calls: list[Call]) -> list[int]:
    """The batch size each call is replayed with. The record keeps it only for a call that
    handed out a batch (its selected groups); one that handed out none takes that of its
    partition's next call that did (a retry, typically), else of the last one before, else 1."""
    before, after = _sizes_seen(calls), _sizes_seen(calls[::-1])[::-1]
    return [len(c.selected) or a or b or 1 for c, a, b in zip(calls, after, before)]


def _sizes_seen(calls: list[Call]) -> list[int]:
    """For each call, the batch size of the last call before it in ``calls`` that handed out a
    batch in its partition (0: none did)."""
    last: dict[str, int] = {}
    out = []
    for c in calls:
        out.append(last.get(c.partition, 0))
        if c.selected:
            last[c.partition] = len(c.selected)
    return out


def _refills(lake: Path, settings: dict[str, Any]) -> bool:
    """Whether the replay needs a refill_fn: the recorded run had one (a lake that does not
    record it is assumed to), or the settings filter groups, which needs one."""
    from pipeline.lake import config as lake_config
    cfg = lake_config.current(lake) or {}
    return cfg.get("refill_fn", "unrecorded") is not None or \
        settings.get("filter_groups_metric") is not None


def recorded(lake: str | os.PathLike) -> Outcome:
    """What the recorded run handed out, in the same shape as a replay's outcome."""
    with Record(Path(lake)) as record:
        calls, _ = record.calls()
    return Outcome(batches=[c.uids for c in calls if c.selected], lake=Path(lake),
                   no_batch=[c.step for c in calls if not c.selected])
