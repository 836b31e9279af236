"""Rule knobs as data: `rules={name: {param: value}}` checked against the rule files' headers,
with the older keywords as sugar for the same mapping."""
from __future__ import annotations

import pytest

from pipeline import ConfigError, ReplayBuffer, async_config, sync_config
from pipeline.config import rules_from_options, switchable_rules
from pipeline.decide import rules as registry

MAPPING = {"overlong": {"max_response_length": 12}}


@pytest.mark.parametrize("make", [sync_config, async_config])
def test_the_mapping_gives_the_same_configuration_as_the_keyword(make):
    assert make(rules=MAPPING) == make(max_response_length=12)
    assert dict(make(rules=MAPPING).uses("overlong").params) == {"max_response_length": 12}


def test_the_presets_of_the_buffer_take_the_mapping():
    assert ReplayBuffer.async_(rules=MAPPING).config == async_config(max_response_length=12)
    assert ReplayBuffer.sync(rules=MAPPING).config == sync_config(max_response_length=12)


def test_keyword_and_mapping_that_agree_are_one_rule():
    cfg = async_config(max_response_length=12, rules=MAPPING)
    assert [u.name for u in cfg.rules].count("overlong") == 1
    assert cfg == async_config(max_response_length=12)


@pytest.mark.parametrize("mapping", [{"overlong": {"max_response_length": 13}},
                                     {"overlong": None}])
def test_keyword_and_mapping_that_disagree_are_an_error_naming_both(mapping):
    with pytest.raises(ConfigError, match=r"max_response_length=12 and rules=\{'overlong'.*"
                                          "disagree.*give one of them"):
        async_config(max_response_length=12, rules=mapping)


def test_a_rule_mapped_to_none_is_off():
    assert async_config(rules={"overlong": None}) == async_config()


def test_the_order_a_mapping_is_written_in_does_not_change_the_configuration():
    # two opt-in rules are needed to see an order; every switchable rule is turned on here
    knobs = {n: {p.name: True if p.type == "BOOLEAN" else 3 for p in registry.get(n).knobs}
             for n in switchable_rules()}
    backwards = dict(reversed(list(knobs.items())))
    assert async_config(rules=knobs) == async_config(rules=backwards)


def test_an_unknown_rule_names_the_closest_and_the_rules_to_choose_from():
    with pytest.raises(ConfigError, match=r"unknown rule 'overlog'; did you mean 'overlong'\? "
                                          r"\(rules you can switch on: .*overlong"):
        async_config(rules={"overlog": {"max_response_length": 12}})


def test_an_unknown_rule_with_nothing_close_lists_the_rules_to_choose_from():
    with pytest.raises(ConfigError, match=r"unknown rule 'zzz' \(rules you can switch on"):
        async_config(rules={"zzz": {}})


def test_an_unknown_parameter_names_the_closest_and_the_declaration():
    with pytest.raises(ConfigError, match=r"rules\['overlong'\]: unknown parameter "
                                          r"'max_respons_length'; did you mean "
                                          r"'max_response_length'\? \(the rule declares "
                                          r"max_response_length BIGINT >= 1\)"):
        async_config(rules={"overlong": {"max_respons_length": 12}})


@pytest.mark.parametrize("bad", ["12", 12.0, True, None, [12]])
def test_a_wrong_typed_value_names_rule_parameter_type_and_what_to_pass(bad):
    with pytest.raises(ConfigError) as err:
        async_config(rules={"overlong": {"max_response_length": bad}})
    assert str(err.value) == (
        f"rules['overlong']['max_response_length']={bad!r}: the rule overlong declares "
        "max_response_length BIGINT >= 1; pass an int >= 1, e.g. "
        "rules={'overlong': {'max_response_length': 12}}")


def test_a_missing_parameter_is_named_with_its_type():
    with pytest.raises(ConfigError, match=r"rules\['overlong'\] lacks max_response_length BIGINT >= 1"):
        async_config(rules={"overlong": {}})


def test_the_step_is_not_a_setting():
    with pytest.raises(ConfigError, match="step is the step of each sample call"):
        async_config(rules={"overlong": {"max_response_length": 12, "step": 3}})


@pytest.mark.parametrize(("rule", "keyword"), [
    ("stale", "max_off_policy_threshold"), ("zero_variance", "filter_groups_metric"),
    ("failure", "sync_refill_failed_groups")])
def test_a_rule_a_preset_keyword_owns_is_refused_naming_the_keyword(rule, keyword):
    with pytest.raises(ConfigError, match=f"the {rule} rule is switched on by .*{keyword}"):
        async_config(rules={rule: {}})


def test_a_check_is_not_a_rule_to_switch_on():
    with pytest.raises(ConfigError, match="missing_metric is a check, not an eviction rule"):
        async_config(rules={"missing_metric": {}})


@pytest.mark.parametrize("bad", [[("overlong", 12)], "overlong"])
def test_rules_must_be_a_mapping(bad):
    with pytest.raises(ConfigError, match="must map rule names to their parameters"):
        async_config(rules=bad)


def test_a_rule_s_parameters_must_be_a_mapping():
    with pytest.raises(ConfigError, match=r"rules\['overlong'\]=12 must map the rule's "
                                          "parameters to values"):
        async_config(rules={"overlong": 12})


@pytest.mark.parametrize("rule, param", [("overlong", "max_response_length"),
                                         ("short_response", "min_response_length")])
def test_a_knob_below_its_declared_minimum_is_refused(rule, param):
    """The rule file declares `BIGINT >= 1`: 0 and -5 are refused naming the parameter (a
    negative `max_response_length` would evict every group), 1 is taken."""
    for bad in (0, -5):
        with pytest.raises(ConfigError, match=rf"rules\['{rule}'\]\['{param}'\]={bad}: .* "
                                              rf"{param} BIGINT >= 1; pass an int >= 1"):
            async_config(rules={rule: {param: bad}})
    assert async_config(rules={rule: {param: 1}}).uses(rule).params == ((param, 1),)


def test_the_keyword_keeps_its_own_check_of_positive_lengths():
    with pytest.raises(ConfigError, match="max_response_length=0 must be a positive int"):
        async_config(max_response_length=0)


def test_every_declared_rule_no_keyword_owns_can_be_switched_on():
    owned = {"stale", "zero_variance", "failure"}
    assert set(switchable_rules()) == set(registry.reasons()) - owned
    assert "overlong" in switchable_rules()


def test_command_line_items_become_the_same_mapping():
    assert rules_from_options(["overlong.max_response_length=12"]) == MAPPING
    assert rules_from_options(["overlong=off"]) == {"overlong": None}
    # a value that is not JSON stays a string, and the mapping's check names its type
    with pytest.raises(ConfigError, match="declares max_response_length BIGINT"):
        async_config(rules=rules_from_options(["overlong.max_response_length=twelve"]))


@pytest.mark.parametrize("bad", ["overlong", "overlong.max_response_length", "overlong.=3",
                                 "=3", "overlong=on"])
def test_a_malformed_command_line_item_says_how_to_write_one(bad):
    with pytest.raises(ConfigError, match="write RULE.PARAM=VALUE"):
        rules_from_options([bad])
