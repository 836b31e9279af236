"""Weights & Biases: step metrics and the DAPO table for a run, and reading an offline run back."""
from __future__ import annotations

from pipeline._face import face

__getattr__, __dir__, __all__ = face(__name__, {
    'WandbTracker': 'tracker',
    'TABLE_KEY': 'tracker',
    'format_reward_counts': 'tracker',
    'read_run': 'offline',
    'WandbRunFormatError': 'offline',
})
