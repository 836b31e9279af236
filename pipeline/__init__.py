"""replaylake's library: an off-policy-aware replay buffer for async LLM RL on Arrow tables."""
from __future__ import annotations

from pipeline.batch import Batch
from pipeline.buffer import ReplayBuffer
from pipeline.config import BufferConfig, async_config, sync_config
from pipeline.errors import (
    BufferFullError,
    ConfigError,
    EmptyBatchError,
    IngestError,
    InvariantError,
    LakeDamageError,
    LakeError,
    MissingMetricError,
    PresetKeywordError,
    RefillLimitError,
    ReplayLakeError,
    SampleTimeout,
    UnknownBatchError,
    UnknownGroupError,
    UnknownMetricError,
)
from pipeline.metrics import METRICS, StepAggregator
from pipeline.sampling import Ready
from pipeline.store import GroupView

__all__ = [
    "METRICS", "Batch", "BufferConfig", "BufferFullError", "ConfigError", "EmptyBatchError",
    "GroupView", "IngestError", "InvariantError", "LakeDamageError", "LakeError",
    "MissingMetricError", "PresetKeywordError", "Ready", "RefillLimitError", "ReplayBuffer",
    "ReplayLakeError", "SampleTimeout", "StepAggregator", "UnknownBatchError",
    "UnknownGroupError", "UnknownMetricError", "async_config", "sync_config",
]
