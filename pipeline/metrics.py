"""Metrics: declared reductions, eviction metrics merged across polls, off-policy batch metrics.

Every metric key is declared once in METRICS with its reduction and, for means, the weight that
merges it; the step aggregator reads that table and never guesses from a key's spelling.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

PREFIXES = ("training", "validation")


def prefix_of(partition: str) -> str:
    """`training` only when the partition id is exactly `train` (verl's rule)."""
    return "training" if partition == "train" else "validation"


@dataclass(frozen=True)
class Metric:
    reduction: str          # sum | mean | max | min | last
    weight: str | None = None  # for mean: the key (or weight name) weighting each value


def _declare() -> dict[str, Metric]:
    out: dict[str, Metric] = {}
    for p in PREFIXES:
        ev = f"{p}/off_policy/evicted_samples"
        out[ev] = Metric("sum")
        out[f"{ev}_staleness/mean"] = Metric("mean", ev)
        out[f"{ev}_staleness/max"] = Metric("max")
        out[f"{ev}_staleness/min"] = Metric("min")
        out[f"{p}/filter_groups/evicted_samples"] = Metric("sum")
        out[f"{p}/filter_groups/discarded_surplus_samples"] = Metric("sum")
        out[f"{p}/rollout_failure/evicted_samples"] = Metric("sum")
        for name in ("trajectory_spans", "trajectory_staleness", "trajectory_staleness_worst"):
            out[f"{p}/off_policy/{name}/mean"] = Metric("mean", "n_trajectories")
            out[f"{p}/off_policy/{name}/max"] = Metric("max")
            out[f"{p}/off_policy/{name}/min"] = Metric("min")
        out[f"{p}/off_policy/token_staleness/mean"] = Metric("mean", "n_response_tokens")
        out[f"{p}/off_policy/token_staleness_exact/mean"] = Metric("mean", "n_span_tokens")
        out[f"{p}/off_policy/token_staleness_exact/max"] = Metric("max")
    out["global_steps"] = Metric("last")
    return out


METRICS: dict[str, Metric] = _declare()


class CallMetrics(dict):
    """The scalar eviction metrics of one call (a plain dict of SPEC §6.1 keys), carrying the
    `{value: count}` of its zero-variance evictions as ``reward_counts`` (not a scalar)."""

    def __init__(self, scalars: dict[str, float], reward_counts: dict[float, int]):
        super().__init__(scalars)
        self.reward_counts = dict(reward_counts)


@dataclass
class EvictionMetrics:
    """Eviction metrics of one sample call; polls add into it (counts are groups)."""

    stale_spans: list[int] = field(default_factory=list)
    filtered: int = 0
    failures: int = 0
    discarded: int = 0
    reward_counts: dict[float, int] = field(default_factory=dict)

    def add_stale(self, spans: list[int]) -> None:
        self.stale_spans.extend(spans)

    def add_filtered(self, values: list[float]) -> None:
        self.filtered += len(values)
        for v in values:
            self.reward_counts[v] = self.reward_counts.get(v, 0) + 1

    def scalars(self, prefix: str) -> dict[str, float]:
        """SPEC §6.1 keys; a key appears only when non-zero."""
        out: dict[str, float] = {}
        if self.stale_spans:
            s = self.stale_spans
            out[f"{prefix}/off_policy/evicted_samples"] = len(s)
            out[f"{prefix}/off_policy/evicted_samples_staleness/mean"] = float(np.mean(s))
            out[f"{prefix}/off_policy/evicted_samples_staleness/max"] = max(s)
            out[f"{prefix}/off_policy/evicted_samples_staleness/min"] = min(s)
        if self.filtered:
            out[f"{prefix}/filter_groups/evicted_samples"] = self.filtered
        if self.discarded:
            out[f"{prefix}/filter_groups/discarded_surplus_samples"] = self.discarded
        if self.failures:
            out[f"{prefix}/rollout_failure/evicted_samples"] = self.failures
        return out


def off_policy_metrics(batch: pa.Table, step: int, prefix: str = "training"
                       ) -> tuple[dict[str, float], dict[str, float]]:
    """SPEC §6.2 metrics over the non-padding rows, and the weights that merge their means.

    An all-padding (or empty) batch yields no metrics at all: never NaN, never a crash."""
    keep = pc.invert(batch.column("is_padding"))
    rows = batch.filter(keep)
    if rows.num_rows == 0:
        return {}, {}
    mn = rows.column("min_global_steps").to_numpy()
    mx = rows.column("max_global_steps").to_numpy()
    out: dict[str, float] = {}
    for name, v in (("trajectory_spans", mx - mn + 1),
                    ("trajectory_staleness", (step - 1) - mx),
                    ("trajectory_staleness_worst", (step - 1) - mn)):
        out[f"{prefix}/off_policy/{name}/mean"] = float(v.mean())
        out[f"{prefix}/off_policy/{name}/max"] = int(v.max())
        out[f"{prefix}/off_policy/{name}/min"] = int(v.min())
    weights = {"n_trajectories": float(rows.num_rows)}
    n_tok = pc.list_value_length(rows.column("response_ids")).to_numpy(zero_copy_only=False)
    if n_tok.sum() > 0:
        out[f"{prefix}/off_policy/token_staleness/mean"] = float(
            np.average((step - 1) - mx, weights=n_tok))
        weights["n_response_tokens"] = float(n_tok.sum())
    spans = rows.column("version_spans").combine_chunks()
    if spans.null_count < len(spans):
        flat = pc.list_flatten(spans)
        ver = flat.field("version").to_numpy()
        cnt = flat.field("n_tokens").to_numpy()
        if cnt.sum() > 0:
            stale = (step - 1) - ver
            out[f"{prefix}/off_policy/token_staleness_exact/mean"] = float(
                np.average(stale, weights=cnt))
            out[f"{prefix}/off_policy/token_staleness_exact/max"] = int(stale[cnt > 0].max())
            weights["n_span_tokens"] = float(cnt.sum())
    return out, weights


class StepAggregator:
    """Merges the metrics of several sample calls into one step, by declared reductions."""

    def __init__(self) -> None:
        self._vals: dict[str, list[tuple[float, float]]] = {}
        self.reward_counts: dict[float, int] = {}

    def add(self, metrics: dict[str, float], weights: dict[str, float] | None = None,
            reward_counts: dict[float, int] | None = None) -> None:
        weights = weights or {}
        for k, v in metrics.items():
            decl = METRICS.get(k)
            if decl is None:
                raise KeyError(f"metric {k!r} is not declared in pipeline.metrics.METRICS")
            w = 1.0
            if decl.reduction == "mean":
                w = float(metrics.get(decl.weight, weights.get(decl.weight, 0.0)))
            self._vals.setdefault(k, []).append((float(v), w))
        for value, count in (reward_counts or {}).items():
            self.reward_counts[value] = self.reward_counts.get(value, 0) + count

    def result(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for k, vals in self._vals.items():
            red = METRICS[k].reduction
            xs = [v for v, _ in vals]
            if red == "sum":
                out[k] = sum(xs)
            elif red == "mean":
                total = sum(w for _, w in vals)
                out[k] = sum(v * w for v, w in vals) / total if total else float(np.mean(xs))
            elif red == "max":
                out[k] = max(xs)
            elif red == "min":
                out[k] = min(xs)
            else:
                out[k] = xs[-1]
        return out
