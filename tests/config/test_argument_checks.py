"""Constructor knobs: ints that fit an int64, numpy scalars taken as python values, real bools,
and arguments of the wrong type refused with a ConfigError naming them (never a bare TypeError
or an OverflowError at the first sample)."""
from __future__ import annotations

import numpy as np
import pytest

from pipeline import ConfigError, ReplayBuffer, async_config, sync_config
from pipeline.config.stale_bounds import ThresholdError


def refill(n: int) -> None:
    return None


# --- ints beyond int64 are no BIGINT ---------------------------------------------------------

@pytest.mark.parametrize("make", [sync_config, async_config])
@pytest.mark.parametrize("bad", [2**63, 2**64, 2**70, {"math": 2**63, "*": 4}])
def test_a_threshold_beyond_int64_is_refused_at_construction(make, bad):
    with pytest.raises(ThresholdError, match=r"max_off_policy_threshold.*2\*\*63 - 1"):
        make(max_off_policy_threshold=bad)


def test_a_mask_threshold_beyond_int64_is_refused_before_any_sample():
    with pytest.raises(ThresholdError, match="max_off_policy_threshold=18446744073709551616"):
        ReplayBuffer.async_(max_off_policy_strategy="mask", max_off_policy_threshold=2**64)


def test_the_largest_int64_threshold_is_a_bound_every_sample_can_use():
    buf = ReplayBuffer.async_(max_off_policy_threshold=2**63 - 1)
    buf.register(partition="train", uids=["a"], global_steps=0, n=1)
    buf.put([{"partition": "train", "uid": "a", "session_id": 0, "min_global_steps": 0,
              "max_global_steps": 0, "reward": 1.0, "prompt_ids": [1], "response_ids": [2]}])
    buf.update_status(partition="train", uids=["a"], status="finished")
    assert buf.get_sampleable_count(2**62 - 1, "train") == 1
    assert buf.sample(2**62 - 1, "train", 1, timeout=5).uids == ["a"]


@pytest.mark.parametrize("bad", [2**63, 2**70, -2**70])
def test_a_rule_parameter_beyond_int64_is_refused_naming_it(bad):
    with pytest.raises(ConfigError, match=rf"rules\['overlong'\]\['max_response_length'\]={bad}: "
                                          r".*a BIGINT lies within"):
        async_config(rules={"overlong": {"max_response_length": bad}})


@pytest.mark.parametrize("kw,name", [
    ({"train_batch_size": 2**63}, "train_batch_size"),
    ({"max_num_gen_batches": 2**63}, "max_num_gen_batches"),
    ({"starvation_steps": 2**63}, "starvation_steps"),
    ({"max_response_length": 2**63}, "max_response_length"),
])
@pytest.mark.parametrize("make", [sync_config, async_config])
def test_int_knobs_beyond_int64_are_refused(make, kw, name):
    with pytest.raises(ConfigError, match=rf"{name}={2**63} must be .*2\*\*63 - 1"):
        make(**kw)


def test_max_live_bytes_beyond_int64_is_refused():
    with pytest.raises(ConfigError, match=rf"max_live_bytes={2**63} must be a positive int"):
        ReplayBuffer(max_live_bytes=2**63)


def test_admit_refuses_more_places_than_an_int64_counts():
    """threshold x train_batch_size beyond int64 would wrap the dispatch capacity to 0."""
    with pytest.raises(ConfigError, match="train_batch_size=1073741824 with "
                                          "max_off_policy_threshold 1099511627776"):
        async_config(max_off_policy_strategy="admit", max_off_policy_threshold=2**40,
                     train_batch_size=2**30)


@pytest.mark.parametrize("bad", [1e10, 1e12, 2**70])
def test_a_poll_interval_no_wait_can_take_is_refused(bad):
    """Past threading.TIMEOUT_MAX every waiting sample raised a bare OverflowError."""
    with pytest.raises(ConfigError, match=r"poll_interval=.* must be a positive number of seconds"):
        async_config(poll_interval=bad)


# --- numpy scalars are taken as the python values they hold ----------------------------------

def test_numpy_scalars_are_taken_where_python_numbers_are():
    cfg = async_config(max_off_policy_threshold=np.int64(4), train_batch_size=np.int32(8),
                       max_num_gen_batches=np.uint8(2), starvation_steps=np.int16(3),
                       poll_interval=np.float32(0.5), max_response_length=np.int64(12),
                       rules={"short_response": {"min_response_length": np.int64(2)}})
    assert cfg.stale.threshold == 4 and type(cfg.stale.threshold) is int
    assert cfg.train_batch_size == 8 and type(cfg.train_batch_size) is int
    assert cfg.starvation.steps == 3 and type(cfg.starvation.steps) is int
    assert cfg.poll_interval == 0.5 and type(cfg.poll_interval) is float
    params = {u.name: dict(u.params) for u in cfg.rules}
    assert params["overlong"] == {"max_response_length": 12}
    assert params["short_response"] == {"min_response_length": 2}
    assert type(params["overlong"]["max_response_length"]) is int
    assert type(params["short_response"]["min_response_length"]) is int
    bounds = async_config(max_off_policy_threshold={"math": np.int32(2), "*": np.int64(3)})
    assert bounds.stale.bounds().given() == {"math": 2, "*": 3}
    s = sync_config(filter_groups_metric="reward", refill_fn=refill, train_batch_size=np.int64(4),
                    gen_batch_size=np.uint8(2), max_inflight_gen_batches=np.int32(3))
    assert (s.refill.train_batch_size, s.refill.gen_batch_size) == (4, 2)


