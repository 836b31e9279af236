"""Metrics: one declaration per key (reduction, weight, value type), eviction metrics merged across
polls, and the off-policy metrics of a batch computed from their SQL declaration.

Eviction keys come from the rules' headers (sql/rules/: `metric`, `spread`); off-policy keys from
the aggregates of sql/metrics/off_policy.sql (`<name>_mean|max|min` -> `off_policy/<name>/...`),
each mean weighted by the column its `weights` header names (`<name> by <column>`).
The step aggregator reads the declarations and never guesses from a key's spelling.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.config import PREFIXES
from pipeline.decide import rules, vectors
from pipeline.errors import UnknownMetricError
from sql import loader
from sql.loader import Query, SqlError

OFF_POLICY = "off_policy"
DISCARDED = "filter_groups/discarded_surplus_samples"
STARVED = "dataset/starved"     # pipeline.decide.policies.starvation.METRIC
STATS = ("mean", "max", "min")


@dataclass(frozen=True)
class Metric:
    reduction: str              # sum | mean | max | min | last
    weight: str | None = None   # for mean: the key (or weight name) weighting each value
    type: type = float          # the value's type as reported (int for counts and step maxima)
    column: str | None = None   # off-policy metrics: the column of off_policy.sql


# the smallest staleness of a batch's non-padding rows (below 0: a version from the future)
STALENESS_MIN = "off_policy/trajectory_staleness/min"
# max_off_policy_strategy='mask': the non-padding rows trained with their loss switched off
MASKED_SAMPLES = "off_policy/masked_samples"


def masked_rows(table: pa.Table) -> int:
    """The non-padding rows of a batch table marked ``is_stale`` (what `MASKED_SAMPLES` counts)."""
    stale = pc.and_(table.column("is_stale"), pc.invert(table.column("is_padding")))
    return int(pc.sum(stale).as_py() or 0)


def declared_weights(q: Query) -> dict[str, str]:
    """`{metric name: weight column}` from the query's `weights` header (`<name> by <column>`,
    comma-separated). Every metric of the query names one, and each weight is a column the
    query returns that is not itself a metric."""
    out: dict[str, str] = {}
    for item in q.extra.get("weights", "").split(","):
        if not item.strip():
            continue
        bits = item.split()
        if len(bits) != 3 or bits[1] != "by":
            raise SqlError(f"{q.path}: weight {item.strip()!r}: write `<metric> by <column>`")
        if bits[0] in out:
            raise SqlError(f"{q.path}: metric {bits[0]!r} declares its weight twice")
        out[bits[0]] = bits[2]
    names = {c.rpartition("_")[0] for c in q.columns if c.rpartition("_")[2] in STATS}
    if missing := sorted(names - set(out)):
        raise SqlError(f"{q.path}: metrics without a declared weight: {', '.join(missing)}; "
                       "add `<metric> by <column>` to its `weights` header")
    if unknown := sorted(set(out) - names):
        raise SqlError(f"{q.path}: weights declared for metrics it does not return: "
                       f"{', '.join(unknown)}")
    if bad := sorted({w for w in out.values() if w not in q.columns
                      or w.rpartition("_")[2] in STATS}):
        raise SqlError(f"{q.path}: weight columns {', '.join(bad)} are not count columns it "
                       "returns")
    return out


def _off_policy_keys(q: Query) -> dict[str, Metric]:
    """`off_policy/<name>/<stat>` for every `<name>_<stat>` aggregate of the query, each mean
    weighted by the column its header declares."""
    weights = declared_weights(q)
    out: dict[str, Metric] = {}
    for col in q.columns:
        name, _, stat = col.rpartition("_")
        if stat not in STATS:
            continue   # a weight column, or the partition and step
        out[f"off_policy/{name}/{stat}"] = Metric(
            stat, weights[name] if stat == "mean" else None, float if stat == "mean" else int, col)
    return out


OFF_POLICY_KEYS = _off_policy_keys(loader.load(OFF_POLICY))
# the columns the means are weighted by (how many rows or tokens each was taken over)
WEIGHTS = tuple(sorted({m.weight for m in OFF_POLICY_KEYS.values() if m.weight is not None}))


def _declare() -> dict[str, Metric]:
    out: dict[str, Metric] = {}
    for p in PREFIXES:
        for rule in rules.reasons().values():
            count = f"{p}/{rule.metric}"
            out[count] = Metric("sum", type=int)
            if rule.spread:
                out[f"{p}/{rule.spread}/mean"] = Metric("mean", count)
                out[f"{p}/{rule.spread}/max"] = Metric("max")
                out[f"{p}/{rule.spread}/min"] = Metric("min")
        out[f"{p}/{DISCARDED}"] = Metric("sum", type=int)
        out[f"{p}/{STARVED}"] = Metric("max", type=int)     # datasets starved at the step
        out[f"{p}/{MASKED_SAMPLES}"] = Metric("sum", type=int)
        for key, m in OFF_POLICY_KEYS.items():
            out[f"{p}/{key}"] = m
    out["global_steps"] = Metric("last", type=int)
    return out


METRICS: dict[str, Metric] = _declare()


def typed(key: str, value: float) -> Any:
    """``value`` as the declared type of ``key`` (int counts stay ints)."""
    return declared_metric(key).type(value)


def declared_metric(key: str) -> Metric:
    m = METRICS.get(key)
    if m is None:
        raise UnknownMetricError(f"metric {key!r} is not declared in pipeline.decide.metrics.METRICS")
    return m


class CallMetrics(dict):
    """The scalar eviction metrics of one call, carrying the `{value: count}` of its filtered
    groups as ``reward_counts`` (not a scalar)."""

    def __init__(self, scalars: dict[str, float], reward_counts: dict[float, int]):
        super().__init__(scalars)
        self.reward_counts = dict(reward_counts)


@dataclass
class EvictionMetrics:
    """Eviction metrics of one sample call; polls add into it (counts are groups)."""

    counts: dict[str, int] = field(default_factory=dict)         # per reason
    spans: dict[str, list[int]] = field(default_factory=dict)    # group spans, per reason
    discarded: int = 0
    reward_counts: dict[float, int] = field(default_factory=dict)

    def add(self, ev: Any) -> None:
        """Add one poll's `decide.Eviction`: every reason that fired counts the group once."""
        for i, reason in ev.rows():
            self._count(reason, ev.group_spans[i], reason in ev.values,
                        ev.values[reason][i] if reason in ev.values else None)

    def add_rows(self, rows: list[tuple[str, int | None, float | None]]) -> None:
        """Add evictions read back from the decision log, (reason, group span, value) each (a
        restored buffer's evictions that no batch reported yet)."""
        for reason, span, value in rows:
            rule = rules.registry().get(reason)
            self._count(reason, span, bool(rule is not None and rule.value), value)

    def _count(self, reason: str, span: int | None, valued: bool, value: float | None) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        self.spans.setdefault(reason, []).append(span)
        if valued:
            self.reward_counts[value] = self.reward_counts.get(value, 0) + 1

    def merge(self, other: EvictionMetrics) -> None:
        """Add another call's evictions (those of a call that raised before it reported them)."""
        for reason, n in other.counts.items():
            self.counts[reason] = self.counts.get(reason, 0) + n
        for reason, spans in other.spans.items():
            self.spans.setdefault(reason, []).extend(spans)
        self.discarded += other.discarded
        for v, n in other.reward_counts.items():
            self.reward_counts[v] = self.reward_counts.get(v, 0) + n

    def scalars(self, prefix: str) -> dict[str, float]:
        """The eviction keys; a key appears only when non-zero."""
        out: dict[str, float] = {}
        for reason, rule in rules.reasons().items():
            n = self.counts.get(reason, 0)
            if not n:
                continue
            out[f"{prefix}/{rule.metric}"] = n
            if rule.spread:
                s = self.spans[reason]
                out[f"{prefix}/{rule.spread}/mean"] = sum(s) / len(s)
                out[f"{prefix}/{rule.spread}/max"] = float(max(s))
                out[f"{prefix}/{rule.spread}/min"] = float(min(s))
        if self.discarded:
            out[f"{prefix}/{DISCARDED}"] = self.discarded
        return out


