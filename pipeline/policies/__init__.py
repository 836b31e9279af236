"""Policies as values: staleness settings (bound and `wait` gate) and refill.

The eviction rules themselves are declarations in sql/rules/ (pipeline/rules.py); presets
(pipeline/config.py) switch rules on and pick a refill policy, reproducing verl's `sync` and
`async` buffers as values rather than a mode switch.
"""
from __future__ import annotations

from pipeline.policies.context import CallState, PollContext, PollOutcome
from pipeline.policies.refill import DapoCredit, NoRefill, RefillFailedWhileShort, ReplaceEvicted
from pipeline.policies.stale import StalePolicy

__all__ = [
    "CallState", "DapoCredit", "NoRefill", "PollContext", "PollOutcome", "RefillFailedWhileShort",
    "ReplaceEvicted", "StalePolicy",
]
