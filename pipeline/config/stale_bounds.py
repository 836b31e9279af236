"""Per-dataset staleness bounds: `max_off_policy_threshold` as one int or as a mapping.

``max_off_policy_threshold={"math": 4, "code": 8, "*": 6}`` gives each named dataset its own
bound (the largest group span a group of it may be trained at) and every other group, including
one registered without a dataset, the ``"*"`` entry: the default is required, so no group is
left without a bound by a dataset name nobody listed. The mapping becomes the `stale_bounds`
relation (schemas.STALE_BOUNDS) that the `stale` rule joins on the group's dataset, on both
engines; the default stays the rule's `threshold` and the tightest bound its horizon's.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from pipeline.arguments import int64
from pipeline.errors import ConfigError
from schemas import STALE_BOUNDS

DEFAULT_KEY = "*"
"""The mapping key of the bound for every dataset the mapping does not name."""

_USE = ("use a positive int, None to disable the staleness bound, or a mapping of dataset names "
        f"to positive ints with a {DEFAULT_KEY!r} default, e.g. {{'math': 4, {DEFAULT_KEY!r}: 8}} "
        "(a bound is an int64: at most 2**63 - 1)")


class ThresholdError(ConfigError):
    """max_off_policy_threshold is invalid (the verl adapter also makes this an AssertionError)."""


def _bad(detail: str) -> ThresholdError:
    return ThresholdError(f"Invalid max off policy threshold: {detail}")


def _positive(value: Any) -> int | None:
    """``value`` as a python int when it is a bound: a positive int that fits an int64 (the
    `stale` rule's BIGINT parameters; a numpy integer too, bool refused), else None."""
    bound = int64(value)
    return bound if bound is not None and bound > 0 else None


@dataclass(frozen=True)
class StaleBounds:
    """The bound of every group: ``default`` (None: unbounded) unless its dataset is one of
    ``by_dataset`` (name, bound), sorted by name."""

    default: int | None = None
    by_dataset: tuple[tuple[str, int], ...] = ()

    def given(self) -> int | dict[str, int] | None:
        """The setting as a user writes it (and the lake records it)."""
        if not self.by_dataset:
            return self.default
        return {**dict(self.by_dataset), DEFAULT_KEY: self.default}

    def of(self, dataset: str | None) -> int | None:
        """The bound of a group registered with ``dataset``."""
        return dict(self.by_dataset).get(dataset, self.default) if dataset is not None \
            else self.default

    def tightest(self) -> int | None:
        return None if self.default is None else min([self.default, *dict(self.by_dataset).values()])

    def loosest(self) -> int | None:
        return None if self.default is None else max([self.default, *dict(self.by_dataset).values()])

    def table(self) -> pa.Table:
        """The `stale_bounds` rows: one per named dataset (the default is the rule's threshold)."""
        return pa.table({"dataset": [d for d, _ in self.by_dataset],
                         "bound": [b for _, b in self.by_dataset]}, schema=STALE_BOUNDS)


def parse(value: Any) -> StaleBounds:
    """``max_off_policy_threshold`` checked: a positive int, None, or a mapping of dataset names
    to positive ints holding the ``"*"`` default. Errors name the entry and what to write."""
    if value is None:
        return StaleBounds()
    if isinstance(value, Mapping):
        return _mapping(value)
    bound = _positive(value)
    if bound is None:
        raise _bad(f"max_off_policy_threshold={value!r}; {_USE}")
    return StaleBounds(bound)


def _mapping(value: Mapping) -> StaleBounds:
    bounds: dict[str, int] = {}
    for key, bound in value.items():
        if not isinstance(key, str) or not key:
            raise _bad(f"max_off_policy_threshold has the key {key!r}; keys are dataset names "
                       f"(non-empty str, as groups register them) or {DEFAULT_KEY!r} for the rest")
        checked = _positive(bound)
        if checked is None:
            raise _bad(f"max_off_policy_threshold[{key!r}]={bound!r}; each bound is a positive "
                       "int of at most 2**63 - 1 (the largest group span a group of that dataset "
                       "may be trained at)")
        bounds[str(key)] = checked
    if DEFAULT_KEY not in bounds:
        raise _bad(f"max_off_policy_threshold={dict(value)!r} has no {DEFAULT_KEY!r} entry; give "
                   "the bound of every dataset not named (and of groups registered without a "
                   f"dataset), e.g. {({**value, DEFAULT_KEY: 8})!r}")
    named = tuple(sorted((k, v) for k, v in bounds.items() if k != DEFAULT_KEY))
    return StaleBounds(bounds[DEFAULT_KEY], named)


def recorded(threshold: Any) -> pa.Table:
    """The `stale_bounds` rows of a lake's recorded ``max_off_policy_threshold`` (empty unless
    it was a mapping), so SQL over the lake runs the `stale` rule with the run's bounds."""
    if not isinstance(threshold, Mapping):
        return StaleBounds().table()
    return parse(dict(threshold)).table()