def off_policy_metrics(rows: Any, step: int | None = None, prefix: str = "training"
                       ) -> tuple[dict[str, Any], dict[str, float]]:
    """The off-policy metrics of a batch, and the weights that merge their means.

    ``rows``: the provenance rows of `pipeline.decide.batch.batch_rows`, or a trajectory table
    (then ``step`` is the training step). No non-padding row: no metrics (never NaN, never a
    crash). The declared aggregates run over the rows the declaration keeps, compiled for numpy
    (`pipeline.decide.vectors`) as the provenance formulas are."""
    from pipeline.decide.batch import Rows, batch_rows
    if not isinstance(rows, Rows):
        for name, fill in (("partition", ""), ("uid", ""), ("seq", 0)):  # metrics ignore them
            if name not in rows.column_names:
                rows = rows.append_column(name, pa.array([fill] * rows.num_rows))
        uids = rows.column("uid").to_pylist()
        rows = batch_rows(rows, batch_id=-1, step=step, group_steps=dict.fromkeys(uids, step),
                          carry=False)
    if not rows.kept.any():
        return {}, {}
    row = vectors.aggregates(vectors.compiled_items(OFF_POLICY), vectors.where(rows.cols, rows.kept))
    out: dict[str, Any] = {}
    for key, m in OFF_POLICY_KEYS.items():
        v = row[m.column]
        if v is not None:
            out[f"{prefix}/{key}"] = m.type(v)
    weights = {w: float(row[w]) for w in WEIGHTS if row[w]}
    return out, weights


