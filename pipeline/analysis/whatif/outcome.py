"""What a what-if replay reports back: its outcome, and rows trained "from the future".

A replay keeps each rollout's recorded weight version. When its settings evict more than the
recorded run did, it reaches rollouts the recorded run generated later, with newer weights, and a
sample call can train rows whose newest version is not older than its step. The live buffer warns
about such rows on every call (a rollout side that tags versions wrongly); in a replay they are
expected, so the replay holds those warnings on its own thread, counts the rows per step, and its
caller prints one summary line.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.decide import FUTURE_VERSIONS


@dataclass
class Outcome:
    """What one run (recorded or replayed) handed out and evicted."""

    batches: list[list[str]] = field(default_factory=list)      # uids per sample call, in order
    unfilled: list[int] = field(default_factory=list)           # steps whose batch never filled
    no_batch: list[int] = field(default_factory=list)    # steps of calls that handed out none
    refill_shortfall: int = 0
    refill_undrawn: int = 0      # recorded refill groups the replay never asked for
    refill_late: int = 0         # recorded refill groups registered after the next decision
    refill_later: int = 0        # ... it asked for at a later step than the recorded run did
    refill_earlier: int = 0      # ... at an earlier step
    waited: list[int] = field(default_factory=list)   # steps of calls that polled past the record
    lake: Path | None = None
    future_rows: dict[int, int] = field(default_factory=dict)   # step -> rows newer than it
    settings_changed: str | None = None   # the record's settings changed at a reopen (note)


def future_rows(table: pa.Table) -> int:
    """Trained rows of a batch whose newest weight version is not older than its step (the
    rows the live buffer warns about)."""
    future = pc.and_(pc.invert(table["is_padding"]), pc.less(table["staleness"], 0))
    return pc.sum(future.cast(pa.int64())).as_py() or 0


class _HoldFutureWarnings(logging.Filter):
    """Drops the buffer's per-call "weight version from the future" warnings raised on one
    thread (the replay's): there they are an artefact of replaying recorded versions, counted
    in `Outcome.future_rows` instead."""

    def __init__(self, thread: int):
        super().__init__()
        self.thread = thread

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.thread == self.thread
                    and getattr(record, "replaylake_event", None) == FUTURE_VERSIONS)


@contextmanager
def future_warnings_held() -> Iterator[None]:
    log = logging.getLogger("replaylake")
    hold = _HoldFutureWarnings(threading.get_ident())
    log.addFilter(hold)
    try:
        yield
    finally:
        log.removeFilter(hold)


def step_ranges(steps: list[int]) -> str:
    """Steps as runs of consecutive ones (``1-150``, ``3, 7-9``); 'none' for no step."""
    runs: list[list[int]] = []
    for step in sorted(set(steps)):
        if runs and step == runs[-1][1] + 1:
            runs[-1][1] = step
        else:
            runs.append([step, step])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs) or "none"


def unfilled_summary(outcome: Outcome, calls: int) -> str | None:
    """One sentence on the sample calls whose batch never filled, None when every one did."""
    if not outcome.unfilled:
        return None
    n = len(outcome.unfilled)
    return (f"unfilled: {n} of {calls} sample calls (step{'s' if n > 1 else ''} "
            f"{step_ranges(outcome.unfilled)}) handed out no batch: with these settings the "
            "recorded rollouts could not fill those batches (a live run would have generated "
            "more), so the replay has fewer batches than the recorded run")


def future_summary(outcome: Outcome, calls: int) -> str | None:
    """One sentence on the steps that trained rows from the future, None when none did."""
    steps = sorted(outcome.future_rows)
    if not steps:
        return None
    rows = sum(outcome.future_rows.values())
    return (f"weight versions from the future: {len(steps)} of {calls} sample calls (step"
            f"{'s' if len(steps) > 1 else ''} {step_ranges(steps)}) trained {rows:,} row(s) "
            "whose newest weight version is not older than the step. The replay keeps each "
            "rollout's recorded version; with these settings it reached rollouts the recorded "
            "run generated later with newer weights, so their staleness reads lower (below "
            "zero) than a real run would have had. The staleness cells marked '>=' count those "
            "rows at staleness 0, the least a live run could have trained them at")


def waited_summary(outcome: Outcome, calls: int) -> str | None:
    """One sentence on the sample calls that filled only after more polls than the recorded
    call had, None when none did."""
    if not outcome.waited:
        return None
    n = len(outcome.waited)
    return (f"waited: {n} of {calls} sample calls (step{'s' if n > 1 else ''} "
            f"{step_ranges(outcome.waited)}) needed more polls than the recorded call had: "
            "they waited for later recorded rollouts until they filled. The record keeps no "
            "timeout, so a live trainer whose sample times out and moves on would train fewer "
            "batches and evict those groups at later steps")


def refill_timing_summary(outcome: Outcome) -> str | None:
    """One sentence on the refill groups the replay asked for at another step than the
    recorded run did, None when it asked for each at the recorded step."""
    later, earlier = outcome.refill_later, outcome.refill_earlier
    if not later and not earlier:
        return None
    when = " and ".join(x for x in (f"{later:,} at a later step" if later else "",
                                    f"{earlier:,} at an earlier step" if earlier else "") if x)
    return (f"refill timing: the replay asked for recorded refill groups at other steps than "
            f"the recorded run did ({when}). Each "
            "keeps the dispatch step and weight versions its recorded refill gave it, so it "
            "reads older (asked later) or newer (asked earlier) than a live run's refill at "
            "that step would, and goes stale sooner (or later) than it would live")


def no_batch_summary(outcome: Outcome) -> str | None:
    """One sentence on the recorded calls that handed out no batch, None when there were none."""
    if not outcome.no_batch:
        return None
    n = len(outcome.no_batch)
    return (f"calls without a batch: {n} recorded call(s) (step{'s' if n > 1 else ''} "
            f"{step_ranges(outcome.no_batch)}) handed out no batch (a sample that timed out, "
            "was interrupted or whose refill_fn raised, or a wait_for_sampleable); the replay "
            "repeats their polls, evictions and refills up to their last recorded poll and "
            "hands out no batch for them either, at the batch size of the partition's nearest "
            "call that handed one out (the record keeps no other); with these settings a live "
            "call might have filled")
