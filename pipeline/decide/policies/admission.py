"""Admission: how many groups may be dispatched now so that none can go stale before it trains.

The capacity is the declaration `sql/policies/dispatch_capacity.sql`; its `capacity` item is
compiled for numpy here (`pipeline.decide.vectors`) and evaluated over the live buffer's
counts (groups selected at steps >= the step, sampleable groups, in-flight groups); DuckDB runs
the whole file over the lake.
In replaylake's span terms: a group registered at step g and trained at step s has group span
s - g + 1, kept while <= T (the threshold), so it must be trained at one of the steps
g .. g + T - 1. Taken oldest dispatch first at B (`train_batch_size`) groups per step, those
steps hold T x B places; the groups already selected at steps >= g used some of them (step g's
batch, when the ask comes after that step's sample), and every buffered or in-flight group
(dispatched at g or before) is ahead of a new one. What is left is
``max(0, T x B - selected - sampleable - in_flight)`` (AReaL's rule, written with spans).

`Admit` is the value `max_off_policy_strategy="admit"` puts on a configuration: refills are
asked only up to the capacity and the rest stays owed, asked by a later poll (in practice at the
next step, when the places of a new step open). `Unpaced` (every other strategy) asks at once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from pipeline.decide import vectors
from pipeline.decide.policies.context import PollContext, PollOutcome
from pipeline.errors import RefillLimitError

DECLARATION = "dispatch_capacity"
_COUNTS = ("n_selected", "n_sampleable", "n_inflight")


def capacity(threshold: int, batch_size: int, selected: int, sampleable: int,
             inflight: int) -> int:
    """The declared capacity for these counts (see the module docstring), its formula compiled
    for numpy (one value: a polars evaluation would cost far more than the arithmetic it
    stands for)."""
    frame = {c: vectors.scalar(v) for c, v in zip(_COUNTS, (selected, sampleable, inflight))}
    vectors.bind(frame, {"threshold": threshold, "batch_size": batch_size})
    return int(vectors.compiled_items(DECLARATION, "final")["capacity"].fn(frame).item())


@dataclass(frozen=True)
class Unpaced:
    """Refills are asked as soon as they are owed (verl's behaviour: generate, evict, refill)."""

    name: ClassVar[str] = "unpaced"

    def room(self, ctx: PollContext, o: PollOutcome, part: Any) -> int | None:
        """No limit on what the next refill may ask."""
        return None


@dataclass(frozen=True)
class Admit:
    """Refills are asked only up to the dispatch capacity; the rest stays owed.

    ``room`` is asked when a poll owes refills, after its evictions (so an eviction frees a
    place before it is replaced), and before the step's batch is selected."""

    threshold: int
    train_batch_size: int
    name: ClassVar[str] = "admit"

    def room(self, ctx: PollContext, o: PollOutcome, part: Any) -> int:
        """How many prompts the poll's refill may ask for now. Raises when the cap leaves the
        call no way to fill its batch (nothing in flight, too few sampleable, no place left),
        instead of waiting until a timeout."""
        selected = part.selected_since(ctx.step)
        # prompts asked at this step whose groups are not registered yet are in flight already
        inflight = o.inflight + part.unregistered(ctx.step)
        cap = capacity(self.threshold, self.train_batch_size, selected, o.sampleable, inflight)
        if cap == 0 and inflight == 0 and o.sampleable < ctx.batch_size:
            raise RefillLimitError(
                f"max_off_policy_strategy='admit': sample(step={ctx.step}, {ctx.partition!r}) has "
                f"{o.sampleable}/{ctx.batch_size} groups sampleable and none in flight, and the "
                f"dispatch capacity is 0 ({selected} groups already selected at steps >= "
                f"{ctx.step}, threshold {self.threshold} x train_batch_size "
                f"{self.train_batch_size} places), so the refills it owes could only go stale. "
                "Sample at most train_batch_size groups per step, or raise "
                "max_off_policy_threshold")
        return cap
