"""vLLM outputs as trajectory rows, and resumption of aborted partial rollouts."""
from __future__ import annotations

from pipeline._face import face

__getattr__, __dir__, __all__ = face(__name__, {
    'VllmOutputError': 'outputs',
    'completion_row': 'outputs',
    'request_rows': 'outputs',
    'versions_row': 'outputs',
    'GenerationFailed': 'resume',
    'RetryPolicy': 'resume',
    'generate_resumable': 'resume',
    'rollout_group': 'resume',
})
