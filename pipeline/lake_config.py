"""The configuration a lake was written with: recorded at first open, checked at every reopen.

`<lake>/_config.json` holds the library version and every setting of the buffer. Reopening a
lake with settings that would change how its recorded groups are classified or evicted (the
preset, the filter metric, the staleness threshold and strategy, the rules and their parameters)
is refused with a `LakeError` naming the differing keys: a restored buffer would otherwise decide
differently from the run it continues, and analysis would read the wrong threshold. Settings that
only shape refills or waiting (batch sizes, in-flight limit, `max_num_gen_batches`, the poll
interval) may change freely; a decision setting may change only when the caller names it in
``allow_changes``, and the lake then keeps every configuration with the seq from which it holds.
"""
from __future__ import annotations

import json
import os
from dataclasses import fields, is_dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from pipeline.config import BufferConfig
from pipeline.errors import LakeError
from pipeline.lake_files import replace_durably

FILE = "_config.json"
DECISION_KEYS = ("preset", "filter_groups_metric", "max_off_policy_threshold",
                 "max_off_policy_strategy", "rules")


def library_version() -> str:
    try:
        return metadata.version("replaylake")
    except metadata.PackageNotFoundError:   # run from a source tree that was never installed
        return "unknown"


def describe(cfg: BufferConfig) -> dict[str, Any]:
    """Every setting of ``cfg`` as plain JSON values (refill_fn by name only)."""
    refill = {"policy": type(cfg.refill).__name__}
    if is_dataclass(cfg.refill):
        refill.update({f.name: getattr(cfg.refill, f.name) for f in fields(cfg.refill)})
    return {
        "preset": cfg.preset,
        "filter_groups_metric": cfg.filter_metric,
        "max_off_policy_threshold": cfg.stale.threshold,
        "max_off_policy_strategy": cfg.stale.strategy,
        "rules": {u.name: dict(u.params) for u in cfg.rules},
        "refill": refill,
        "refill_fn": None if cfg.refill_fn is None else getattr(
            cfg.refill_fn, "__qualname__", type(cfg.refill_fn).__name__),
        "poll_interval": cfg.poll_interval,
        "empty_batch_is_error": cfg.empty_batch_is_error,
    }


def read(lake: str | os.PathLike) -> dict[str, Any] | None:
    """The lake's recorded configurations (``{"versions": [...]}``, newest last), or None."""
    path = Path(lake) / FILE
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise LakeError(f"{path} cannot be read ({exc}); it records the configuration the lake "
                        "was written with: restore it from a backup or remove it knowingly") from exc


def current(lake: str | os.PathLike) -> dict[str, Any] | None:
    """The configuration in force (the newest recorded one), or None for an unrecorded lake."""
    rec = read(lake)
    return rec["versions"][-1]["config"] if rec else None


def _write(lake: Path, record: dict[str, Any]) -> None:
    tmp = lake / f"{FILE}.tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=2, sort_keys=True)
    replace_durably(tmp, lake / FILE)


# rules whose parameters the threshold, strategy and filter metric already describe
_DERIVED_RULES = ("stale", "zero_variance")


def _comparable(cfg: dict[str, Any], key: str) -> Any:
    if key == "rules":
        return {k: v for k, v in (cfg.get(key) or {}).items() if k not in _DERIVED_RULES}
    return cfg.get(key)


def check_and_record(lake: str | os.PathLike, cfg: BufferConfig, next_seq: int,
                     allow_changes: tuple[str, ...] = ()) -> None:
    """Record ``cfg`` on a new lake; on a reopen refuse changed decision settings unless allowed.
    Call with the lake's writer lock held."""
    lake = Path(lake)
    unknown = sorted(set(allow_changes) - set(DECISION_KEYS))
    if unknown:
        raise LakeError(f"allow_changes={list(allow_changes)}: unknown key(s) {unknown}; "
                        f"decision settings are {list(DECISION_KEYS)}")
    new = describe(cfg)
    rec = read(lake)
    entry = {"from_seq": next_seq, "replaylake": library_version(), "config": new}
    if rec is None:
        _write(lake, {"versions": [entry]})
        return
    old = rec["versions"][-1]["config"]
    differ = [k for k in DECISION_KEYS if _comparable(old, k) != _comparable(new, k)]
    refused = [k for k in differ if k not in allow_changes]
    if refused:
        detail = "; ".join(f"{k}: lake {old.get(k)!r}, now {new.get(k)!r}" for k in refused)
        raise LakeError(
            f"the lake {lake} was written with other decision settings ({detail}). Reopen it with "
            "the recorded settings, or pass allow_changes=(" + ", ".join(repr(k) for k in refused)
            + ",) to continue the run with the new ones from now on")
    if old != new:
        _write(lake, {"versions": [*rec["versions"], entry]})
