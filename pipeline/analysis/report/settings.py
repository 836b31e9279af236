"""The recorded configuration as a reader of the report needs it: what was set, and what it means.

The lake records every setting as plain JSON (`pipeline.lake.config.describe`): a refill function
by its Python name, a rule by its parameters (`{}` for a rule without any), an unset value as
null. Shown as recorded, that reads `refill_fn run.<locals>.<lambda>`, `rules.zero_variance {}`
and `refill.train_batch_size –`; here each setting becomes one row of what the user chose and a
sentence saying what it does, with a rule's sentence taken from its own SQL file, so a new rule
explains itself here without an edit.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

NOT_SET = "not set"


@dataclass(frozen=True)
class Setting:
    """One row of the report's configuration table."""

    name: str
    value: str
    meaning: str


def _number(v: Any) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _preset(v: Any) -> str:
    return {"async": "verl's ReplayBufferAsync: bounded staleness, every failure evicted, "
                     "evicted groups replaced at once",
            "sync": "verl's ReplayBuffer: on-policy batches (DAPO refill when the filter is on)",
            }.get(v, "")


def _metric(v: Any) -> str:
    if v is None:
        return "the zero-variance (DAPO) filter is off"
    return f"a finished group whose {v} is the same for every trajectory is evicted"


def _threshold(v: Any, preset: Any) -> str:
    if preset == "sync":
        return "not used: the sync preset trains on-policy"
    if v is None:
        return "no staleness bound"
    if isinstance(v, dict):      # per-dataset bounds, "*" for every other dataset
        named = ", ".join(f"{k} {_number(b)}" for k, b in sorted(v.items()) if k != "*")
        return (f"a group may span at most its dataset's bound of trainer steps from dispatch "
                f"to training ({named}; any other {_number(v.get('*'))})")
    return f"a group may span at most {_number(v)} trainer steps from dispatch to training"


def _strategy(v: Any) -> str:
    return {"drop": "a group past the staleness bound is evicted",
            "wait": "a sample call waits for fresher groups instead of evicting"}.get(v, "")


def _refill_fn(v: Any) -> tuple[str, str]:
    if v is None:
        return NOT_SET, "evicted groups are not replaced"
    name = str(v)
    shown = "set (a function)" if "<" in name else f"set (the function {name})"
    return shown, "called with n to dispatch n new prompts in place of evicted groups"


def _first_sentence(text: str) -> str:
    head = re.split(r"(?<=[a-z0-9)])\.\s+(?=[A-Z])", text.strip(), maxsplit=1)[0]
    return head if head.endswith(".") else head + "."


def rule_meaning(name: str) -> str:
    """The first sentence of the rule's description in `sql/rules/<name>.sql` ('' when the
    lake names a rule this version no longer has)."""
    from sql import loader
    q = loader.catalog().get(name)
    return "" if q is None else _first_sentence(q.description).replace("`", "")


def _rules(rules: dict[str, Any]) -> list[Setting]:
    if not rules:
        return [Setting("rules", "none", "no eviction rule was on")]
    out = []
    for name in sorted(rules):
        params = rules[name]
        if params is None:
            continue
        given = ", ".join(f"{k} = {NOT_SET if v is None else _number(v)}"
                          for k, v in sorted((params or {}).items()))
        out.append(Setting(f"rules.{name}", "on" + (f" ({given})" if given else ""),
                           rule_meaning(name)))
    return out


# what each refill knob does; an unset one says what applies instead
_REFILL_FIELDS = {
    "max_num_gen_batches": lambda v: ("0 (unbounded)" if v == 0 else _number(v),
                                      "cap on prompts asked to replace filtered groups in one "
                                      "call, in units of train_batch_size"),
    "train_batch_size": lambda v: (NOT_SET if v is None else _number(v),
                                   "the call's batch size scales the cap" if v is None else
                                   "the batch size the refill cap and DAPO slots count in"),
    "gen_batch_size": lambda v: (NOT_SET if v is None else _number(v),
                                 "prompts are dispatched in multiples of it"),
    "max_inflight_gen_batches": lambda v: (NOT_SET if v is None else _number(v),
                                           "generation batches in flight at most (sync DAPO)"),
}


def _refill(refill: dict[str, Any]) -> list[Setting]:
    from pipeline.decide.policies import POLICIES, policy_name
    name = policy_name(refill.get("policy"))
    cls = POLICIES.get(name) if name is not None else None
    out = [Setting("refill", NOT_SET if name is None else name, getattr(cls, "about", ""))]
    for key in sorted(refill):
        if key in ("policy", "drains"):       # drains follows from the policy: nobody sets it
            continue
        v = refill[key]
        shown, meaning = _REFILL_FIELDS[key](v) if key in _REFILL_FIELDS else (
            NOT_SET if v is None else _number(v), "")
        out.append(Setting(f"refill.{key}", shown, meaning))
    return out


def settings(config: dict[str, Any]) -> list[Setting]:
    """The rows of the configuration table, in the order a reader asks: how the buffer decides
    (preset, filter, staleness, rules), then how it refills, then how it waits. A key this
    version does not know (a newer lake's) is shown as recorded."""
    rows = [
        Setting("preset", _number(config.get("preset", NOT_SET)), _preset(config.get("preset"))),
        Setting("filter_groups_metric", _opt(config.get("filter_groups_metric")),
                _metric(config.get("filter_groups_metric"))),
        Setting("max_off_policy_threshold", _opt(config.get("max_off_policy_threshold")),
                _threshold(config.get("max_off_policy_threshold"), config.get("preset"))),
    ]
    if config.get("max_off_policy_strategy") is not None:
        rows.append(Setting("max_off_policy_strategy", str(config["max_off_policy_strategy"]),
                            _strategy(config["max_off_policy_strategy"])))
    rows += _rules(config.get("rules") or {})
    if "selection_order" in config:
        rows.append(Setting("selection_order", str(config["selection_order"]),
                            _order(config["selection_order"])))
    rows += _refill(config.get("refill") or {})
    rows.append(Setting("refill_fn", *_refill_fn(config.get("refill_fn"))))
    if "poll_interval" in config:
        rows.append(Setting("poll_interval", f"{_number(config['poll_interval'])} s",
                            "how often a waiting sample call looks for new groups"))
    if "empty_batch_is_error" in config:
        rows.append(Setting("empty_batch_is_error", _number(config["empty_batch_is_error"]),
                            "a call that ends with no group raises" if config["empty_batch_is_error"]
                            else "a call that ends with no group returns an empty batch"))
    known = {"preset", "filter_groups_metric", "max_off_policy_threshold",
             "max_off_policy_strategy", "rules", "refill", "refill_fn", "poll_interval",
             "empty_batch_is_error", "selection_order"}
    rows += [Setting(k, _opt(config[k]), "") for k in sorted(config) if k not in known]
    return rows


def _order(name: Any) -> str:
    from pipeline.decide.policies import ORDERS
    meaning = ORDERS.get(name)
    return "" if meaning is None else f"a sample takes first the group with {meaning}"


def _opt(v: Any) -> str:
    return NOT_SET if v is None else _number(v)
