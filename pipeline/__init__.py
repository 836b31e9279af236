"""replaylake's library: an off-policy-aware replay buffer for async LLM RL on Arrow tables.

The public names below are imported on first use (PEP 562), not when the package is: importing
one submodule (`pipeline.errors`, `pipeline.analysis.views`) must not pull in polars, pandas and the
whole buffer, which cost the command line about half a second per call, and made `sql.loader`
(imported by `pipeline.decide.compile`) unimportable on its own through a cycle."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.buffer import ReplayBuffer
    from pipeline.config import BufferConfig, async_config, sync_config
    from pipeline.decide import METRICS, Batch, Ready, StepAggregator
    from pipeline.errors import (
        BufferFullError,
        ConfigError,
        EmptyBatchError,
        IngestError,
        InvariantError,
        LakeDamageError,
        LakeError,
        MissingMetricError,
        PoolError,
        PresetKeywordError,
        RefillLimitError,
        ReplayLakeError,
        SampleTimeout,
        UnknownBatchError,
        UnknownGroupError,
        UnknownMetricError,
    )
    from pipeline.ingest import PutResult
    from pipeline.state import GroupView
    from pipeline.to_torch import TensorPool

# public name -> the submodule that defines it
_HOMES: dict[str, str] = {
    "Batch": "decide.batch", "ReplayBuffer": "buffer", "BufferConfig": "config.buffer_config",
    "async_config": "config.buffer_config", "sync_config": "config.buffer_config",
    "METRICS": "decide.metrics", "StepAggregator": "decide.metrics", "Ready": "decide.poll",
    "GroupView": "state.partition", "TensorPool": "to_torch.pool",
    "PutResult": "ingest.retries",
    **dict.fromkeys([
        "BufferFullError", "ConfigError", "EmptyBatchError", "IngestError", "InvariantError",
        "LakeDamageError", "LakeError", "MissingMetricError", "PoolError", "PresetKeywordError",
        "RefillLimitError", "ReplayLakeError", "SampleTimeout", "UnknownBatchError",
        "UnknownGroupError", "UnknownMetricError"], "errors"),
}

__all__ = [
    "METRICS", "Batch", "BufferConfig", "BufferFullError", "ConfigError", "EmptyBatchError",
    "GroupView", "IngestError", "InvariantError", "LakeDamageError", "LakeError",
    "MissingMetricError", "PoolError", "PresetKeywordError", "PutResult", "Ready",
    "RefillLimitError", "ReplayBuffer", "ReplayLakeError", "SampleTimeout", "StepAggregator",
    "TensorPool", "UnknownBatchError", "UnknownGroupError", "UnknownMetricError", "async_config",
    "sync_config",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"pipeline.{home}"), name)
    globals()[name] = value          # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
