"""Read-only analysis of a lake: DuckDB views, guarded SQL, what-if replays, the staleness report."""
from __future__ import annotations

from pipeline._face import face

__getattr__, __dir__, __all__ = face(__name__, {
    'connect': 'views',
    'read_sql': 'views',
    'read_lake': 'views',
    'DERIVED_VIEWS': 'views',
    'statements': 'guard',
    'ReadOnlyError': 'guard',
})
