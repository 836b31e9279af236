"""Staleness: evict finished groups older than the threshold (`drop`) or hold sampling (`wait`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from pipeline.candidates import FINISHED, Columns
from pipeline.policies.context import PollContext


@dataclass(frozen=True)
class StalePolicy:
    """`drop(T)` evicts finished groups with span `g - global_steps + 1 > T` (span T is kept);
    `wait(T)` never evicts but keeps `sample` from returning while an in-flight group has span
    `>= T` (`>=`, as verl: a group at span T would be over the bound by the time it trains).
    ``strategy=None`` (the sync preset) ignores staleness entirely."""

    threshold: int | None = None
    strategy: Literal["drop", "wait"] | None = None
    reason = "stale"

    def active(self, ctx: PollContext) -> bool:
        return self.strategy == "drop" and self.threshold is not None and not ctx.validation

    def mask(self, c: Columns, ctx: PollContext) -> np.ndarray:
        return (c.status == FINISHED) & (ctx.step - c.gs + 1 > self.threshold)

    def horizon(self, ctx: PollContext) -> int | None:
        """Time makes this rule fire on groups kept earlier: only those with gs below this."""
        return ctx.step - self.threshold + 1

    def gate_open(self, ctx: PollContext, oldest_inflight_gs: int | None) -> bool:
        """False while an in-flight group has span >= T (applies to validation too, as verl)."""
        if self.strategy != "wait" or self.threshold is None or oldest_inflight_gs is None:
            return True
        return ctx.step - oldest_inflight_gs + 1 < self.threshold

    def bound(self) -> int | None:
        """The span no selected group may exceed (the `drop` invariant), or None."""
        return self.threshold if self.strategy == "drop" else None
