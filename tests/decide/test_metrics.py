"""Metric declarations, merging across polls and calls, and the off-policy batch metrics."""
from __future__ import annotations

import polars as pl
import pyarrow as pa
import pytest

from pipeline import METRICS, StepAggregator
from pipeline.decide.evaluate import Eviction
from pipeline.decide.metrics import (
    OFF_POLICY_KEYS,
    EvictionMetrics,
    Metric,
    declared_weights,
    off_policy_metrics,
)
from sql import loader
from sql.loader import SqlError, load

P = "training/off_policy"


def _poll(reason, spans, values=None):
    """One poll's eviction of len(spans) groups for ``reason`` (what decide.evaluate returns)."""
    n = len(spans)
    return Eviction(uids=[f"g{i}" for i in range(n)], reasons={reason: [True] * n},
                    group_spans=list(spans), credits=[0] * n,
                    values={reason: list(values)} if values is not None else {})


def test_eviction_metrics_of_two_polls_merge_to_count_weighted_mean():
    m = EvictionMetrics()
    m.add(_poll("stale", [10]))
    m.add(_poll("stale", [1, 2, 3]))
    out = m.scalars("training")
    assert out[f"{P}/evicted_samples"] == 4
    assert out[f"{P}/evicted_samples_staleness/mean"] == 4.0
    assert (out[f"{P}/evicted_samples_staleness/max"], out[f"{P}/evicted_samples_staleness/min"]) \
        == (10, 1)


def test_eviction_keys_appear_only_when_non_zero():
    assert EvictionMetrics().scalars("training") == {}
    m = EvictionMetrics()
    m.add(_poll("zero_variance", [1, 1, 1], values=[0.0, 0.0, 1.0]))
    assert m.scalars("validation") == {"validation/filter_groups/evicted_samples": 3}
    assert m.reward_counts == {0.0: 2, 1.0: 1}


def test_step_aggregator_uses_declared_reductions_and_weights():
    agg = StepAggregator()
    agg.add({f"{P}/evicted_samples": 1, f"{P}/evicted_samples_staleness/mean": 10.0,
             f"{P}/evicted_samples_staleness/max": 10, f"{P}/evicted_samples_staleness/min": 10},
            reward_counts={0.0: 1})
    agg.add({f"{P}/evicted_samples": 3, f"{P}/evicted_samples_staleness/mean": 2.0,
             f"{P}/evicted_samples_staleness/max": 3, f"{P}/evicted_samples_staleness/min": 1,
             "global_steps": 7}, reward_counts={0.0: 2, 1.0: 1})
    out = agg.result()
    assert out[f"{P}/evicted_samples"] == 4
    assert out[f"{P}/evicted_samples_staleness/mean"] == 4.0
    assert out[f"{P}/evicted_samples_staleness/max"] == 10
    assert out[f"{P}/evicted_samples_staleness/min"] == 1
    assert out["global_steps"] == 7
    assert agg.reward_counts == {0.0: 3, 1.0: 1}
    # merged counts and extremes keep the types a single call reports (a count stays an int);
    # the max of the spans is declared a float, as one call reports it
    types = {k: type(v) for k, v in out.items()}
    assert types[f"{P}/evicted_samples"] is int and types["global_steps"] is int
    assert types[f"{P}/evicted_samples_staleness/mean"] is float
    assert types[f"{P}/evicted_samples_staleness/max"] is float


def test_step_aggregator_refuses_undeclared_keys():
    with pytest.raises(KeyError, match="not declared"):
        StepAggregator().add({"training/something_new/mean": 1.0})


def test_every_declared_mean_names_its_weight():
    for name, decl in METRICS.items():
        assert decl.reduction in ("sum", "mean", "max", "min", "last"), name
        assert (decl.weight is not None) == (decl.reduction == "mean"), name


