"""The buffer's state: one owner (BufferState), its journal, partitions, payload, candidate index, restore."""
from __future__ import annotations

from pipeline._face import face

__getattr__, __dir__, __all__ = face(__name__, {
    'BufferState': 'buffer_state',
    'Listener': 'buffer_state',
    'RefillAsk': 'buffer_state',
    'KINDS': 'decisions',
    'decision_rows': 'decisions',
    'Columns': 'journal',
    'Journal': 'journal',
    'by_column': 'journal',
    'GroupView': 'partition',
    'PartitionState': 'partition',
    'Unreported': 'partition',
    'view': 'partition',
    'restore': 'rebuild',
})
