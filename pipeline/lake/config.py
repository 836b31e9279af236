"""The configuration a lake was written with: recorded at first open, checked at every reopen.

`<lake>/_config.json` holds the library version and every setting of the buffer. Reopening a
lake with settings that would change how its recorded groups are classified, evicted or chosen
(the preset, the filter metric, the staleness threshold and strategy, the rules and their
parameters, the selection order) is refused with a `LakeError` naming the differing keys: a
restored buffer would otherwise decide differently from the run it continues, and analysis
would read the wrong threshold. Settings that only shape refills or waiting (batch sizes,
in-flight limit, `max_num_gen_batches`, the poll interval) may change freely; a decision setting
may change only when the caller names it in ``allow_changes``, and the lake then keeps every
configuration with the seq from which it holds.
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
from pipeline.lake.files import replace_durably
from pipeline.lake.identity import CONFIG_NAME, LAKE_FORMAT, recorded_format

FILE = CONFIG_NAME
DECISION_KEYS = ("preset", "filter_groups_metric", "max_off_policy_threshold",
                 "max_off_policy_strategy", "rules", "selection_order")
# what a record written before a key existed meant by it (then the behaviour had no choice)
_BEFORE_RECORDED = {"selection_order": "oldest"}


def library_version() -> str:
    try:
        return metadata.version("replaylake")
    except metadata.PackageNotFoundError:   # run from a source tree that was never installed
        return "unknown"


def describe(cfg: BufferConfig) -> dict[str, Any]:
    """Every setting of ``cfg`` as plain JSON values (refill_fn by name only)."""
    refill = {"policy": cfg.refill.name}      # the declared name, whatever the class is called
    if is_dataclass(cfg.refill):
        refill.update({f.name: getattr(cfg.refill, f.name) for f in fields(cfg.refill)})
    return {
        "preset": cfg.preset,
        "filter_groups_metric": cfg.filter_metric,
        "max_off_policy_threshold": cfg.stale.given(),
        "max_off_policy_strategy": cfg.stale.strategy,
        "rules": {u.name: dict(u.params) for u in cfg.rules},
        "selection_order": cfg.selection_order,
        "refill": refill,
        "refill_fn": None if cfg.refill_fn is None else getattr(
            cfg.refill_fn, "__qualname__", type(cfg.refill_fn).__name__),
        "poll_interval": cfg.poll_interval,
        "empty_batch_is_error": cfg.empty_batch_is_error,
    }


def read(lake: str | os.PathLike) -> dict[str, Any] | None:
    """The lake's recorded configurations (``{"versions": [...]}``, newest last), or None when
    the lake has no `_config.json` (one written before the lake recorded it). A file that does
    not parse, or parses to another shape, is refused: read as "nothing recorded" it would turn
    the reopen check off and be overwritten."""
    path = Path(lake) / FILE
    if not path.exists():
        return None
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise _unreadable(path, f"cannot be read ({exc})") from exc
    problem = _shape_problem(rec)
    if problem:
        raise _unreadable(path, f"is not a lake configuration record: {problem}")
    return rec


def _unreadable(path: Path, what: str) -> LakeError:
    return LakeError(f"{path} {what}; it records the configuration the lake was written with: "
                     "restore it from a backup or remove it knowingly")


def _shape_problem(rec: Any) -> str | None:
    """What is wrong with a parsed record (``{"versions": [{"from_seq": int, "config": {...}},
    ...]}``, at least one version), or None."""
    if not isinstance(rec, dict):
        return f"a JSON object with a \"versions\" list was expected, not {json.dumps(rec)[:40]}"
    versions = rec.get("versions")
    if not isinstance(versions, list) or not versions:
        return f"\"versions\" must be a non-empty list, not {json.dumps(versions)[:40]}"
    for i, v in enumerate(versions):
        if not isinstance(v, dict) or not isinstance(v.get("config"), dict):
            return f"versions[{i}] has no \"config\" object"
        rules = v["config"].get("rules")
        if rules is not None and not (isinstance(rules, dict)
                                      and all(isinstance(r, dict) for r in rules.values())):
            return f"versions[{i}].config.rules must map rule names to parameters"
        seq = v.get("from_seq")
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
            return f"versions[{i}].from_seq must be a seq number >= 0, not {json.dumps(seq)}"
    return None


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
    return cfg.get(key, _BEFORE_RECORDED.get(key))


def check_and_record(lake: str | os.PathLike, cfg: BufferConfig, next_seq: int,
                     allow_changes: tuple[str, ...] | str = ()) -> None:
    """Record ``cfg`` on a new lake; on a reopen refuse changed decision settings unless allowed.
    Call with the lake's writer lock held."""
    lake = Path(lake)
    if isinstance(allow_changes, str):    # one key named alone, not its letters
        allow_changes = (allow_changes,)
    unknown = sorted(set(allow_changes) - set(DECISION_KEYS))
    if unknown:
        raise LakeError(f"allow_changes={list(allow_changes)}: unknown key(s) {unknown}; "
                        f"decision settings are {list(DECISION_KEYS)}")
    new = describe(cfg)
    rec = read(lake)
    entry = {"from_seq": next_seq, "replaylake": library_version(), "config": new}
    if rec is None:
        _write(lake, {"format": LAKE_FORMAT, "versions": [entry]})
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
    if old != new or recorded_format(rec) < LAKE_FORMAT:   # (what this writer may write)
        _write(lake, {**rec, "format": LAKE_FORMAT,
                      "versions": [*rec["versions"], *([entry] if old != new else [])]})
