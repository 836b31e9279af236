"""One poll: which groups the configured rules evict, evaluated by the numpy engine.

The buffer calls this under its lock, so the index cannot change during a poll; evicted groups are
removed before selection looks. The rules are the declarations of sql/rules/, compiled once; the
rows they see are exactly what the candidate index hands a poll (fresh groups and those behind a
rule's horizon), so a poll's cost follows what changed, not the buffer's size.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache, lru_cache

import numpy as np

from pipeline.decide import aggregates, rules, vectors
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


@dataclass
class Examined:
    """What the rules said of each group at one step: `evaluate`'s memory, kept per partition.

    A rule reads a group's candidate row (fixed once the group is terminal), the step, its
    parameters and its lookup rows, and nothing else. So within one step and configuration
    (``key``) a group's outcome cannot change, and a poll evaluates only the rows it has not
    seen yet: a `sample` after `get_sampleable_count` or `dispatch_capacity` at the same step,
    and every poll after the first of a waiting call, runs no rule evaluation for the groups
    those already examined. An entry is kept with the group's terminal seq and answers only for
    the very row it was computed from; another step, other parameters or another filter metric
    start it afresh.

    Only the rows of the latest evaluation are kept: within a step a row is handed to the rules
    again only while it is fresh (not yet settled by a committed poll) or behind a rule's
    horizon, and either way it was handed to the latest evaluation too. So the memory holds no
    more than a poll examines (a few dozen rows in a running trainer), never the buffer."""

    key: tuple | None = None
    # uid -> (term_seq, order key, group span, fired per rule, value per rule, metric missing)
    rows: dict[str, tuple] = field(default_factory=dict)

    def at(self, key: tuple) -> dict[str, tuple]:
        if key != self.key:
            self.key, self.rows = key, {}
        return self.rows


_SEQ_AT = candidates.COLUMNS.index("term_seq")
_UID_AT = candidates.COLUMNS.index("uid")
_ORDER_AT = tuple(candidates.COLUMNS.index(c) for c in candidates.ORDER)


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
    if part.examined is None:
        part.examined = Examined()
    seen = part.examined.at((uses, step, filter_metric))
    todo = [r for r in rows if (e := seen.get(r[_UID_AT])) is None or e[0] != r[_SEQ_AT]]
    if todo:
        _examine(todo, uses, step, filter_metric, seen)
    examined = [seen[r[_UID_AT]] for r in rows]
    part.examined.rows = dict(zip((r[_UID_AT] for r in rows), examined))
    if filter_metric is not None:
        _raise_missing([r[_UID_AT] for r, e in zip(rows, examined) if e[5]], part.partition,
                       filter_metric)
    # oldest first, in the order selection declares (the candidate index's)
    hit = sorted((e for e in examined if any(e[3])), key=lambda e: e[1])
    if not hit:
        return Eviction()
    ev = Eviction(uids=[e[1][_ORDER_UID] for e in hit], group_spans=[e[2] for e in hit])
    credits = [0] * len(hit)
    for k, u in enumerate(uses):
        fired = [e[3][k] for e in hit]
        ev.reasons[u.name] = fired
        if u.rule.value:
            ev.values[u.name] = [e[4][k] for e in hit]
        credits = [max(c, u.rule.credit) if f else c for c, f in zip(credits, fired)]
    ev.credits = credits
    return ev


_ORDER_UID = candidates.ORDER.index("uid")


def rule_frame(rows: list[tuple], uses: tuple[RuleUse, ...], params: dict,
               columns: tuple[str, ...] | None = None) -> dict[str, vectors.Col]:
    """Candidate rows as the frame compiled rules read: the candidate columns (``columns`` of
    them, or all), one column per parameter (``params``: the rules' bound values, the step
    included) and the columns each rule's lookup joins."""
    frame = vectors.bind(candidates.columns(rows, columns), params)
    rules.add_lookups(frame, uses, len(rows))
    return frame


def fired(rule: rules.Rule, frame: dict[str, vectors.Col], n: int) -> list[bool]:
    """Where the rule's predicate is true over a frame of ``n`` rows (NULL is not)."""
    return np.broadcast_to(vectors.true(rule.expr.fn(frame)), (n,)).tolist()


def _examine(rows: list[tuple], uses: tuple[RuleUse, ...], step: int, filter_metric: str | None,
             seen: dict[str, tuple]) -> None:
    """Evaluate every rule over ``rows`` (candidate rows) and remember each group's outcome in
    ``seen``. The rules are compiled for numpy (`pipeline.decide.vectors`): a poll examines a
    few dozen groups, where polars' fixed cost per expression would be most of the work."""
    columns, values = _plan(uses, filter_metric is not None)
    params = _params(uses, step)
    frame = rule_frame(rows, uses, {**params, "step": step}, columns)
    frame["step"] = vectors.scalar(step)
    n = len(rows)
    spans = np.broadcast_to(_group_span().fn(frame).values, (n,)).tolist()
    hits = list(zip(*(fired(u.rule, frame, n) for u in uses)))
    got = list(zip(*(frame[v].tolist() if v else [None] * n for v in values)))
    missing = fired(rules.get("missing_metric"), frame, n) if filter_metric is not None else \
        [False] * n
    for i, r in enumerate(rows):
        seen[r[_UID_AT]] = (r[_SEQ_AT], tuple(r[j] for j in _ORDER_AT), spans[i], hits[i],
                            got[i], missing[i])


@cache
def _group_span() -> vectors.Compiled:
    """The declared group span (sql/metrics/provenance.sql), compiled for numpy."""
    return vectors.compiled_items("provenance")[_GROUP_SPAN]


@lru_cache(maxsize=64)
def _plan(uses: tuple[RuleUse, ...], check_metric: bool
          ) -> tuple[tuple[str, ...], tuple[str | None, ...]]:
    """The candidate columns a poll's evaluation reads (the group span's, the values rules
    record, each rule's and, with a filter metric, the missing-metric check's; the columns a
    lookup joins on included), in CANDIDATES order; and the value column of each rule."""
    reads = set(_group_span().reads)
    values = tuple(u.rule.value for u in uses)
    reads |= {v for v in values if v}
    for u in uses:
        reads |= u.rule.expr.reads
    if check_metric:
        reads |= rules.get("missing_metric").expr.reads
    reads |= {u.rule.lookup[1] for u in uses if u.rule.lookup is not None}
    return tuple(c for c in candidates.COLUMNS if c in reads), values


def group_spans(step: int, dispatch_steps: list[int]) -> list[int]:
    """The declared group span (sql/metrics/provenance.sql) of groups dispatched at these steps."""
    n = len(dispatch_steps)
    frame = {"global_steps": vectors.of(np.asarray(dispatch_steps, dtype=np.int64).reshape(n)),
             "step": vectors.scalar(step)}
    return np.broadcast_to(_group_span().fn(frame).values, (n,)).tolist()


def _raise_missing(missing: list[str], partition: str, metric: str) -> None:
    if missing:
        missing = sorted(missing)
        raise MissingMetricError(
            f"{len(missing)} finished group(s) of partition {partition!r} have a trajectory "
            f"without reward metric {metric!r} (filter_groups_metric): {missing[:5]}; add it to "
            "reward_info, or choose a metric every trajectory reports. Until then every sample "
            "of the partition stops here: to go on without these groups, take them out with "
            f"retire({partition!r}, uids, reason='missing_metric') (recorded as evictions)")
