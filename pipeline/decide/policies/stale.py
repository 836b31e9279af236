"""Staleness settings: the bound a selected group must respect, and the `wait` gate."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class StalePolicy:
    """`drop(T)` evicts finished groups with group span `g - global_steps + 1 > T` (the rule
    `sql/rules/stale.sql`; span T is kept); `wait(T)` never evicts but keeps `sample` from
    returning while an in-flight group has span `>= T` (`>=`, as verl: a group at span T would be
    over the bound by the time it trains). ``strategy=None`` (the sync preset) ignores staleness."""

    threshold: int | None = None
    strategy: Literal["drop", "wait"] | None = None

    def gate_active(self) -> bool:
        return self.strategy == "wait" and self.threshold is not None

    def gate_open(self, step: int, oldest_inflight_gs: int | None) -> bool:
        """False while an in-flight group has span >= T (applies to validation too, as verl)."""
        if oldest_inflight_gs is None:
            return True
        return step - oldest_inflight_gs + 1 < self.threshold

    def bound(self) -> int | None:
        """The span no selected group may exceed (the `drop` invariant), or None."""
        return self.threshold if self.strategy == "drop" else None
