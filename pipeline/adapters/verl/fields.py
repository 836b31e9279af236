"""Reading trajectory fields from TransferQueue robustly, and turning them into typed values.

TransferQueue 0.1.11 has two silent traps when several keys are read at once (see
found by running TransferQueue 0.1.11): a field absent on *some* requested keys yields an empty TensorDict
(not an error), and keys without any data yet (tags only) raise "Some fields are not ready". So a
read that comes back short is bisected until every key is classified as read, missing (the field
does not exist on it) or not ready (no data yet: read it again next poll). The normal case is one
`kv_batch_get` for all new keys of a poll.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

MISSING = object()    # the key has data, but not this field
NOT_READY = object()  # the key has no data in storage yet (tags only)


def read_fields(tq: Any, partition: str, keys: Sequence[str], fields: Sequence[str]
                ) -> dict[str, list[Any]]:
    """``{field: [value per key]}``; a value is a row (tensor / dict), MISSING or NOT_READY."""
    out: dict[str, list[Any]] = {f: [None] * len(keys) for f in fields}
    if not keys or not fields:
        return out
    _read_into(tq, partition, list(keys), list(fields), out, 0)
    return out


def _read_into(tq: Any, partition: str, keys: list[str], fields: list[str],
               out: dict[str, list[Any]], offset: int) -> None:
    try:
        td = tq.kv_batch_get(keys=keys, partition_id=partition, select_fields=fields)
    except ValueError as exc:   # "not ready" / "not found": some key has no data at all
        td, err = None, exc
    else:
        err = None
    if td is not None and int(td.batch_size[0]) == len(keys) and all(f in td.keys() for f in fields):
        for f in fields:
            out[f][offset:offset + len(keys)] = _rows(td.get(f))
        return
    if len(fields) > 1:          # read each field on its own: only the absent ones are MISSING
        for f in fields:
            _read_into(tq, partition, keys, [f], out, offset)
        return
    if len(keys) == 1:
        out[fields[0]][offset] = NOT_READY if err is not None else MISSING
        return
    mid = len(keys) // 2
    _read_into(tq, partition, keys[:mid], fields, out, offset)
    _read_into(tq, partition, keys[mid:], fields, out, offset + mid)


def _rows(value: Any) -> list[Any]:
    """Per-key rows of one TensorDict entry (jagged tensor, dense tensor or non-tensor stack).
    A stack of non-tensor values (`extra_fields`: one dict per key) is read item by item from
    its parts, which costs about half of what `td[field]` spends converting it to a list."""
    if hasattr(value, "unbind") and getattr(value, "is_nested", False):
        return list(value.unbind())
    parts = getattr(value, "tensordicts", None)
    if parts is not None and all(type(p).__name__ == "NonTensorData" for p in parts):
        return [p.data for p in parts]
    if hasattr(value, "tolist") and not hasattr(value, "dim"):
        return list(value.tolist())
    return list(value)


def reward_of(row: Any) -> float | None:
    """verl's reward of one trajectory: the float32 sum of its `rm_scores` row, as a float
    (summed by torch exactly as verl sums it, so equal rewards classify equally); a plain
    number written instead of a tensor is that number. Raises TypeError for anything else."""
    if row is MISSING or row is NOT_READY or row is None:
        return None
    if hasattr(row, "sum") and hasattr(row, "dim"):
        return float(row.sum().item())
    value = as_float(row) if not isinstance(row, (str, bytes)) else None
    if value is None:
        raise TypeError(f"rm_scores is {type(row).__name__} {row!r:.60}, not a tensor of "
                        "per-token scores or a number")
    return value


def extra_of(row: Any) -> dict[str, Any] | None:
    """The `extra_fields` dict of one trajectory (unwrapping tensordict's NonTensorData)."""
    if row is MISSING or row is NOT_READY or row is None:
        return None
    value = getattr(row, "data", row)
    return value if isinstance(value, dict) else None


def dataset_name(row: Any) -> str | None:
    """A prompt's dataset from its field value (a str, or tensordict's NonTensorData around
    one); None when the field is absent, not written yet, or not a non-empty str."""
    if row is MISSING or row is NOT_READY or row is None:
        return None
    value = getattr(row, "data", row)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value if isinstance(value, str) and value else None


def reward_info_of(extra: dict[str, Any] | None) -> list[tuple[str, float]] | None:
    """Named reward metrics (`extra_fields["reward_extra_info"]`) as floats: every entry Python's
    `float()` takes (numbers, numpy / torch scalars, numeric strings such as "1.0"), which is
    how verl reads the filter metric. Entries it refuses (lists, words) are left out here; when
    such an entry is the filter metric, `unreadable_metric` names it."""
    if extra is None:
        return None
    info = extra.get("reward_extra_info")
    if not isinstance(info, dict):
        return None
    out = []
    for name, v in info.items():
        f = v if type(v) is float else as_float(v)
        if f is not None:
            out.append((str(name), f))
    return out


def as_float(v: Any) -> float | None:
    """``float(v)`` as verl computes it, or None where float() refuses the value."""
    if isinstance(v, (list, tuple, dict, set)):
        return None              # float() refuses them; skip the exception
    try:
        return float(v)
    except (TypeError, ValueError, OverflowError, RuntimeError):
        return None


def unreadable_metric(extra: dict[str, Any] | None, metric: str) -> tuple[bool, Any]:
    """(True, value) when the trajectory's `reward_extra_info` holds ``metric`` as a value
    `float()` refuses (a list, a word); (False, None) when it is absent or readable."""
    info = extra.get("reward_extra_info") if extra is not None else None
    if not isinstance(info, dict) or metric not in info:
        return False, None
    v = info[metric]
    return (as_float(v) is None), v


def versions_of(tag: dict[str, Any], extra: dict[str, Any] | None, dispatch_step: int
                ) -> tuple[int, int, bool]:
    """(min, max, inferred): the trajectory tag first (verl's trainer reads its off-policy metrics
    from there), then `extra_fields` min/max, then `extra_fields["global_steps"]` (the serving
    weight version), else dispatch step - 1 (clamped at 0) marked as inferred."""
    lo, hi = tag.get("min_global_steps"), tag.get("max_global_steps")
    if _is_int(lo) and _is_int(hi):
        return int(lo), int(hi), False
    if extra is not None:
        lo, hi = extra.get("min_global_steps"), extra.get("max_global_steps")
        if _is_int(lo) and _is_int(hi):
            return int(lo), int(hi), False
        v = extra.get("global_steps")
        if _is_int(v):
            return int(v), int(v), False
    v = max(int(dispatch_step) - 1, 0)
    return v, v, True


def response_length(value: Any) -> int | None:
    """A trajectory's response length from its `response_len` tag (an int >= 0, as verl's agent
    loop writes it) or from its `responses` field read instead (a tensor row: its element count);
    None when neither says (a tag of another kind, a field the key lacks)."""
    if type(value) is int:       # the usual tag value
        return value if value >= 0 else None
    if hasattr(value, "numel"):
        return int(value.numel())
    if _is_int(value) and int(value) >= 0:
        return int(value)
    return None


def has_tag_versions(tag: dict[str, Any]) -> bool:
    return _is_int(tag.get("min_global_steps")) and _is_int(tag.get("max_global_steps"))


def _is_int(v: Any) -> bool:
    if type(v) is int:           # the usual tag value: no isinstance chain
        return True
    if isinstance(v, bool) or v is None:
        return False
    if isinstance(v, (int, np.integer)):
        return True
    return isinstance(v, float) and v.is_integer() and math.isfinite(v)


def token_lists(rows: list[Any], dtype: pa.DataType, null_as_empty: bool = False) -> pa.Array:
    """A list<dtype> column from per-key tensor rows; a MISSING / NOT_READY row becomes null (or
    an empty list with ``null_as_empty``, for the core's required token columns)."""
    values, offsets, valid = [], [0], []
    for r in rows:
        ok = not (r is MISSING or r is NOT_READY or r is None)
        flat = r.reshape(-1).cpu().numpy() if ok else np.zeros(0)
        values.append(flat)
        offsets.append(offsets[-1] + flat.size)
        valid.append(ok or null_as_empty)
    flat = np.concatenate(values) if values else np.zeros(0)
    mask = None if all(valid) else pa.array([not v for v in valid])
    return pa.ListArray.from_arrays(pa.array(np.asarray(offsets, dtype=np.int32)),
                                    pa.array(flat).cast(dtype), mask=mask)
