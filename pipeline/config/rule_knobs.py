"""Rule knobs as data: the ``rules=`` mapping of a configuration, checked against the rule files.

A rule's parameters are declared once, in the ``-- params:`` header of its file in `sql/rules/`.
A configuration switches a rule on by naming it with a value for each parameter,
``rules={"overlong": {"max_response_length": 12}}``, and this module checks that mapping against
the declarations, so a new rule needs no code here: an unknown rule or parameter is an error
naming the closest one, a value of the wrong type names the declared type and what to pass. A
rule mapped to None is off, which lets a what-if switch off a rule the recorded run had on.

Three rules belong to preset keywords because those keywords shape more than an eviction (the
staleness gate, the metric the group aggregates read, the refill of failures); the mapping refuses
them, naming the keyword. Older keywords for an opt-in rule (``max_response_length=``) stay as
sugar that fills the same mapping; a keyword and a mapping entry that disagree are an error
rather than a silent pick.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from numbers import Integral
from typing import Any

from pipeline.arguments import int64, real
from pipeline.config.keywords import did_you_mean
from pipeline.decide import rules as registry
from pipeline.decide.rules import RuleUse
from pipeline.errors import ConfigError
from sql.loader import Param

# rules a preset keyword switches on (and what to set instead of naming them in `rules=`)
OWNED_BY_KEYWORD: dict[str, str] = {
    "stale": "max_off_policy_threshold (and max_off_policy_strategy)",
    "zero_variance": "filter_groups_metric",
    "failure": "the preset (async evicts every failure; sync: sync_refill_failed_groups=True)",
}
# keywords kept as sugar for one parameter of an opt-in rule: keyword -> (rule, parameter)
SUGAR: dict[str, tuple[str, str]] = {"max_response_length": ("overlong", "max_response_length")}

Knobs = Mapping[str, Mapping[str, Any] | None]

_WHAT = {"BIGINT": ("an int", "12"), "INTEGER": ("an int", "12"), "DOUBLE": ("a number", "0.5"),
         "VARCHAR": ("a str", "'text'"), "BOOLEAN": ("True or False", "True")}
# the integer types' ranges: an int beyond them is not one of them (it overflows every poll)
_BITS = {"BIGINT": 63, "INTEGER": 31}


def switchable_rules() -> list[str]:
    """The rules a ``rules=`` mapping may name: every declared eviction rule no keyword owns."""
    return [n for n in registry.reasons() if n not in OWNED_BY_KEYWORD]


def with_sugar(rules: Any, **keywords: Any) -> dict[str, dict[str, Any] | None]:
    """``rules`` as a plain dict, each sugar keyword given (not None) folded into its rule."""
    out = _plain(rules)
    for keyword, value in keywords.items():
        if value is None:
            continue
        rule, param = SUGAR[keyword]
        entry = out.get(rule, {})
        if entry is None or entry.get(param, value) != value:
            raise ConfigError(
                f"{keyword}={value!r} and rules={{{rule!r}: {entry!r}}} disagree; {keyword} is "
                f"shorthand for rules={{{rule!r}: {{{param!r}: {value!r}}}}}: give one of them")
        out[rule] = {**entry, param: value}
    return out


def rule_uses(rules: Knobs) -> tuple[RuleUse, ...]:
    """The rules ``rules`` switches on, each checked against its declaration, in name order (so
    two mappings that say the same give equal configurations)."""
    out = []
    for name in sorted(rules, key=str):
        rule = _switchable_rule(name)
        if rules[name] is not None:
            out.append(RuleUse(name, _params(rule, rules[name])))
    return tuple(out)


def opt_in_rules(rules: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The part of a lake's recorded rules that a ``rules=`` mapping sets (the owned rules are
    described by their keywords); what a what-if starts from."""
    return {k: dict(v) for k, v in (rules or {}).items() if k not in OWNED_BY_KEYWORD}