def _batch(rows):
    base = {"is_padding": False, "response_ids": [1, 2], "version_spans": None}
    rows = [{**base, **r} for r in rows]
    return pa.table({
        "min_global_steps": pa.array([r["min_global_steps"] for r in rows], pa.int64()),
        "max_global_steps": pa.array([r["max_global_steps"] for r in rows], pa.int64()),
        "is_padding": pa.array([r["is_padding"] for r in rows]),
        "response_ids": pa.array([r["response_ids"] for r in rows], pa.list_(pa.int32())),
        "version_spans": pa.array([r["version_spans"] for r in rows], pa.list_(pa.struct(
            [("version", pa.int64()), ("n_tokens", pa.int32())]))),
    })


def test_off_policy_metrics_follow_the_spec_formulas_over_non_padding_rows():
    t = _batch([{"min_global_steps": 3, "max_global_steps": 4},
                {"min_global_steps": 1, "max_global_steps": 4, "response_ids": [1] * 6},
                {"min_global_steps": 0, "max_global_steps": 0, "is_padding": True}])
    m, w = off_policy_metrics(t, step=6)
    assert m[f"{P}/trajectory_spans/mean"] == 3.0 and m[f"{P}/trajectory_spans/max"] == 4
    assert m[f"{P}/trajectory_staleness/mean"] == 1.0          # (6-1) - 4
    assert m[f"{P}/trajectory_staleness_worst/max"] == 4         # (6-1) - 1
    assert m[f"{P}/trajectory_staleness_worst/min"] == 2
    assert m[f"{P}/token_staleness/mean"] == 1.0
    assert w["n_trajectories"] == 2 and w["n_response_tokens"] == 8
    assert f"{P}/token_staleness_exact/mean" not in m


def test_exact_token_staleness_uses_per_token_version_spans():
    t = _batch([{"min_global_steps": 2, "max_global_steps": 4, "response_ids": [1] * 4,
                 "version_spans": [{"version": 2, "n_tokens": 1}, {"version": 4, "n_tokens": 3}]}])
    m, w = off_policy_metrics(t, step=5)
    assert m[f"{P}/token_staleness_exact/mean"] == (2 * 1 + 0 * 3) / 4
    assert m[f"{P}/token_staleness_exact/max"] == 2
    assert w["n_span_tokens"] == 4


def test_all_padding_batch_emits_no_off_policy_metrics():
    t = _batch([{"min_global_steps": 0, "max_global_steps": 0, "is_padding": True}])
    assert off_policy_metrics(t, step=3) == ({}, {})


_SPANS = [{"version": 2, "n_tokens": 1}, {"version": 4, "n_tokens": 1}]


@pytest.mark.parametrize("spans", [
    [None, None, None],                 # no row reported spans: the exact aggregates are NULL
    [_SPANS, None, None],               # one did: every aggregate is evaluated
    [None, None, _SPANS],               # only the padding row did: null over the kept rows
], ids=["none", "one", "padding-only"])
def test_aggregates_over_null_inputs_agree_with_the_lake(spans):
    """Rows whose version spans are all or partly NULL (none reported, one row, only the padding
    row): the metrics the buffer computes equal what DuckDB's off_policy.sql gives over the
    same provenance rows."""
    import duckdb

    from pipeline.decide.batch import batch_rows
    from pipeline.decide.metrics import off_policy_metrics
    t = _batch([{"min_global_steps": 3, "max_global_steps": 4, "version_spans": spans[0]},
                {"min_global_steps": 1, "max_global_steps": 4, "response_ids": [1] * 6,
                 "version_spans": spans[1]},
                {"min_global_steps": 0, "max_global_steps": 0, "is_padding": True,
                 "version_spans": spans[2]}])
    t = t.append_column("uid", pa.array(["a", "a", "b"])).append_column(
        "partition", pa.array(["p"] * 3)).append_column("seq", pa.array([1, 2, 3]))
    rows = batch_rows(t, batch_id=1, step=6, group_steps={"a": 5, "b": 5})
    live, _ = off_policy_metrics(rows, prefix="training")
    con = duckdb.connect()
    con.register("provenance", rows.frame().with_columns(
        pl.col(pl.Int128).cast(pl.Decimal(38, 0))).to_arrow())
    (row,) = loader.run(con, "off_policy").to_pylist()
    for key, m in OFF_POLICY_KEYS.items():
        want = row[m.column]
        got = live.get(f"training/{key}")
        assert (got is None) == (want is None), key
        if want is not None:
            assert got == pytest.approx(float(want)), key
    assert live, "the metrics of two trained rows"


