"""Decisions: the SQL declarations compiled for numpy (and polars where a result is remembered),
eviction rules, the poll loop, selection, metrics."""
from __future__ import annotations

from pipeline._face import face

__getattr__, __dir__, __all__ = face(__name__, {
    'Batch': 'batch',
    'row_provenance': 'batch',
    'OVER_BOUND_ALLOWED': 'certificate',
    'METRICS': 'metrics',
    'StepAggregator': 'metrics',
    'typed': 'metrics',
    'Ready': 'poll',
    'run_call': 'poll',
    'RuleUse': 'rules',
    'FUTURE_VERSIONS': 'selection',
})
