"""What a partition id means beyond its name: validation or not, its metric prefix, and how a
refill is asked for it.

The one place that knows the rule: a partition whose id is exactly `val` is a validation
partition (nothing is evicted, filtered or refilled there; failures stay sampleable), and metric
keys use the prefix `training` only for the partition `train` (`validation` for every other id).
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

VALIDATION = "val"
TRAINING = "train"
PREFIXES = ("training", "validation")


def is_validation(partition: str) -> bool:
    return partition == VALIDATION


def metric_prefix(partition: str) -> str:
    return "training" if partition == TRAINING else "validation"


def ask_refill(refill_fn: Callable[..., Any], n: int, partition: str, with_partition: bool) -> None:
    """Ask ``refill_fn`` for ``n`` prompts of ``partition``: ``refill_fn(n, partition=...)`` when
    it takes a ``partition`` keyword (``with_partition``, read once by `takes_partition`), so one
    function can route the prompts of several training partitions; plain ``refill_fn(n)``
    otherwise (verl's form)."""
    if with_partition:
        refill_fn(n, partition=partition)
    else:
        refill_fn(n)


def takes_partition(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` takes a ``partition`` keyword (named, or through ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):       # a builtin without a readable signature
        return False
    return any(p.kind is p.VAR_KEYWORD or (p.name == "partition" and p.kind in
               (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)) for p in params)
