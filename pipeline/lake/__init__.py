"""The durable lake: append-only Arrow IPC segments, checksums, one writer, readers, compaction, retention."""
from __future__ import annotations

from pipeline._face import face

__getattr__, __dir__, __all__ = face(__name__, {
    'LakeWriter': 'writer',
    'read_table': 'writer',
    'read_segment': 'writer',
    'committed_calls': 'writer',
    'highest_seq': 'writer',
    'segment_files': 'files',
    'CALL_KEY': 'files',
    'mkdir_durably': 'files',
    'replace_durably': 'files',
    'is_lake': 'identity',
    'require_lake': 'identity',
    'require_new_or_lake': 'identity',
    'check': 'damage',
    'describe': 'damage',
    'salvage': 'recovery',
    'compact': 'compaction',
    'retain': 'retention',
    'dropped_payload': 'retention',
    'LakeScan': 'scan',
    'scan_lake': 'scan',
    'cut_seq': 'scan',
    'current_files': 'read',
    'read_log': 'read',
    'burnt_ranges': 'read',
    'seq_ranges': 'read',
    'read_newest': 'names',
    'verified_batches': 'verify:batches',
}, modules=('kill', 'config', 'orphans'))
