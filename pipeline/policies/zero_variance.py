"""DAPO dynamic sampling: evict finished groups whose metric values are all exactly equal."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.candidates import FINISHED, ZV_YES, Columns
from pipeline.policies.context import PollContext


@dataclass(frozen=True)
class ZeroVarianceFilter:
    """``metric`` is `reward` (each trajectory's reward sum) or a named reward metric; None = off.

    Exact equality, not `np.std(values) == 0` (which misses 0.1 x3 and filters distinct tiny
    values). A group is classified once when it finishes (candidates.py); this only reads the flag.
    """

    metric: str | None = None
    reason = "zero_variance"

    def active(self, ctx: PollContext) -> bool:
        return self.metric is not None and not ctx.validation

    def mask(self, c: Columns, ctx: PollContext) -> np.ndarray:
        return (c.status == FINISHED) & (c.zv == ZV_YES)

    def horizon(self, ctx: PollContext) -> None:
        return None  # depends on the group's own, immutable data: judged once, when fresh