class StepAggregator:
    """Merges the metrics of several sample calls into one step, by declared reductions.

    A mean needs its weight: from the metrics themselves (an eviction mean is weighted by its
    count key) or from ``weights`` / a `Batch` (off-policy means by rows or tokens); a mean whose
    weight is missing is an error, never a silent unweighted mean."""

    def __init__(self) -> None:
        self._vals: dict[str, list[tuple[float, float]]] = {}
        self.reward_counts: dict[float, int] = {}

    def add(self, metrics: Any, weights: dict[str, float] | None = None,
            reward_counts: dict[float, int] | None = None) -> None:
        """Add one call's metrics: a `Batch` (its metrics, weights and reward counts), or a
        metric dict with its ``weights`` and ``reward_counts``.

        All-or-nothing: every key, value, weight and count is checked before any is added, so a
        call that raises adds nothing and its retry counts each metric once. A value is a finite
        real number (a numpy scalar too; a whole number for a count); ``weights`` map weight
        names to numbers >= 0; ``reward_counts`` map reward values to counts (ints >= 0). A
        wrong value is a ConfigError naming the key; an undeclared key or a mean without its
        weight an UnknownMetricError."""
        if hasattr(metrics, "metric_weights"):   # a Batch
            weights = {**metrics.metric_weights, **self._mapping("weights", weights)}
            reward_counts = reward_counts or metrics.filtered_reward_counts
            metrics = metrics.metrics
        if metrics is None:
            raise self._bad("metrics=None: pass a Batch or a metric dict {key: value}")
        metrics = self._mapping("metrics", metrics)
        weights = {k: self._number(f"weights[{k!r}]", w, minimum=0.0)
                   for k, w in self._mapping("weights", weights).items()}
        added = [(k, self._value(k, v), self._weight(k, metrics, weights))
                 for k, v in metrics.items()]
        counts = [(self._reward(value), self._count(f"reward_counts[{value!r}]", n))
                  for value, n in self._mapping("reward_counts", reward_counts).items()]
        for k, v, w in added:           # all checked: nothing below raises
            self._vals.setdefault(k, []).append((v, w))
        for value, n in counts:
            self.reward_counts[value] = self.reward_counts.get(value, 0) + n

    # --- add's checks: each names the argument, the key and what to pass ------------------------
    @staticmethod
    def _bad(message: str) -> Exception:
        from pipeline.errors import ConfigError
        return ConfigError(f"StepAggregator.add: {message}")

    @classmethod
    def _mapping(cls, name: str, value: Any) -> Any:
        """``value`` when it is a mapping; None is an empty one."""
        from collections.abc import Mapping
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise cls._bad(f"{name}={value!r} must be a dict (a Batch's metrics, or "
                           f"{{key: value}}), not {type(value).__name__}")
        return value

    @classmethod
    def _number(cls, name: str, value: Any, minimum: float | None = None) -> float:
        """A finite real number (a numpy scalar too; bool, str and None refused), as a float."""
        import math

        from pipeline.arguments import real
        x = real(value)
        if x is None or not math.isfinite(x) or (minimum is not None and x < minimum):
            at_least = "" if minimum is None else f" >= {minimum:g}"
            raise cls._bad(f"{name}={value!r} must be a finite number{at_least} (an int or "
                           "a float)")
        return x

    @classmethod
    def _count(cls, name: str, value: Any) -> int:
        from pipeline.arguments import count_arg
        return count_arg(name, value, "(how many groups had that reward)", minimum=0,
                         where="StepAggregator.add")

    @classmethod
    def _reward(cls, value: Any) -> float | None:
        """A reward value of ``reward_counts`` (a number, or None for a group without one)."""
        from pipeline.arguments import real
        x = None if value is None else real(value)
        if value is not None and (x is None or x != x):
            raise cls._bad(f"reward_counts has the key {value!r}: each key is a reward value, a "
                           "number (or None), with the count of groups that had it")
        return x

    @classmethod
    def _value(cls, key: str, value: Any) -> float:
        """A metric's value, checked against its declaration (a count is a whole number)."""
        decl = declared_metric(key)
        x = cls._number(f"metrics[{key!r}]", value)
        if decl.type is int and not x.is_integer():
            raise cls._bad(f"metrics[{key!r}]={value!r} must be a whole number: {key} is "
                           "declared a count (an int)")
        return x

    @classmethod
    def _weight(cls, key: str, metrics: Any, weights: dict[str, float]) -> float:
        """The weight merging ``key``'s value: 1 unless it is a mean, whose weight comes from
        its count key among the metrics or from ``weights``."""
        decl = declared_metric(key)
        if decl.reduction != "mean":
            return 1.0
        if decl.weight in metrics:
            return cls._number(f"metrics[{decl.weight!r}]", metrics[decl.weight], minimum=0.0)
        if decl.weight in weights:
            return weights[decl.weight]
        raise UnknownMetricError(
            f"metric {key!r} is a mean weighted by {decl.weight!r}: pass the batch "
            f"(aggregator.add(batch)) or weights={{{decl.weight!r}: ...}}")

    def result(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for k, vals in self._vals.items():
            red = METRICS[k].reduction
            xs = [v for v, _ in vals]
            if red == "sum":
                out[k] = sum(xs)
            elif red == "mean":
                total = sum(w for _, w in vals)
                out[k] = sum(v * w for v, w in vals) / total if total else 0.0
            elif red == "max":
                out[k] = max(xs)
            elif red == "min":
                out[k] = min(xs)
            else:
                out[k] = xs[-1]
            if red != "mean":      # a count, extreme or last value keeps its declared type
                out[k] = METRICS[k].type(out[k])
        return out
