"""The verl adapter takes the `rules=` mapping as a keyword or inside `sampler_kwargs` (verl's
custom-sampler hook passes nothing else), checked as the core's presets check it."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from pipeline.adapters.verl import ReplayBuffer, ReplayBufferAsync, ReplaylakeSampler
from pipeline.errors import ConfigError

SHORT = {"short_response": {"min_response_length": 3}}


def _async(sampler_kwargs, **kw):
    return ReplayBufferAsync("colocate_async", {}, 4, "drop", sampler_kwargs, **kw)


def test_rules_from_the_yaml_s_sampler_kwargs_reach_the_core():
    buf = ReplaylakeSampler("separate_async", {}, 4, "drop", OmegaConf.create({"rules": SHORT}))
    assert dict(buf.core.config.uses("short_response").params) == {"min_response_length": 3}
    assert buf.rules == SHORT


@pytest.mark.parametrize("make", [ReplayBuffer, ReplayBufferAsync])
def test_the_keyword_and_sampler_kwargs_give_the_core_the_same_configuration(make):
    by_keyword = make("sync", {}, 4, "drop", None, rules=SHORT)
    in_kwargs = make("sync", {}, 4, "drop", {"rules": SHORT})
    assert by_keyword.core.config == in_kwargs.core.config
    assert by_keyword.core.config.uses("short_response") is not None


def test_max_response_length_fills_the_same_mapping():
    sugar = _async({"max_response_length": 7})
    mapping = _async({"rules": {"overlong": {"max_response_length": 7}}})
    assert sugar.core.config == mapping.core.config


def test_rules_given_differently_as_keyword_and_in_sampler_kwargs_are_an_error():
    with pytest.raises(ConfigError, match="rules is given twice with different values"):
        _async({"rules": SHORT}, rules={"short_response": {"min_response_length": 4}})


def test_a_mapping_that_disagrees_with_max_response_length_is_an_error():
    with pytest.raises(ConfigError, match="disagree"):
        _async({"max_response_length": 7, "rules": {"overlong": {"max_response_length": 8}}})


def test_an_unknown_rule_in_sampler_kwargs_names_the_closest():
    with pytest.raises(ConfigError, match="did you mean 'short_response'"):
        _async(OmegaConf.create({"rules": {"short_respons": {"min_response_length": 3}}}))


def test_rules_must_be_a_mapping():
    with pytest.raises(ConfigError, match="rules=.* must be a mapping"):
        _async({"rules": ["short_response"]})


# --- rules that compare response lengths, in every mirror mode --------------------------------
# verl's agent loop tags every trajectory with its response length (`response_len`), so no mode
# needs the token payload for it; a key whose tag lacks it has its `responses` field read.

@pytest.mark.verl
@pytest.mark.parametrize("lake", [False, True])
def test_auto_reads_no_tokens_for_a_rule_that_compares_lengths(tq, tmp_path, lake):
    buf = _async({"max_response_length": 7}, lake_dir=tmp_path / "lake" if lake else None)
    try:
        assert buf.core.config.uses("overlong") is not None
        assert buf._mirror("train").fields == ("rewards" if lake else "decisions")
    finally:
        buf.close()


@pytest.mark.verl
@pytest.mark.parametrize("fields", ["auto", "decisions", "rewards", "full"])
@pytest.mark.parametrize("tagged", [True, False])
def test_overlong_evicts_a_long_group_through_transferqueue_in_every_mode(tq, rollout, fields,
                                                                          tagged):
    """With `max_response_length=7`, a group whose responses average more than 7 tokens is
    evicted, one at exactly 7 is kept (`sum > 7 * n`): the lengths come from the `response_len`
    tags, or (``tagged=False``: a writer that leaves them out) from the `responses` fields."""
    from tests.adapters.verl._harness import G, uids_of
    buf = _async({"max_response_length": 7, "mirror_fields": fields})
    try:
        rollout.groups([G("long", 1, kw={"rlen": 8, "length_tag": tagged}),
                        G("edge", 1, kw={"rlen": 7, "length_tag": tagged})])
        meta, metrics = buf.sample(global_steps=1, partition_id="train", batch_size=1)
        assert sorted(uids_of(meta.keys)) == ["edge"]
        assert metrics["training/overlong/evicted_samples"] == 1
    finally:
        buf.close()
