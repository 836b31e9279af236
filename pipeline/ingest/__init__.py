"""Ingest: conform producer input to the declared schemas and check it against the live groups."""
from __future__ import annotations

from pipeline._face import face

__getattr__, __dir__, __all__ = face(__name__, {
    'PutResult': 'retries',
    'STEP_LIMIT': 'conform',
    'STEP_RULE': 'conform',
    'check_partition': 'conform',
    'metric_values': 'conform',
    'one_array': 'conform',
    'validate_groups': 'conform',
    'validate_status': 'conform',
    'validate_trajectories': 'conform',
})
