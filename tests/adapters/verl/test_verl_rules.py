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
