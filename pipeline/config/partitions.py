"""What a partition id means beyond its name: validation or not, and its metric prefix.

The one place that knows the rule: a partition whose id is exactly `val` is a validation
partition (nothing is evicted, filtered or refilled there; failures stay sampleable), and metric
keys use the prefix `training` only for the partition `train` (`validation` for every other id).
"""
from __future__ import annotations

VALIDATION = "val"
TRAINING = "train"
PREFIXES = ("training", "validation")


def is_validation(partition: str) -> bool:
    return partition == VALIDATION


def metric_prefix(partition: str) -> str:
    return "training" if partition == TRAINING else "validation"
