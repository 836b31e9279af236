"""What-if replays of a recorded lake with other settings, and what they report."""
from __future__ import annotations

from pipeline._face import face

__getattr__, __dir__, __all__ = face(__name__, {
    'approximations': 'headline',
    'compare_policies': 'compare:compare',
    'compare_lines': 'board:lines',
    'compare_brief': 'board:brief',
    'parse_policies': 'compare',
    'write_compare': 'board:write',
    'write_page': 'page',
    'figures': 'headline',
    'table': 'headline',
    'future_summary': 'outcome',
    'step_ranges': 'outcome',
    'recorded': 'rerun',
    'recorded_settings': 'rerun',
    'replay': 'rerun',
})
