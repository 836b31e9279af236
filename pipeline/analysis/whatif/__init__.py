"""What-if replays of a recorded lake with other settings, and what they report."""
from __future__ import annotations

from pipeline._face import face

__getattr__, __dir__, __all__ = face(__name__, {
    'approximations': 'headline',
    'figures': 'headline',
    'table': 'headline',
    'future_summary': 'outcome',
    'recorded': 'rerun',
    'recorded_settings': 'rerun',
    'replay': 'rerun',
})
