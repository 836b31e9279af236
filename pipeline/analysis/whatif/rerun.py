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

Memory: the feed streams the recorded metadata one seq window at a time (`record.Record`: no
token payload, no table held whole; each put gets a stand-in payload of the recorded lengths,
`record.stand_in`), keeps a window's rows to feed as three arrays in seq order and each group as
an integer (`feed.Feed`), and puts every run of consecutive trajectory rows in one call (not
row by row: each call costs the buffer, its journal and the replay's lake a record batch). The
replay buffer holds only what its own decisions keep: each replayed batch is released where the
recorded run released its batch. The replay's lake writes its batches compressed (the stand-in
zeros take no room). The recorded batches of the replay are read back from its decision log
alone, not its payload.
"""
from __future__ import annotations

import bisect
import os
import tempfile
from pathlib import Path
from typing import Any

from pipeline.analysis.whatif.feed import Feed
from pipeline.analysis.whatif.outcome import Outcome, future_rows, future_warnings_held
from pipeline.analysis.whatif.record import Record
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


def recorded_settings(lake: Path) -> dict[str, Any]:
    """The sample settings recorded in the lake's configuration (`async`/`sync` keywords, the
    opt-in rules as ``rules``; a lake from before the mapping records its rules the same way)."""
    from pipeline.config import opt_in_rules
    from pipeline.lake import config as lake_config
    from pipeline.lake import require_lake
    cfg = lake_config.current(require_lake(lake))
    if cfg is None:
        raise LakeError(f"{lake} records no configuration ({lake_config.FILE}): a what-if replays "
                        "the run under the settings it was made with, changing only those you "
                        "give, so it needs that file; restore it from a backup (a copy or sync "
                        "tool that skips names starting with `_` leaves it out)")
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
    holder: dict[str, Feed] = {}
    make = ReplayBuffer.async_ if preset == "async" else ReplayBuffer.sync
    # a run recorded without refill_fn is replayed without one (unless the settings need it): a
    # refill the record cannot serve would end the poll, and the next one sees later rows, which
    # changes the batch of any order that does not rank new groups last
    refill_fn = (lambda n: holder["feed"].refill(n)) if _refills(lake, kwargs) else None
    result = Outcome(lake=out / "lake")
    with Record(lake) as record:
        record.check()
        calls, released = record.calls()
        if max_calls is not None:
            calls = calls[:max_calls]
        buf = make(lake=out / "lake", refill_fn=refill_fn, poll_interval=0.001, **kwargs)
        # the stand-in payload is zeros: compressed, the replay's lake takes the room of its
        # metadata, not of the recorded run's tokens (a 50 GB record's would be as large)
        buf.lake.compression = "zstd"
        with buf, future_warnings_held():
            feed = holder["feed"] = Feed(buf, record, calls, released)
            if max_calls is not None:
                # the record up to the end of the window's last call: every policy gets the
                # rollouts the recorded run had generated by then, and none from later
                feed.end = calls[-1].last_seq + 1 if calls else 0
            _replay_calls(buf, feed, calls, result)
            if max_calls is None:          # the rest of the record: what was left at the end
                feed.advance(None)
            result.refill_shortfall = feed.shortfall
            result.refill_undrawn = len(feed.pool)
    # the batches as the replay's own decision log orders them (as `recorded` reads a lake)
    result.batches = recorded(result.lake).batches
    return result


def _replay_calls(buf: Any, feed: Feed, calls: list, result: Outcome) -> None:
    """Each recorded sample call repeated at its step with its batch size, the feed advanced
    to the next recorded decision point before each poll."""
    import pyarrow as pa
    pool = pa.default_memory_pool()
    points = sorted(s for c in calls for s in c.points.values())
    for c in calls:
        # the recorded points after the feed's position (sorted: one bisection per call)
        ahead = points[bisect.bisect_right(points, feed.next_seq()):]
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
            b = buf.sample(c.step, c.partition, len(c.selected),
                           timeout=SAMPLE_TIMEOUT_S, before_poll=before_poll)
        except MissingMetricError as exc:     # the settings, not the replay: say so at once
            raise ConfigError(
                f"what-if at step {c.step}: {exc.args[0].split('; add it to')[0]}; a what-if "
                "filters by the scalar reward or by a reward_info metric the recorded run "
                "reported: choose one of those") from exc
        except (SampleTimeout, EmptyBatchError, RefillLimitError, _Unfillable):
            result.unfilled.append(c.step)
            result.batches.append([])
            continue
        feed.batch_of[(c.partition, c.batch_id)] = b.batch_id
        result.batches.append(list(dict.fromkeys(b.table["uid"].to_pylist())))
        future = future_rows(b.table)
        if future:
            result.future_rows[c.step] = result.future_rows.get(c.step, 0) + future
        # a batch holds its stand-in payload (the buffer copies it out of the groups' chunks):
        # dropped here, not while the next call builds its own, and its memory handed back
        del b
        pool.release_unused()


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
    return Outcome(batches=[c.uids for c in calls], lake=Path(lake))