def test_numpy_scalars_are_recorded_in_the_lake_as_python_values(tmp_path):
    with ReplayBuffer.async_(lake=tmp_path / "lake", max_off_policy_threshold=np.int64(4),
                             train_batch_size=np.int64(2), max_live_bytes=np.int64(10**6),
                             refill_fn=refill) as buf:
        assert buf.max_live_bytes == 10**6 and type(buf.max_live_bytes) is int
    with ReplayBuffer.async_(lake=tmp_path / "lake", max_off_policy_threshold=4,
                             train_batch_size=2, refill_fn=refill):
        pass                               # the same settings: the reopen is no change


# --- every int knob is checked, in both presets ---------------------------------------------

@pytest.mark.parametrize("bad", [0, -1, True, 4.0, "4"])
def test_async_checks_train_batch_size_at_construction(bad):
    with pytest.raises(ConfigError, match=f"train_batch_size={bad!r} must be a positive int"):
        ReplayBuffer.async_(train_batch_size=bad, filter_groups_metric="reward", refill_fn=refill,
                            max_num_gen_batches=1)


@pytest.mark.parametrize("kw,name", [
    ({"max_inflight_gen_batches": 0}, "max_inflight_gen_batches"),
    ({"max_inflight_gen_batches": -1}, "max_inflight_gen_batches"),
    ({"max_inflight_gen_batches": 1.0}, "max_inflight_gen_batches"),
    ({"gen_batch_size": 0}, "gen_batch_size"),
    ({"gen_batch_size": True}, "gen_batch_size"),
    ({"train_batch_size": 0}, "train_batch_size"),
    ({"train_batch_size": -2}, "train_batch_size"),
])
def test_sync_checks_its_batch_knobs_without_the_filter_too(kw, name):
    with pytest.raises(ConfigError, match=f"{name}=.* must be a positive int"):
        ReplayBuffer.sync(refill_fn=refill, **kw)


def test_async_still_takes_the_sync_only_knobs_as_verl_does():
    cfg = async_config(sync_refill_failed_groups=True, refill_fn=refill,
                       max_inflight_gen_batches=0, gen_batch_size=0)
    assert cfg.preset == "async"


# --- bool knobs take bools ------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["yes", "no", 1, 0, None])
def test_sync_refill_failed_groups_must_be_a_bool(bad):
    with pytest.raises(ConfigError, match=f"sync_refill_failed_groups={bad!r} must be True or "
                                          "False"):
        sync_config(sync_refill_failed_groups=bad, refill_fn=refill, gen_batch_size=1)


def test_a_numpy_bool_is_a_bool():
    cfg = sync_config(sync_refill_failed_groups=np.True_, refill_fn=refill, gen_batch_size=1)
    assert cfg.uses("failure") is not None


@pytest.mark.parametrize("bad", ["no", "yes", 1, None])
def test_fsync_must_be_a_bool(tmp_path, bad):
    with pytest.raises(ConfigError, match=f"fsync={bad!r} must be True or False"):
        ReplayBuffer.async_(lake=tmp_path / "lake", fsync=bad)
    assert not (tmp_path / "lake").exists()       # refused before the lake was opened


# --- lake and allow_changes -------------------------------------------------------------------

@pytest.mark.parametrize("bad", [5, b"/tmp/replaylake-bytes-lake", "", 1.5, ["lake"]])
def test_lake_must_be_a_path(bad):
    with pytest.raises(ConfigError, match=r"lake=.* must be the lake's directory: a non-empty str "
                                          "or a pathlib.Path"):
        ReplayBuffer.async_(lake=bad)


def test_lake_takes_a_pathlib_path(tmp_path):
    with ReplayBuffer.async_(lake=tmp_path / "lake") as buf:
        assert buf.lake is not None


@pytest.mark.parametrize("bad", [None, 5, [1], ("max_off_policy_threshold", None)])
def test_allow_changes_of_the_wrong_type_is_refused_and_the_lake_stays_usable(tmp_path, bad):
    lake = tmp_path / "lake"
    ReplayBuffer.async_(lake=lake, max_off_policy_threshold=4).close()
    with pytest.raises(ConfigError, match="allow_changes=.* must name the decision settings"):
        ReplayBuffer.async_(lake=lake, max_off_policy_threshold=3, allow_changes=bad)
    # the refused reopen took no lock: the lake opens again, with the change allowed
    with ReplayBuffer.async_(lake=lake, max_off_policy_threshold=3,
                             allow_changes=["max_off_policy_threshold"]) as buf:
        assert buf.config.stale.threshold == 3
