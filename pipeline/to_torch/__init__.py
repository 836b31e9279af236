"""Batch table -> torch tensors for the trainer (padded or packed), straight from the Arrow buffers."""
from __future__ import annotations

from pipeline._face import face

__getattr__, __dir__, __all__ = face(__name__, {
    'batch_to_torch': 'convert',
    'BatchFormatError': 'convert',
    'TensorPool': 'pool',
    'HAVE_EXTENSION': 'runs',
    'compiled': 'runs',
})
