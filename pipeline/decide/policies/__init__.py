"""Policies as values: staleness settings (bound and `wait` gate) and refill."""
from __future__ import annotations

from pipeline._face import face

__getattr__, __dir__, __all__ = face(__name__, {
    'CallState': 'context',
    'PollContext': 'context',
    'PollOutcome': 'context',
    'DapoCredit': 'refill',
    'NoRefill': 'refill',
    'RefillFailedWhileShort': 'refill',
    'ReplaceEvicted': 'refill',
    'StalePolicy': 'stale',
})
