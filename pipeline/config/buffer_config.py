"""Buffer configuration as frozen values, and the `sync` / `async` presets with verl's keywords.

A configuration switches rules on (sql/rules/, with the parameters they bind) and picks the
staleness settings and a refill policy. Opt-in rules come as data, ``rules={name: {param: value}}``
checked against each rule's declaration (pipeline/config/rule_knobs.py). Validation runs at
construction and names the parameter, the value and what to do, in this order: threshold,
strategy, a filter metric without refill_fn, sync_refill_failed_groups (a bool) without
refill_fn, refill_fn, poll_interval, the int knobs (max_num_gen_batches, then sync's batch sizes
or async's train_batch_size), the rules, then the starvation steps and the selection order.
Every int knob is an int that fits an int64 (what the lake and the rules store; a numpy integer
is taken as its int, a bool refused), every bool knob True or False. Presets map verl 0.9.1's
constructor keywords 1:1, so a verl config carries over unchanged.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pipeline.arguments import INT64_MAX, count_arg, flag_arg, seconds_arg
from pipeline.config import rule_knobs
from pipeline.config.partitions import is_validation, takes_partition
from pipeline.config.stale_bounds import StaleBounds, parse
from pipeline.decide import RuleUse
from pipeline.decide.policies import (
    Admit,
    DapoCredit,
    NoRefill,
    RefillFailedWhileShort,
    RefillPolicy,
    ReplaceEvicted,
    SelectionOrder,
    StaleMask,
    StalePolicy,
    Starvation,
    Unpaced,
    WaitGate,
)
from pipeline.decide.policies import selection_order as selection_order_of
from pipeline.decide.policies.stale import ADMIT, DROP, MASK, STRATEGIES, WAIT
from pipeline.errors import ConfigError

DEFAULT_THRESHOLD = 8
DEFAULT_POLL_INTERVAL = 2.0


class StrategyError(ConfigError):
    """max_off_policy_strategy is invalid (the verl adapter also makes this an AssertionError)."""


@dataclass(frozen=True)
class BufferConfig:
    """Everything a buffer decides with. Build it with `sync_config` / `async_config`.

    ``rules``: the eviction rules switched on, with their parameters; ``filter_metric``: the
    metric the group aggregates read (`reward`, a named reward metric, or None); ``order``: the
    declared selection order (None: oldest first)."""

    rules: tuple[RuleUse, ...] = ()
    stale: StalePolicy = field(default_factory=StalePolicy)
    filter_metric: str | None = None
    refill: RefillPolicy = field(default_factory=NoRefill)
    refill_fn: Callable[[int], Any] | None = None
    admission: Admit | Unpaced = field(default_factory=Unpaced)   # caps what refills ask
    starvation: Starvation = field(default_factory=Starvation)   # the starved-dataset signal
    train_batch_size: int | None = None   # groups trained per step (what admission counts)
    mask: StaleMask | None = None   # mask: stale chosen groups are marked, not evicted
    poll_interval: float = DEFAULT_POLL_INTERVAL
    empty_batch_is_error: bool = False   # sync: a batch without any trajectory raises
    preset: str = "custom"
    order: SelectionOrder | None = None
    # whether refill_fn takes a `partition` keyword: read from its signature once, here
    refill_takes_partition: bool = field(init=False, default=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "refill_takes_partition",
                           self.refill_fn is not None and takes_partition(self.refill_fn))

    @property
    def selection_order(self) -> str:
        """The name of the selection order (`oldest` unless one is declared)."""
        return "oldest" if self.order is None else self.order.name

    @property
    def aggregated_metric(self) -> str | None:
        """The metric the group aggregates read: the filter metric, or the reward sum when
        none is set and the selection order reads the metric (a spread needs values)."""
        return self.filter_metric if self.order is None else self.order.metric(self.filter_metric)

    def rules_for(self, partition: str) -> tuple[RuleUse, ...]:
        """The rules a poll of ``partition`` runs (none on a validation partition)."""
        return self.for_partition(partition).rules

    # --- one partition's configuration: a validation partition is a value, not a mode -------
    def for_partition(self, partition: str) -> BufferConfig:
        """What a call on ``partition`` decides with. A validation partition evaluates its model
        on every group it is given: no rule evicts there (so no staleness bound is checked), no
        refill is asked, no group is masked, and an empty batch is no error; the wait gate still
        applies (as verl)."""
        if not is_validation(partition):
            return self
        return replace(self, rules=(), refill=NoRefill(), mask=None, empty_batch_is_error=False)

    @property
    def gate(self) -> WaitGate | None:
        """The wait gate a sample must find open before it returns, or None."""
        return self.stale.gate()

    def bound(self) -> int | None:
        """The span no selected group may exceed: the threshold of the `stale` rule, if on; under
        per-dataset bounds the loosest of them (each group keeps its own, see `bound_of`)."""
        return None if self.uses("stale") is None else self.stale.bounds().loosest()

    def bound_of(self, dataset: str | None) -> int | None:
        """The span a group of ``dataset`` may not exceed when selected (None: unbounded)."""
        return None if self.uses("stale") is None else self.stale.bounds().of(dataset)

    def uses(self, name: str) -> RuleUse | None:
        return next((u for u in self.rules if u.name == name), None)


def _check_common(threshold: Any, strategy: Any, filter_groups_metric: Any, refill_fn: Any,
                  sync_refill_failed_groups: Any, poll_interval: Any) -> tuple[bool, float]:
    """The checks both presets run, in the documented order; returns sync_refill_failed_groups
    and poll_interval as python values (a numpy bool or number taken as its own)."""
    parse(threshold)
    if strategy not in STRATEGIES:
        raise StrategyError(
            f"Invalid max off policy strategy: max_off_policy_strategy={strategy!r}; "
            f"use one of {', '.join(repr(s) for s in STRATEGIES)}")
    if filter_groups_metric is not None and (not isinstance(filter_groups_metric, str)
                                             or not filter_groups_metric.strip()):
        raise ConfigError(
            f"filter_groups_metric={filter_groups_metric!r} must name the metric the "
            "zero-variance filter reads: 'reward' (the scalar reward) or the name of a "
            "reward_info metric such as 'acc' (None: no filter)")
    if filter_groups_metric is not None and refill_fn is None:
        raise ConfigError(
            f"filter_groups_metric={filter_groups_metric!r} requires refill_fn (filtered groups "
            "must be replaced by new prompts)")
    if flag_arg("sync_refill_failed_groups", sync_refill_failed_groups) and refill_fn is None:
        raise ConfigError("sync_refill_failed_groups=True requires refill_fn")
    if refill_fn is not None and not callable(refill_fn):
        raise ConfigError(f"refill_fn={refill_fn!r} must be callable as refill_fn(n): it asks the "
                          "rollout side for n more prompts")
    return (bool(sync_refill_failed_groups),
            seconds_arg("poll_interval", poll_interval, "(how often a waiting sample polls)"))


def _optional_count(name: str, value: Any, why: str) -> int | None:
    """None, or a positive int knob as a python int (see `count_arg`)."""
    return None if value is None else count_arg(name, value, why)


def _filter_rules(filter_groups_metric: str | None, max_response_length: int | None,
                  rules: rule_knobs.Knobs | None) -> tuple[RuleUse, ...]:
    """The filter rules: zero variance (DAPO), then the opt-in rules of the ``rules`` mapping
    (none is in verl), which ``max_response_length`` fills as shorthand for `overlong`."""
    out = (RuleUse("zero_variance"),) if filter_groups_metric is not None else ()
    max_response_length = _optional_count("max_response_length", max_response_length,
                                          "(or None: keep long groups)")
    return out + rule_knobs.rule_uses(
        rule_knobs.with_sugar(rules, max_response_length=max_response_length))


def sync_config(*, max_off_policy_threshold: int | None = DEFAULT_THRESHOLD,
                max_off_policy_strategy: str = DROP, filter_groups_metric: str | None = None,
                refill_fn: Callable[[int], Any] | None = None,
                train_batch_size: int | None = None, gen_batch_size: int | None = None,
                max_inflight_gen_batches: int = 1, sync_refill_failed_groups: bool = False,
                max_num_gen_batches: int = 0, max_response_length: int | None = None,
                poll_interval: float = DEFAULT_POLL_INTERVAL,
                rules: Mapping[str, Mapping[str, Any] | None] | None = None,
                starvation_steps: int | None = None,
                selection_order: str = "oldest") -> BufferConfig:
    """verl's `ReplayBuffer`: on-policy; staleness settings are validated but ignored. ``rules``
    switches opt-in rules on by name (``{"overlong": {"max_response_length": 12}}``).
    ``selection_order`` (not in verl): which candidates a sample takes first, `oldest` (verl's
    order), `spread_first` or `oldest_version` (pipeline/decide/policies/order.py)."""
    sync_refill_failed_groups, poll_interval = _check_common(
        max_off_policy_threshold, max_off_policy_strategy, filter_groups_metric, refill_fn,
        sync_refill_failed_groups, poll_interval)
    max_num_gen_batches = _max_num_gen_batches(max_num_gen_batches)
    # the DAPO refill counts with all three; without it they are checked when given
    dapo = filter_groups_metric is not None
    why = "when filter_groups_metric is set" if dapo else "(or None)"
    size = count_arg if dapo else _optional_count
    max_inflight_gen_batches = count_arg("max_inflight_gen_batches", max_inflight_gen_batches,
                                         why if dapo else "(prompt batches in flight at once)")
    train_batch_size = size("train_batch_size", train_batch_size, why)
    gen_batch_size = size("gen_batch_size", gen_batch_size, why)
    if sync_refill_failed_groups and gen_batch_size != 1:
        raise ConfigError(
            f"sync_refill_failed_groups=True requires gen_batch_size=1 (got {gen_batch_size!r}): "
            "failed prompts are replaced one by one")
    if filter_groups_metric is not None:
        refill: RefillPolicy = DapoCredit(train_batch_size, gen_batch_size, max_inflight_gen_batches,
                                 max_num_gen_batches)
    elif sync_refill_failed_groups:
        refill = RefillFailedWhileShort()
    else:
        refill = NoRefill()
    uses = _filter_rules(filter_groups_metric, max_response_length, rules)
    if sync_refill_failed_groups:
        uses += (RuleUse("failure", (("evict_all", False),)),)
    return BufferConfig(
        rules=uses, stale=StalePolicy(), filter_metric=filter_groups_metric,
        refill=refill, refill_fn=refill_fn, train_batch_size=train_batch_size,
        poll_interval=float(poll_interval), empty_batch_is_error=True, preset="sync",
        starvation=_starvation(starvation_steps), order=selection_order_of(selection_order))


def async_config(*, max_off_policy_threshold: int | None = DEFAULT_THRESHOLD,
                 max_off_policy_strategy: Literal["drop", "wait", "admit", "mask"] = "drop",
                 filter_groups_metric: str | None = None,
                 refill_fn: Callable[[int], Any] | None = None,
                 train_batch_size: int | None = None, gen_batch_size: int | None = None,
                 max_inflight_gen_batches: int = 1, sync_refill_failed_groups: bool = False,
                 max_num_gen_batches: int = 0, max_response_length: int | None = None,
                 poll_interval: float = DEFAULT_POLL_INTERVAL,
                 rules: Mapping[str, Mapping[str, Any] | None] | None = None,
                 starvation_steps: int | None = None,
                 selection_order: str = "oldest") -> BufferConfig:
    """verl's `ReplayBufferAsync`: bounded staleness, every failure evicted, refill k at once;
    ``rules`` and ``selection_order`` as for `sync_config`.

    gen_batch_size / max_inflight_gen_batches / sync_refill_failed_groups are sync-only knobs;
    they are accepted (verl's configs pass them; only sync_refill_failed_groups is checked, as
    a bool) and have no effect here.

    ``max_off_policy_strategy="admit"`` (not in verl) keeps the `stale` rule as a safety net and
    paces the buffer's own refills: an owed refill is asked only up to the dispatch capacity
    (`ReplayBuffer.dispatch_capacity`), the rest when places open; it needs
    ``train_batch_size`` (the groups trained per step) and a threshold.

    ``max_off_policy_strategy="mask"`` (not in verl) evicts nothing for staleness: a chosen group
    the `stale` rule would evict is trained with its loss switched off (``is_stale`` rows,
    `to_torch`'s ``loss_mask``), so the batch stays full and nothing is re-generated."""
    _, poll_interval = _check_common(max_off_policy_threshold, max_off_policy_strategy,
                                     filter_groups_metric, refill_fn, sync_refill_failed_groups,
                                     poll_interval)
    max_num_gen_batches = _max_num_gen_batches(max_num_gen_batches)
    train_batch_size = _optional_count("train_batch_size", train_batch_size,
                                       "(the groups trained per step), or None")
    bounds = parse(max_off_policy_threshold)
    if bounds.by_dataset and max_off_policy_strategy in (WAIT, MASK):
        why = ("the wait gate holds every sample on the oldest group in flight, whatever its "
               "dataset" if max_off_policy_strategy == WAIT else
               "the mask marks chosen groups by one bound")
        raise ConfigError(
            f"max_off_policy_threshold={bounds.given()!r} with max_off_policy_strategy="
            f"{max_off_policy_strategy!r}: per-dataset bounds apply to 'drop' and 'admit' (the "
            f"stale rule judges each group by its dataset); {why}: give one int bound, or use "
            "'drop'")
    admission = _admission(max_off_policy_strategy, bounds.tightest(), train_batch_size)
    stale = StalePolicy(bounds.default, max_off_policy_strategy, bounds.by_dataset)
    uses: tuple[RuleUse, ...] = ()
    if stale.bound() is not None:
        uses += (_stale_rule(bounds),)
    uses += _filter_rules(filter_groups_metric, max_response_length, rules)
    uses += (RuleUse("failure", (("evict_all", True),)),)
    return BufferConfig(
        rules=uses, stale=stale, filter_metric=filter_groups_metric,
        refill=ReplaceEvicted(max_num_gen_batches if filter_groups_metric else 0,
                              train_batch_size) if refill_fn is not None else NoRefill(),
        refill_fn=refill_fn, admission=admission, train_batch_size=train_batch_size,
        mask=stale.mask(), poll_interval=float(poll_interval), preset="async",
        starvation=_starvation(starvation_steps), order=selection_order_of(selection_order))


def _max_num_gen_batches(value: Any) -> int:
    return count_arg("max_num_gen_batches", value, "(0 = unbounded)", minimum=0)


def _starvation(steps: Any) -> Starvation:
    """``starvation_steps``: after this many consecutive steps with groups in flight and no
    trained row, a dataset is named in a warning and counted in `<prefix>/dataset/starved`."""
    return Starvation(_optional_count(
        "starvation_steps", steps, "(consecutive steps without a trained row that make a "
        "dataset starved), or None to switch the signal off"))


def _stale_rule(bounds: StaleBounds) -> RuleUse:
    """The `stale` rule with its bounds: the default as `threshold`, the tightest for the
    horizon, the per-dataset ones as the `stale_bounds` rows it joins."""
    return RuleUse("stale", (("threshold", bounds.default), ("tightest", bounds.tightest())),
                   tables=(("stale_bounds", bounds.by_dataset),))


def _admission(strategy: str, threshold: int | None, train_batch_size: Any) -> Admit | Unpaced:
    """The admission value of the async preset: `admit` paces refills to the dispatch capacity,
    which counts places per step, so it needs the batch a step trains and a bound."""
    if strategy != ADMIT:
        return Unpaced()
    train_batch_size = count_arg("train_batch_size", train_batch_size,
                                 "with max_off_policy_strategy='admit' (the groups trained per "
                                 "step: the dispatch capacity counts places per step)")
    if threshold is None:
        raise ConfigError("max_off_policy_strategy='admit' needs max_off_policy_threshold (a "
                          "positive int or a per-dataset mapping): the dispatch capacity is the "
                          "room left under that bound (under a mapping, the tightest one)")
    places(threshold, train_batch_size, "train_batch_size")
    return Admit(threshold, train_batch_size)


def places(threshold: int, batch_size: int, name: str = "batch_size") -> int:
    """T x B, the places a dispatch capacity counts, checked to fit an int64 (the capacity is
    computed as one: past it the count would wrap around)."""
    if threshold * batch_size > INT64_MAX:
        raise ConfigError(
            f"{name}={batch_size!r} with max_off_policy_threshold {threshold!r}: the dispatch "
            f"capacity counts threshold x {name} = {threshold * batch_size} places, more than an "
            "int64 holds (2**63 - 1); give a smaller bound or batch size")
    return threshold * batch_size
