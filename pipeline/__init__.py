"""replaylake's library: an off-policy-aware replay buffer for async LLM RL on Arrow tables."""
from __future__ import annotations

from pipeline.batch import Batch
from pipeline.buffer import ReplayBuffer
from pipeline.config import BufferConfig, async_config, sync_config
from pipeline.errors import (
    ConfigError,
    EmptyBatchError,
    IngestError,
    InvariantError,
    LakeError,
    MissingMetricError,
    RefillLimitError,
    ReplayLakeError,
    SampleTimeout,
    UnknownGroupError,
)
from pipeline.metrics import METRICS, StepAggregator

__all__ = [
    "METRICS", "Batch", "BufferConfig", "ConfigError", "EmptyBatchError", "IngestError",
    "InvariantError", "LakeError", "MissingMetricError", "RefillLimitError", "ReplayBuffer",
    "ReplayLakeError", "SampleTimeout", "StepAggregator", "UnknownBatchError", "UnknownGroupError",
    "async_config", "sync_config",
]
