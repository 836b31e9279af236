"""One poll: evict on a consistent snapshot with one fused query, then (when asked) select.

The buffer calls these under its lock, so the candidate table cannot change during a poll; groups
evicted by a poll are removed from the snapshot before selection looks at it.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import reduce

import polars as pl

from pipeline.candidates import FAILURE
from pipeline.config import BufferConfig
from pipeline.errors import MissingMetricError
from pipeline.policies.context import PollContext
from pipeline.store import PartitionState


@dataclass
class Eviction:
    """Rows one poll evicted: uid, the reasons that fired, its span and (zero-variance) value."""

    uids: list[str]
    reasons: dict[str, list[bool]]
    spans: list[int]
    values: list[float]
    empty_failures: int

    @property
    def count(self) -> int:
        return len(self.uids)


def evaluate(part: PartitionState, cfg: BufferConfig, ctx: PollContext) -> Eviction:
    """Which live candidates the active evictors flag, in one polars query (reasons combine)."""
    flags = [(ev.reason, ev.flag(ctx)) for ev in cfg.evictors()]
    flags = [(r, e) for r, e in flags if e is not None]
    if not flags or part.candidates.alive_count == 0:
        return Eviction([], {}, [], [], 0)
    if cfg.zero_variance.metric is not None and not ctx.validation:
        missing = part.missing_metric_groups()
        if missing:
            raise MissingMetricError(
                f"{len(missing)} finished group(s) of partition {ctx.partition!r} have a "
                f"trajectory without reward metric {cfg.zero_variance.metric!r} "
                f"(filter_groups_metric): {missing[:5]}; add it to reward_info, or choose a "
                "metric every trajectory reports")
    any_flag = reduce(lambda a, b: a | b, [pl.col(r) for r, _ in flags])
    hit = (part.candidates.frame().lazy()
           .filter(pl.col("alive"))
           .with_columns([e.alias(r) for r, e in flags])
           .filter(any_flag)
           .select("row", "gs", "value", "status", "n_traj", *[r for r, _ in flags])
           .sort("row")
           .collect())
    if hit.height == 0:
        return Eviction([], {}, [], [], 0)
    uids = [part.candidates.uids[i] for i in hit["row"].to_list()]
    reasons = {r: hit[r].to_list() for r, _ in flags}
    fail = reasons.get("failure", [False] * hit.height)
    empty = sum(1 for f, s, n in zip(fail, hit["status"].to_list(), hit["n_traj"].to_list())
                if f and s == FAILURE and n == 0)
    spans = [ctx.step - gs + 1 for gs in hit["gs"].to_list()]
    return Eviction(uids, reasons, spans, hit["value"].to_list(), empty)


def oldest(part: PartitionState, k: int | None) -> list[str]:
    """The k oldest live candidates by (global_steps, terminal arrival seq); all if k is None.

    The terminal seq is unique per buffer, so (global_steps, seq) is already a total order; uid
    would only break ties that cannot occur. Hash order never enters (verl's defect, SPEC §9)."""
    if part.candidates.alive_count == 0:
        return []
    live = part.candidates.frame().lazy().filter(pl.col("alive"))
    if k is None:
        rows = live.sort(["gs", "term_seq"]).select("row").collect()
    else:
        rows = live.bottom_k(k, by=["gs", "term_seq"]).sort(["gs", "term_seq"]) \
            .select("row").collect()
    return [part.candidates.uids[i] for i in rows["row"].to_list()]