# --- each mean's weight is declared beside its metric (off_policy.sql's `weights` header) -------

# The reductions and weights the off-policy keys had before the weights were declared: reading
# the header must change none of them.
OFF_POLICY_DECLARED = {
    "trajectory_spans/mean": "n_trajectories", "trajectory_staleness/mean": "n_trajectories",
    "trajectory_staleness_worst/mean": "n_trajectories", "token_staleness/mean": "n_response_tokens",
    "token_staleness_exact/mean": "n_span_tokens",
    **{f"{name}/{stat}": None for name in ("trajectory_spans", "trajectory_staleness",
                                           "trajectory_staleness_worst") for stat in ("max", "min")},
    "token_staleness_exact/max": None,
}


def test_every_off_policy_metric_has_the_weight_its_header_declares():
    q = load("off_policy")
    weights = declared_weights(q)
    names = {c.rpartition("_")[0] for c in q.columns if c.rsplit("_", 1)[-1] in ("mean", "max", "min")}
    assert set(weights) == names
    for prefix in ("training", "validation"):
        got = {k[len(f"{prefix}/off_policy/"):]: (m.reduction, m.weight) for k, m in METRICS.items()
               if k.startswith(f"{prefix}/off_policy/") and not k.startswith(
                   (f"{prefix}/off_policy/evicted", f"{prefix}/off_policy/masked"))}
        assert got == {k: (k.rpartition("/")[2], w) for k, w in OFF_POLICY_DECLARED.items()}
        # mask's count is no aggregate of off_policy.sql: a sum of rows, like an eviction count
        assert METRICS[f"{prefix}/off_policy/masked_samples"] == Metric("sum", type=int)
        for key, weight in OFF_POLICY_DECLARED.items():
            if weight is not None:
                assert weights[key.rpartition("/")[0]] == weight


def _metrics_file(tmp_path, weights: str):
    """A metrics declaration with two metrics (span, tok) and two count columns."""
    header = "-- name: m\n-- description: d\n-- params: none\n"
    if weights:
        header += f"-- weights: {weights}\n"
    (tmp_path / "m.sql").write_text(
        header + "-- reads: provenance\n-- returns: n_rows, n_tokens, span_mean, span_max, "
        "tok_mean\nselect count(*) as n_rows, sum(n) as n_tokens, avg(s) as span_mean, "
        "max(s) as span_max, avg(t) as tok_mean from provenance\n")
    return load("m", tmp_path)


def test_declared_weights_are_read_from_the_header_not_guessed_from_the_names(tmp_path):
    q = _metrics_file(tmp_path, "span by n_tokens, tok by n_rows")
    assert declared_weights(q) == {"span": "n_tokens", "tok": "n_rows"}


@pytest.mark.parametrize(("weights", "message"), [
    ("", "without a declared weight: span, tok"),
    ("span by n_rows", "without a declared weight: tok"),
    ("span by n_rows, tok by n_rows, other by n_rows", "does not return: other"),
    ("span by n_rows, tok by n_lines", "n_lines are not count columns"),
    ("span by n_rows, tok by span_mean", "span_mean are not count columns"),
    ("span n_rows, tok by n_rows", "write `<metric> by <column>`"),
    ("span by n_rows, span by n_tokens, tok by n_rows", "twice"),
])
def test_a_metric_without_a_sound_weight_is_an_error_at_declaration(tmp_path, weights, message):
    with pytest.raises(SqlError, match=message):
        declared_weights(_metrics_file(tmp_path, weights))
