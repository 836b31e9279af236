"""Staleness settings, split into the values a poll uses: the `stale` rule, the wait gate and the
stale mark.

`drop(T)` is the rule `sql/rules/stale.sql` (the presets switch it on with its threshold); `mask(T)`
is a `StaleMask`, the same rule's predicate applied to the chosen groups as a mark instead of an
eviction (a marked group is trained with its loss switched off, nothing is re-generated); `wait(T)`
is a `WaitGate`, whose comparison is the predicate of `sql/policies/wait_gate_blockers.sql`,
compiled for numpy like a rule (its answer remembered per step and dispatch step): the lake's
engine lists the groups that block, the live buffer asks whether the oldest in-flight group does,
and both read the one text. The strategy string is read here, once, when the settings are made;
the poll loop only sees a gate or None, and the selection a mask or None.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from pipeline.config.stale_bounds import StaleBounds
from pipeline.decide import rules, vectors

GATE = "wait_gate_blockers"
# every valid max_off_policy_strategy (in the order an error message lists them), each named once
STRATEGIES = DROP, WAIT, ADMIT, MASK = ("drop", "wait", "admit", "mask")
MASKED = "stale"   # the rule whose predicate marks a group (and the reason its `select` row records)


@lru_cache(maxsize=4096)
def blocks(step: int, global_steps: int, threshold: int) -> bool:
    """Whether an in-flight group dispatched at ``global_steps`` blocks a sample at ``step``:
    the declared blocking predicate over that one group (NULL does not block).

    Cached: a waiting call asks the same question at every poll."""
    frame = vectors.bind({"global_steps": vectors.scalar(global_steps)},
                         {"step": step, "threshold": threshold})
    return bool(vectors.true(vectors.compiled_predicate(GATE).fn(frame)))


@dataclass(frozen=True)
class WaitGate:
    """`sample` may not return while an in-flight (pending or running) group has group span
    ``>= threshold`` (as verl: a group at span T would be over the bound by the time it trains).
    Applies to validation partitions too, as in verl."""

    threshold: int

    def open(self, step: int, oldest_inflight_gs: int | None) -> bool:
        """Whether no in-flight group blocks: the oldest one has the largest span, so it is
        the one asked (the parity test holds this against the declaration's whole list)."""
        if oldest_inflight_gs is None:
            return True
        return not blocks(step, oldest_inflight_gs, self.threshold)


@lru_cache(maxsize=4096)
def marked(step: int, global_steps: int, status: str, threshold: int) -> bool:
    """Whether the `stale` rule would evict this group at ``step``: what `mask` marks instead.
    Cached like `blocks` (a batch asks for a handful of dispatch steps). `mask` takes one bound
    (a per-dataset mapping is refused with it), so the group's own `bound` from the rule's
    `stale_bounds` lookup is null and the threshold decides."""
    frame = {"global_steps": vectors.scalar(global_steps), "status": vectors.scalar(status),
             "bound": vectors.scalar(None)}
    vectors.bind(frame, {"step": step, "threshold": threshold, "tightest": threshold})
    return bool(vectors.true(rules.get(MASKED).expr.fn(frame)))


@dataclass(frozen=True)
class StaleMask:
    """`mask(T)`: a chosen group the `stale` rule would evict (group span > T, finished) stays in
    the batch, marked: its rows carry ``is_stale``, `to_torch`'s ``loss_mask`` zeroes them, and its
    `select` row records reason ``stale``. Not applied on validation partitions (no rule is)."""

    threshold: int

    def stale(self, step: int, groups: dict[str, tuple[int, str]]) -> set[str]:
        """The uids of ``groups`` (uid -> (dispatch step, terminal status)) marked stale."""
        return {u for u, (gs, status) in groups.items()
                if marked(step, gs, status, self.threshold)}


@dataclass(frozen=True)
class StalePolicy:
    """The user's staleness settings as given (threshold, strategy), recorded with the lake.
    ``strategy=None`` (the sync preset) ignores staleness."""

    threshold: int | None = None
    strategy: Literal["drop", "wait", "admit", "mask"] | None = None
    by_dataset: tuple[tuple[str, int], ...] = ()   # per-dataset bounds; `threshold` the rest's

    def bounds(self) -> StaleBounds:
        """Every group's bound (the default and the per-dataset ones)."""
        return StaleBounds(self.threshold, self.by_dataset)

    def given(self) -> int | dict[str, int] | None:
        """The threshold as the user gave it (an int, None, or a per-dataset mapping)."""
        return self.bounds().given()

    def gate(self) -> WaitGate | None:
        """The wait gate these settings ask for (``wait`` with a threshold), or None."""
        if self.strategy == WAIT and self.threshold is not None:
            return WaitGate(self.threshold)
        return None

    def mask(self) -> StaleMask | None:
        """The stale mark these settings ask for (``mask`` with a threshold), or None."""
        if self.strategy == MASK and self.threshold is not None:
            return StaleMask(self.threshold)
        return None

    def bound(self) -> int | None:
        """The span no selected group may exceed (the `drop` rule's threshold), or None.
        `admit` keeps the rule on as a safety net: admission paces dispatches so that it
        should never fire, and a group that finished late still cannot be trained stale."""
        return self.threshold if self.strategy in (DROP, ADMIT) else None
