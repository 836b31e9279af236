"""One poll: which groups the configured rules evict, evaluated by the polars engine.

The buffer calls this under its lock, so the index cannot change during a poll; evicted groups are
removed before selection looks. The rules are the declarations of sql/rules/, compiled once; the
rows they see are exactly what the candidate index hands a poll (fresh groups and those behind a
rule's horizon), so a poll's cost follows what changed, not the buffer's size.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from pipeline.decide import aggregates, rules
from pipeline.decide import compile as declared
from pipeline.decide.rules import RuleUse
from pipeline.errors import MissingMetricError
from pipeline.state import PartitionState, candidates

_GROUP_SPAN = "group_span"


@dataclass
class Eviction:
    """Groups one poll evicts (oldest first), the reasons that fired for each, its group span at
    the decision, the value column of rules that record one, and its refill credit."""

    uids: list[str] = field(default_factory=list)
    reasons: dict[str, list[bool]] = field(default_factory=dict)
    group_spans: list[int] = field(default_factory=list)
    values: dict[str, list[float | None]] = field(default_factory=dict)
    credits: list[int] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.uids)

    def by_reason(self) -> dict[str, int]:
        return {r: sum(h) for r, h in self.reasons.items()}

    def rows(self) -> list[tuple[int, str]]:
        """(row index, reason) of every (group, reason) that fired, in decision-log order."""
        return [(i, r) for i in range(self.count) for r, h in self.reasons.items() if h[i]]


def _params(uses: tuple[RuleUse, ...], step: int) -> dict:
    out: dict = {}
    for u in uses:
        out.update(u.bind(step))
    return out


def evaluate(part: PartitionState, uses: tuple[RuleUse, ...], step: int,
             filter_metric: str | None) -> Eviction:
    """The evictions of one poll, reasons combined by union. Changes no group's fate."""
    if not uses or part.candidates.alive_count == 0:
        return Eviction()
    aggregates.complete(part)
    horizons = [h for h in (u.rule.horizon(u.bind(step)) for u in uses) if h is not None]
    rows = part.candidates.to_examine(max(horizons) if horizons else None)
    if not rows:
        return Eviction()
    frame = rules.with_lookups(declared.with_params(candidates.frame(rows), _params(uses, step)),
                               uses)
    frame = frame.hstack([pl.Series("step", [step], pl.Int64).new_from_index(0, frame.height)])
    span_expr = declared.compiled_items("provenance")[_GROUP_SPAN]
    exprs = [u.rule.expr.fill_null(False).alias(u.name) for u in uses]
    check = rules.get("missing_metric")
    if filter_metric is not None:
        exprs.append(check.expr.alias(check.name))
    # one evaluation for every rule; the few rows that fired are picked and ordered in Python
    # (each further polars call has a fixed cost larger than the work on the rows themselves)
    # (whether any rule fired is told from the rules' own columns in Python: an eager select
    # does not share subexpressions, so a polars `any_horizontal` would evaluate each rule again)
    out = frame.select(
        "uid", "global_steps", "term_seq", span_expr.alias(_GROUP_SPAN),
        *{u.rule.value for u in uses if u.rule.value}, *exprs)
    if filter_metric is not None:
        _raise_missing(out, part.partition, filter_metric)
    col = {c: out.get_column(c).to_list() for c in out.columns}
    fired_any = [any(f) for f in zip(*(col[u.name] for u in uses))]
    # oldest first, in the order selection declares (the candidate index's)
    hit = sorted((i for i, h in enumerate(fired_any) if h),
                 key=lambda i: tuple(col[c][i] for c in candidates.ORDER))
    if not hit:
        return Eviction()
    ev = Eviction(uids=[col["uid"][i] for i in hit],
                  group_spans=[col[_GROUP_SPAN][i] for i in hit])
    credits = [0] * len(hit)
    for u in uses:
        fired = [col[u.name][i] for i in hit]
        ev.reasons[u.name] = fired
        if u.rule.value:
            ev.values[u.name] = [col[u.rule.value][i] for i in hit]
        credits = [max(c, u.rule.credit) if f else c for c, f in zip(credits, fired)]
    ev.credits = credits
    return ev


def group_spans(step: int, dispatch_steps: list[int]) -> list[int]:
    """The declared group span (sql/metrics/provenance.sql) of groups dispatched at these steps."""
    frame = pl.DataFrame({"global_steps": dispatch_steps, "step": [step] * len(dispatch_steps)},
                         schema={"global_steps": pl.Int64, "step": pl.Int64})
    expr = declared.compiled_items("provenance")[_GROUP_SPAN]
    return frame.select(expr).to_series().to_list()


def _raise_missing(out: pl.DataFrame, partition: str, metric: str) -> None:
    missing = out.filter(pl.col("missing_metric").fill_null(False))["uid"].sort().to_list()
    if missing:
        raise MissingMetricError(
            f"{len(missing)} finished group(s) of partition {partition!r} have a trajectory "
            f"without reward metric {metric!r} (filter_groups_metric): {missing[:5]}; add it to "
            "reward_info, or choose a metric every trajectory reports")
