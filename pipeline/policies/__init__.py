"""Policies as values: evictors (stale, zero-variance, failure), the wait gate, refill and surplus.

Each evictor is a small frozen dataclass with three parts: `active(ctx)`, a vectorised predicate
`mask(columns, ctx)` over the candidate columns (pipeline/candidates.py), and a `horizon(ctx)`
saying which already-kept groups time can make it fire on (None: judged once, when a group turns
terminal). sql/policies/ states the same rules in SQL for the lake; a parity test pins them.
Presets (pipeline/config.py) combine them into verl's `sync` and `async` buffers.
"""
from __future__ import annotations

from pipeline.policies.context import PollContext, PollOutcome
from pipeline.policies.failure import FailurePolicy
from pipeline.policies.refill import DapoCredit, NoRefill, RefillFailedWhileShort, ReplaceEvicted
from pipeline.policies.stale import StalePolicy
from pipeline.policies.zero_variance import ZeroVarianceFilter

__all__ = [
    "DapoCredit", "FailurePolicy", "NoRefill", "PollContext", "PollOutcome",
    "RefillFailedWhileShort", "ReplaceEvicted", "StalePolicy", "ZeroVarianceFilter",
]
