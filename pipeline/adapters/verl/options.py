"""Constructor options of the verl adapter: verl's keywords, `sampler_kwargs`, and the core config.

verl's custom-sampler hook passes only the base keywords (mode, thresholds, `sampler_kwargs`,
`refill_fn`), so every other option may also arrive inside `sampler_kwargs` (an OmegaConf
`DictConfig` when it comes from verl's YAML), the opt-in rules too:
``sampler_kwargs={"rules": {"overlong": {"max_response_length": 12}}}``. A keyword given
explicitly (not at verl's default) wins; the same option given differently in both places is an
error rather than a silent pick.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.config import BufferConfig, StrategyError, ThresholdError, async_config, sync_config
from pipeline.errors import ConfigError

# verl 0.9.1's defaults for the keywords after the five required ones
VERL_DEFAULTS: dict[str, Any] = {
    "poll_interval": 2.0, "refill_fn": None, "filter_groups_metric": None,
    "train_batch_size": None, "gen_batch_size": None, "max_inflight_gen_batches": 1,
    "sync_refill_failed_groups": False,
}
# replaylake's additions: a lake, the DAPO refill bound, what to mirror, the opt-in rules (the
# `rules` mapping, and `max_response_length` as shorthand for its overlong entry)
EXTRA_DEFAULTS: dict[str, Any] = {"lake_dir": None, "max_num_gen_batches": 0, "mirror_fields": "auto",
                                  "max_response_length": None, "rules": None, "fsync": False,
                                  "mirror_max_lag": None, "reuse_siblings": False,
                                  "dataset_field": None}
SAMPLER_KWARGS = tuple(k for k in (*VERL_DEFAULTS, *EXTRA_DEFAULTS) if k != "refill_fn")
MIRROR_FIELDS = ("auto", "decisions", "rewards", "full")
STRATEGIES = ("drop", "wait", "admit")    # the core's, less 'mask' (see core_config)


class VerlThresholdError(ThresholdError, AssertionError):
    """Invalid max_off_policy_threshold: a ValueError for replaylake, an AssertionError for code
    written against verl (which checks it with `assert`)."""


class VerlStrategyError(StrategyError, AssertionError):
    """Invalid max_off_policy_strategy (a ValueError and an AssertionError, as the threshold's)."""


def plain(cfg: Any, name: str) -> dict[str, Any]:
    """A DictConfig / mapping / None as a plain dict (interpolations resolved)."""
    if cfg is None:
        return {}
    if type(cfg).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf
        out = OmegaConf.to_container(cfg, resolve=True)
        if isinstance(out, dict):
            return out
    if isinstance(cfg, Mapping):
        return dict(cfg)
    raise ConfigError(f"{name}={cfg!r} must be a mapping (dict or OmegaConf DictConfig)")


def merge(explicit: dict[str, Any], sampler_kwargs: Any) -> dict[str, Any]:
    """verl keywords + replaylake extras, filled from `sampler_kwargs` where not given."""
    given = plain(sampler_kwargs, "sampler_kwargs")
    unknown = sorted(set(given) - set(SAMPLER_KWARGS))
    if unknown:
        raise ConfigError(f"sampler_kwargs has unknown option(s) {unknown}; replaylake reads only "
                          f"{list(SAMPLER_KWARGS)}")
    defaults = {**VERL_DEFAULTS, **EXTRA_DEFAULTS}
    out = dict(explicit)
    for k, v in given.items():
        cur = out.get(k, defaults[k])
        if cur != defaults[k] and cur != v:
            raise ConfigError(f"{k} is given twice with different values: {cur!r} as a keyword "
                              f"and {v!r} in sampler_kwargs")
        out[k] = v
    for k, v in defaults.items():
        out.setdefault(k, v)
    return out


def mirror_mode(mode: str, lake_dir: Any) -> str:
    """The fields a partition mirror reads: `auto` is `rewards` with a lake and `decisions`
    without. No rule needs `full`: every mode knows each trajectory's response length (verl's
    agent loop tags it, `response_len`), which is all a rule comparing lengths reads."""
    if mode == "auto":
        return "rewards" if lake_dir is not None else "decisions"
    return mode


def check_dataset_field(value: Any) -> str | None:
    """``dataset_field``: None (the default: groups carry no dataset, as in verl), or the name of
    the prompt-key field that holds each prompt's dataset (verl writes ``data_source``)."""
    if value is None or (isinstance(value, str) and value):
        return value
    raise ConfigError(f"dataset_field={value!r}: give the name of the prompt field that names "
                      "each prompt's dataset (e.g. 'data_source', which verl writes), or None")


def flag(opts: dict[str, Any], name: str) -> Any:
    """A yes/no option as the core takes it: unset (None, as a YAML null reads) is False; any
    other value goes to the core as given, which refuses what is not a bool (``"no"`` would be
    true under ``bool()``), naming the option."""
    v = opts[name]
    return False if v is None else v


def core_config(preset: str, opts: dict[str, Any], threshold: Any, strategy: Any) -> BufferConfig:
    """The core's `sync_config` / `async_config`; threshold and strategy errors become verl's
    exception type too (ValueError and AssertionError, with verl's phrases)."""
    mode = opts["mirror_fields"]
    if mode not in MIRROR_FIELDS:
        raise ConfigError(f"mirror_fields={mode!r} must be one of {list(MIRROR_FIELDS)}")
    if strategy == "mask":
        # verl's trainer reads response_mask from the TransferQueue and has no loss mask, so a
        # masked group would be trained with its loss on: refused rather than silently unbounded
        raise VerlStrategyError(
            "max_off_policy_strategy='mask' is not a verl value: verl's trainer takes its loss "
            "mask from response_mask and never sees the buffer's is_stale rows, so the masked "
            "groups would be trained over the bound; use 'drop', 'wait' or 'admit' with the "
            "verl adapter, or ReplayBuffer.async_(max_off_policy_strategy='mask') with a loss "
            "that multiplies by batch.to_torch()['loss_mask']")
    make = sync_config if preset == "sync" else async_config
    try:
        return make(max_off_policy_threshold=threshold, max_off_policy_strategy=strategy,
                    filter_groups_metric=opts["filter_groups_metric"], refill_fn=opts["refill_fn"],
                    train_batch_size=opts["train_batch_size"], gen_batch_size=opts["gen_batch_size"],
                    max_inflight_gen_batches=opts["max_inflight_gen_batches"],
                    sync_refill_failed_groups=flag(opts, "sync_refill_failed_groups"),
                    max_num_gen_batches=opts["max_num_gen_batches"],
                    max_response_length=opts["max_response_length"],
                    rules=None if opts["rules"] is None else plain(opts["rules"], "rules"),
                    poll_interval=opts["poll_interval"])
    except ThresholdError as exc:
        raise VerlThresholdError(str(exc)) from None
    except StrategyError:
        raise VerlStrategyError(
            f"Invalid max off policy strategy: max_off_policy_strategy={strategy!r}; use one of "
            f"{', '.join(repr(s) for s in STRATEGIES)} with the verl adapter") from None
