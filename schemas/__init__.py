"""Every table replaylake keeps, declared once as a pyarrow schema with field docs in metadata."""
from __future__ import annotations

from schemas.conform import Problem, conform
from schemas.tables import (
    BATCH_PROVENANCE,
    CANDIDATES,
    DECISIONS,
    GROUP_EVENTS,
    GROUP_TRAJECTORIES,
    GROUPS_INPUT,
    LAKE_TABLES,
    LOOKUPS,
    METRICS,
    STALE_BOUNDS,
    STATUS_INPUT,
    TRAJECTORIES,
    TRAJECTORIES_INPUT,
    VERSION_SPAN,
)

__all__ = [
    "BATCH_PROVENANCE", "CANDIDATES", "DECISIONS", "GROUP_EVENTS", "GROUP_TRAJECTORIES",
    "GROUPS_INPUT", "LAKE_TABLES", "LOOKUPS", "METRICS", "STALE_BOUNDS",
    "STATUS_INPUT", "TRAJECTORIES", "TRAJECTORIES_INPUT", "VERSION_SPAN", "Problem", "conform",
]
