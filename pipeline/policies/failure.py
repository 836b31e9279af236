"""Failure groups: async evicts them all; sync keeps them (opt-in: evict those with no trajectory)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import polars as pl

from pipeline.candidates import FAILURE
from pipeline.policies.context import PollContext


@dataclass(frozen=True)
class FailurePolicy:
    """``evict``: `all` (async), `empty` (sync with sync_refill_failed_groups) or `none` (sync).

    A finished group with no trajectory is already a FAILURE row in the candidate table."""

    evict: Literal["all", "empty", "none"] = "none"
    reason = "failure"

    def flag(self, ctx: PollContext) -> pl.Expr | None:
        if self.evict == "none" or ctx.validation:
            return None
        failed = pl.col("status") == FAILURE
        return failed if self.evict == "all" else failed & (pl.col("n_traj") == 0)
