"""The replay buffer as a named Ray actor, and the client producers and trainers use."""
from __future__ import annotations

from pipeline._face import face

__getattr__, __dir__, __all__ = face(__name__, {
    'RayReplayBuffer': 'client',
})
