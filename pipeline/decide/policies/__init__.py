"""Policies as values: staleness settings (the `wait` gate), admission, refill and the selection
order."""
from __future__ import annotations

from pipeline._face import face

__getattr__, __dir__, __all__ = face(__name__, {
    'Admit': 'admission',
    'Unpaced': 'admission',
    'capacity': 'admission',
    'CallState': 'context',
    'PollContext': 'context',
    'PollOutcome': 'context',
    'DapoCredit': 'refill',
    'NoRefill': 'refill',
    'OLD_NAMES': 'refill',
    'POLICIES': 'refill',
    'RefillFailedWhileShort': 'refill',
    'RefillPolicy': 'refill',
    'ReplaceEvicted': 'refill',
    'policy_name': 'refill',
    'ORDERS': 'order',
    'SelectionOrder': 'order',
    'selection_order': 'order',
    'Starvation': 'starvation',
    'StaleMask': 'stale',
    'StalePolicy': 'stale',
    'WaitGate': 'stale',
})
