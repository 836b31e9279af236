"""One poll: which groups the active rules evict, and which groups are oldest.

The buffer calls these under its lock, so the index cannot change during a poll; evicted groups
are removed before selection looks (SPEC §5). Only fresh groups and those behind a rule's horizon
are examined (pipeline/candidates.py), so a poll's cost follows what changed, not the buffer size.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.candidates import FAILURE, Columns
from pipeline.config import BufferConfig
from pipeline.errors import MissingMetricError
from pipeline.policies.context import PollContext
from pipeline.store import PartitionState


@dataclass
class Eviction:
    """Rows one poll evicts: uid, the reasons that fired, its span and (zero-variance) value."""

    uids: list[str]
    reasons: dict[str, list[bool]]
    spans: list[int]
    values: list[float]
    empty_failures: int

    @property
    def count(self) -> int:
        return len(self.uids)


NOTHING = Eviction([], {}, [], [], 0)


def evaluate(part: PartitionState, cfg: BufferConfig, ctx: PollContext) -> Eviction:
    """The evictions of one poll, reasons combined by union. Changes nothing."""
    rules = [ev for ev in cfg.evictors() if ev.active(ctx)]
    if not rules or part.candidates.alive_count == 0:
        return NOTHING
    if cfg.zero_variance.active(ctx):
        missing = part.candidates.missing_metric()
        if missing:
            raise MissingMetricError(
                f"{len(missing)} finished group(s) of partition {ctx.partition!r} have a "
                f"trajectory without reward metric {cfg.zero_variance.metric!r} "
                f"(filter_groups_metric): {missing[:5]}; add it to reward_info, or choose a "
                "metric every trajectory reports")
    horizons = [h for h in (r.horizon(ctx) for r in rules) if h is not None]
    rows = part.candidates.to_examine(max(horizons) if horizons else None)
    if not rows:
        return NOTHING
    cols = Columns(rows)
    masks = {r.reason: r.mask(cols, ctx) for r in rules}
    hit = np.flatnonzero(np.logical_or.reduce(list(masks.values())))
    if hit.size == 0:
        return NOTHING
    hit = hit[np.lexsort((cols.term_seq[hit], cols.gs[hit]))]   # decision rows oldest first
    reasons = {r: m[hit].tolist() for r, m in masks.items()}
    fail = masks.get("failure")
    empty = 0 if fail is None else int(
        (fail[hit] & (cols.status[hit] == FAILURE) & (cols.n_traj[hit] == 0)).sum())
    spans = (ctx.step - cols.gs[hit] + 1).tolist()
    return Eviction([rows[i].uid for i in hit], reasons, spans, cols.value[hit].tolist(), empty)


def oldest(part: PartitionState, k: int | None) -> list[str]:
    """The k oldest alive groups by (global_steps, terminal arrival seq); all if k is None.

    The terminal seq is unique per buffer, so (global_steps, seq) is already a total order and uid
    never has to break a tie. Hash order never enters (verl's defect, SPEC §9)."""
    return part.candidates.oldest(k)