def rules_from_options(texts: Iterable[str]) -> dict[str, dict[str, Any] | None]:
    """A mapping from command-line items ``RULE.PARAM=VALUE`` (VALUE read as JSON, else as a
    string) or ``RULE=off``; the mapping is checked where it is used, as any other."""
    out: dict[str, dict[str, Any] | None] = {}
    for text in texts:
        key, eq, raw = text.partition("=")
        rule, dot, param = key.strip().partition(".")
        if not eq or not rule or (not dot and raw.strip() != "off") or (dot and not param):
            raise ConfigError(f"--rule {text!r}: write RULE.PARAM=VALUE (e.g. "
                              "overlong.max_response_length=12) or RULE=off")
        if not dot:
            out[rule] = None
            continue
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        entry = out.get(rule) or {}
        out[rule] = {**entry, param: value}
    return out


def _plain(rules: Any) -> dict[str, dict[str, Any] | None]:
    if rules is None:
        return {}
    if not isinstance(rules, Mapping):
        raise ConfigError(f"rules={rules!r} must map rule names to their parameters, e.g. "
                          "rules={'overlong': {'max_response_length': 12}}")
    out: dict[str, dict[str, Any] | None] = {}
    for name, params in rules.items():
        if params is not None and not isinstance(params, Mapping):
            raise ConfigError(f"rules[{name!r}]={params!r} must map the rule's parameters to "
                              "values (or be None: the rule is off)")
        out[name] = None if params is None else dict(params)
    return out


def _switchable_rule(name: Any) -> registry.Rule:
    if name in OWNED_BY_KEYWORD:
        raise ConfigError(f"rules={{{name!r}: ...}}: the {name} rule is switched on by "
                          f"{OWNED_BY_KEYWORD[name]}; set that instead")
    known = switchable_rules()
    if name not in known:
        if isinstance(name, str) and name in registry.registry():   # a check runs by itself
            raise ConfigError(f"rules={{{name!r}: ...}}: {name} is a check, not an eviction "
                              f"rule; rules you can switch on: {', '.join(known)}")
        raise ConfigError(f"rules={{{name!r}: ...}}: unknown rule {name!r}{did_you_mean(name, known)} "
                          f"(rules you can switch on: {', '.join(known)})")
    return registry.get(name)


def _params(rule: registry.Rule, given: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    declared = {p.name: p for p in rule.knobs}
    signature = ", ".join(str(p) for p in rule.knobs) or "no parameters"
    for k in given:
        if k == registry.STEP:
            raise ConfigError(f"rules[{rule.name!r}]: {k} is the step of each sample call, not a "
                              f"setting; the rule's parameters are: {signature}")
        if k not in declared:
            raise ConfigError(f"rules[{rule.name!r}]: unknown parameter {k!r}"
                              f"{did_you_mean(k, list(declared))} (the rule declares {signature})")
    missing = [p for p in rule.knobs if p.name not in given]
    if missing:
        raise ConfigError(f"rules[{rule.name!r}] lacks {', '.join(str(p) for p in missing)}; "
                          f"give every parameter the rule declares ({signature})")
    return tuple((p.name, _value(rule.name, p, given[p.name])) for p in rule.knobs)


def _python(p: Param, v: Any) -> Any:
    """``v`` as the python value its declared type takes (a numpy integer or float as its own),
    or None when it is none: an int out of the type's range is no BIGINT / INTEGER."""
    if p.type in _BITS:
        i = int64(v)
        return i if i is not None and -2**_BITS[p.type] <= i < 2**_BITS[p.type] else None
    return real(v) if p.type == "DOUBLE" else v


def _value(rule: str, p: Param, v: Any) -> Any:
    checked = _python(p, v)
    why = p.problem(checked)
    if why:
        what, example = _WHAT[p.type]
        if p.minimum is not None:    # the usual example, unless it is below the minimum
            what, example = f"{what} >= {p.minimum}", repr(max(p.minimum, float(example)) if
                                                           p.type == "DOUBLE" else
                                                           max(p.minimum, int(example)))
        too_big = checked is None and isinstance(v, Integral) and not isinstance(v, bool)
        raise ConfigError(f"rules[{rule!r}][{p.name!r}]={v!r}: the rule {rule} declares "
                          f"{p}; pass {what}, e.g. "
                          f"rules={{{rule!r}: {{{p.name!r}: {example}}}}}" +
                          (f" (a {p.type} lies within -2**{_BITS[p.type]} .. 2**{_BITS[p.type]} - 1)"
                           if too_big else ""))
    return checked
