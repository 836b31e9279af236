"""Failure groups: async evicts them all; sync keeps them (opt-in: evict those with no trajectory)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from pipeline.candidates import FAILURE, Columns
from pipeline.policies.context import PollContext


@dataclass(frozen=True)
class FailurePolicy:
    """``evict``: `all` (async), `empty` (sync with sync_refill_failed_groups) or `none` (sync).

    A finished group with no trajectory is already a FAILURE row in the candidate table."""

    evict: Literal["all", "empty", "none"] = "none"
    reason = "failure"

    def active(self, ctx: PollContext) -> bool:
        return self.evict != "none" and not ctx.validation

    def mask(self, c: Columns, ctx: PollContext) -> np.ndarray:
        failed = c.status == FAILURE
        return failed if self.evict == "all" else failed & (c.n_traj == 0)

    def horizon(self, ctx: PollContext) -> None:
        return None  # judged once, when the group turns terminal
