"""Policies as values: evictors (stale, zero-variance, failure), the wait gate, refill and surplus.

Each evictor is a small frozen dataclass that turns the poll context into a polars expression
over the candidate table (pipeline/candidates.py); the buffer fuses every active evictor into one
query per poll. Presets (pipeline/config.py) combine them into verl's `sync` and `async` buffers.
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
