"""Constructor validation: which error, in which order, naming which parameter."""
from __future__ import annotations

import pytest

from pipeline import ConfigError, async_config, sync_config
from pipeline.config.buffer_config import StrategyError
from pipeline.config.stale_bounds import ThresholdError


def refill(n: int) -> None:
    return None


@pytest.mark.parametrize("make", [sync_config, async_config])
@pytest.mark.parametrize("bad", [0, -1, 2.5, "8", True])
def test_threshold_must_be_a_positive_int_or_none(make, bad):
    with pytest.raises(ThresholdError, match="Invalid max off policy threshold"):
        make(max_off_policy_threshold=bad)


@pytest.mark.parametrize("make", [sync_config, async_config])
def test_strategy_must_be_drop_or_wait(make):
    with pytest.raises(StrategyError, match="Invalid max off policy strategy"):
        make(max_off_policy_strategy="evict")


def test_threshold_is_checked_before_strategy_before_refill_fn():
    with pytest.raises(ThresholdError):
        async_config(max_off_policy_threshold=0, max_off_policy_strategy="x",
                     filter_groups_metric="acc")
    with pytest.raises(StrategyError):
        async_config(max_off_policy_strategy="x", filter_groups_metric="acc")


@pytest.mark.parametrize("make", [sync_config, async_config])
def test_filter_metric_requires_refill_fn(make):
    with pytest.raises(ConfigError, match="filter_groups_metric.*requires refill_fn"):
        make(filter_groups_metric="reward", train_batch_size=2, gen_batch_size=1)


@pytest.mark.parametrize("make", [sync_config, async_config])
def test_sync_refill_failed_groups_requires_refill_fn(make):
    with pytest.raises(ConfigError, match="sync_refill_failed_groups.*requires refill_fn"):
        make(sync_refill_failed_groups=True, gen_batch_size=1)


@pytest.mark.parametrize("kw,name", [
    ({"max_inflight_gen_batches": 0, "train_batch_size": 2, "gen_batch_size": 1},
     "max_inflight_gen_batches"),
    ({"train_batch_size": None, "gen_batch_size": 1}, "train_batch_size"),
    ({"train_batch_size": 2, "gen_batch_size": 0}, "gen_batch_size"),
    ({"train_batch_size": 2}, "gen_batch_size"),
])
def test_sync_dapo_needs_positive_batch_sizes_at_construction(kw, name):
    with pytest.raises(ConfigError, match=name):
        sync_config(filter_groups_metric="reward", refill_fn=refill, **kw)


def test_async_dapo_does_not_need_sync_batch_sizes():
    cfg = async_config(filter_groups_metric="reward", refill_fn=refill)
    assert cfg.filter_metric == "reward" and cfg.uses("zero_variance") is not None


def test_sync_refill_failed_groups_requires_gen_batch_size_one():
    with pytest.raises(ConfigError, match="requires gen_batch_size=1"):
        sync_config(sync_refill_failed_groups=True, refill_fn=refill, gen_batch_size=2)


def test_config_errors_are_value_errors_and_threshold_none_is_allowed():
    assert issubclass(ConfigError, ValueError)
    assert async_config(max_off_policy_threshold=None).stale.bound() is None


def test_presets_are_values_of_independent_policies():
    s = sync_config(filter_groups_metric="reward", refill_fn=refill, train_batch_size=4,
                    gen_batch_size=2, max_inflight_gen_batches=3)
    a = async_config(max_off_policy_threshold=4, max_off_policy_strategy="wait")
    assert (s.stale.strategy, s.uses("failure"), type(s.refill).__name__, s.refill.drains) == \
        (None, None, "DapoCredit", True)
    assert (a.stale.strategy, a.stale.threshold, dict(a.uses("failure").params),
            a.refill.drains) == ("wait", 4, {"evict_all": True}, False)
    assert a.uses("stale") is None       # `wait` never evicts for staleness


@pytest.mark.parametrize("make", [sync_config, async_config])
@pytest.mark.parametrize("bad", [3, "", "  ", ["acc"]])
def test_filter_metric_must_name_a_metric(make, bad):
    """Refused when the buffer is built, not at every later `put` with an Arrow type error."""
    with pytest.raises(ConfigError, match=r"filter_groups_metric=.* must name the metric"):
        make(filter_groups_metric=bad, refill_fn=refill, train_batch_size=2, gen_batch_size=1)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), True, "1"])
def test_poll_interval_must_be_a_finite_positive_number(bad):
    with pytest.raises(ConfigError, match="poll_interval=.* must be a positive number"):
        async_config(poll_interval=bad)
