"""DAPO dynamic sampling: evict finished groups whose metric values are all exactly equal."""
from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from pipeline.candidates import FINISHED, ZV_YES
from pipeline.policies.context import PollContext


@dataclass(frozen=True)
class ZeroVarianceFilter:
    """``metric`` is `reward` (each trajectory's reward sum) or a named reward metric; None = off.

    Exact equality, not `np.std(values) == 0` (which misses 0.1 x3 and filters distinct tiny
    values). A group is classified once when it finishes (candidates.py); this only reads the flag.
    """

    metric: str | None = None
    reason = "zero_variance"

    def flag(self, ctx: PollContext) -> pl.Expr | None:
        if self.metric is None or ctx.validation:
            return None
        return (pl.col("status") == FINISHED) & (pl.col("zv") == ZV_YES)
