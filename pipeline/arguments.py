"""Checks of the public API's arguments: each names the call, the argument and what to pass."""
from __future__ import annotations

import numbers
import operator
import threading
from collections.abc import Iterable, Mapping, Set
from typing import Any

import numpy as np

from pipeline.errors import ConfigError
from pipeline.ingest import STEP_LIMIT, STEP_RULE, check_partition


def partition_arg(partition: str | None, partition_id: str | None, where: str,
                  check: bool = True) -> str:
    """`partition` everywhere; verl's `partition_id` is accepted as an alias. ``check=False``
    leaves the id's own check to the call's row validation (which names the row)."""
    if partition is not None and partition_id is not None and partition != partition_id:
        raise ConfigError(f"{where}: partition={partition!r} and partition_id={partition_id!r} "
                          "disagree; pass one of them")
    p = partition if partition is not None else partition_id
    if p is None:
        raise ConfigError(f"{where}: which partition? pass partition='train' (or another id)")
    return check_partition(p) if check else p


INT64_MAX = 2**63 - 1
"""The largest BIGINT: every count, size, step and bound is stored (and computed) as an int64."""
_INT64 = "2**63 - 1"


def _integer(value: Any) -> int | None:
    """``value`` as a python int when it is an integer (a numpy integer too; bool refused)."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def int64(value: Any) -> int | None:
    """``value`` as a python int when it is an integer that fits a BIGINT (int64), a numpy
    integer too; None otherwise (bool refused: True is no count)."""
    i = _integer(value)
    return i if i is not None and -INT64_MAX - 1 <= i <= INT64_MAX else None


def real(value: Any) -> float | None:
    """``value`` as a python float when it is a real number (an int, a float, a numpy integer or
    floating scalar); None otherwise (bool, str, None; an int too large for a float). NaN stays
    NaN: the caller says whether it takes one."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        return float(value)
    except (OverflowError, TypeError, ValueError):
        return None


def count_arg(name: str, value: Any, why: str = "", *, minimum: int = 1, where: str = "") -> int:
    """An int knob: an int >= ``minimum`` that fits an int64 (a numpy integer is taken as its
    int; bool refused), else a ConfigError naming ``name`` (and the call ``where``), the value,
    what to pass and ``why``."""
    n = int64(value)
    if n is not None and n >= minimum:
        return n
    what = "a positive int" if minimum == 1 else f"an int >= {minimum}"
    if _integer(value) is not None and n is None:     # an int, but no int64
        what = f"{what} no larger than {_INT64} (an int64, as the lake stores it)"
    call = f"{where}: " if where else ""
    raise ConfigError(f"{call}{name}={value!r} must be {what}{f' {why}' if why else ''}")


def flag_arg(name: str, value: Any, where: str = "") -> bool:
    """A bool knob: True or False (a numpy bool too); anything else (1, "yes", "no", None) is
    refused rather than read by its truth value ("no" is true)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    call = f"{where}: " if where else ""
    raise ConfigError(f"{call}{name}={value!r} must be True or False")


def seconds_arg(name: str, value: Any, why: str = "") -> float:
    """A positive, finite number of seconds that a wait can take (at most threading.TIMEOUT_MAX,
    about 292 years); a numpy number is taken as its float, bool refused."""
    s = real(value)
    if s is not None and 0 < s <= threading.TIMEOUT_MAX:
        return s
    raise ConfigError(f"{name}={value!r} must be a positive number of seconds, at most "
                      f"{threading.TIMEOUT_MAX:.0f}{f' {why}' if why else ''}")


def step_arg(where: str, global_steps: Any) -> int:
    """A trainer step: an int >= 0 and below STEP_LIMIT, as every step ingest takes (a numpy
    integer is taken as its int; bool refused)."""
    step = _integer(global_steps)
    if step is None or not 0 <= step < STEP_LIMIT:
        raise ConfigError(f"{where}: global_steps={global_steps!r} {STEP_RULE}")
    return step


def timeout_arg(where: str, timeout: Any) -> float | None:
    """Seconds to wait: a number >= 0 (a negative one waits not at all; a numpy number is taken
    as its float), or None: no limit. One beyond what a wait can take (threading.TIMEOUT_MAX,
    about 292 years; inf too) is no limit either, as None."""
    if timeout is None:
        return None
    seconds = real(timeout)
    if seconds is None or seconds != seconds:
        raise ConfigError(f"{where}: timeout={timeout!r} must be a number of seconds (or None: "
                          "wait as long as it takes)")
    return None if seconds > threading.TIMEOUT_MAX else max(seconds, 0.0)


def callback_arg(where: str, name: str, fn: Any) -> Any:
    """An optional callback: None or something callable with no argument."""
    if fn is not None and not callable(fn):
        raise ConfigError(f"{where}: {name}={fn!r} must be callable (called with no argument "
                          "before every poll), or None")
    return fn


REQUEST_MAX_CHARS = 200


def request_arg(where: str, request: Any) -> str | None:
    """The key a caller names a `sample` with: None, or a non-empty str of at most
    `REQUEST_MAX_CHARS` characters."""
    if request is None:
        return None
    if not isinstance(request, str) or not request or len(request) > REQUEST_MAX_CHARS:
        raise ConfigError(f"{where}: request={request!r} must be a non-empty str of at most "
                          f"{REQUEST_MAX_CHARS} characters naming this call (e.g. "
                          "f'train-step-{global_steps}'), or None")
    return request


def uid_list(where: str, uids: Any) -> list[str]:
    """A list of uids for the keyword shorthands: a list or tuple, or an array / Series (a lone
    string is refused, not iterated; a dict or set too: its keys, in no order the caller chose,
    are no list of uids)."""
    if uids is None:
        raise ConfigError(f"{where}: nothing to do; pass rows, or uids=[...] with partition=")
    if isinstance(uids, (str, bytes)):
        raise ConfigError(f"{where}: uids={uids!r} is one string; pass a list of uids, e.g. "
                          f"uids=[{uids!r}]")
    if isinstance(uids, (Mapping, Set)) or not isinstance(uids, Iterable):
        raise ConfigError(f"{where}: uids={uids!r} must be a list of uids (a list or tuple of "
                          "str, or an array / Series of them)")
    return list(uids)


def batch_size_arg(where: str, batch_size: Any, name: str = "batch_size") -> int:
    """A batch size (or target count, ``name``): a positive int that fits an int64 (a numpy
    integer too; bool refused)."""
    return count_arg(name, batch_size, where=where)


def prompt_id_list(where: str, prompt_ids: Any, n_uids: int) -> list[int | None]:
    """One prompt id per uid: an int (e.g. the dataset index) or None; bool refused. A wrong
    length or type names the position, so the caller can find the row."""
    if isinstance(prompt_ids, (str, bytes)) or not hasattr(prompt_ids, "__len__"):
        raise ConfigError(f"{where}: prompt_ids={prompt_ids!r} must be a list with one id per "
                          "uid (an int such as the dataset index, or None)")
    ids = list(prompt_ids)
    if len(ids) != n_uids:
        raise ConfigError(f"{where}: {len(ids)} prompt_ids for {n_uids} uids; give one per uid "
                          "(None where a group has no prompt id)")
    for i, p in enumerate(ids):
        if p is not None and (isinstance(p, bool) or not isinstance(p, int)):
            if hasattr(p, "item") and isinstance(p.item(), int) and not isinstance(p.item(), bool):
                ids[i] = p.item()          # a numpy integer (verl's index arrays)
                continue
            raise ConfigError(f"{where}: prompt_ids[{i}]={p!r} must be an int (e.g. the dataset "
                              "index) or None; map string ids to integers first")
    return ids


def dataset_list(where: str, dataset: Any, n_uids: int) -> list[str | None]:
    """One dataset name per uid: a single name applies to every uid; a list gives one name (or
    None) per uid. A name is a non-empty str; a wrong length or type names the position."""
    if isinstance(dataset, str):
        names: list[Any] = [dataset] * n_uids
    elif isinstance(dataset, bytes) or not hasattr(dataset, "__len__"):
        raise ConfigError(f"{where}: dataset={dataset!r} must be a name (one str for every uid) "
                          "or a list with one name or None per uid")
    else:
        names = list(dataset)
        if len(names) != n_uids:
            raise ConfigError(f"{where}: {len(names)} dataset names for {n_uids} uids; give one "
                              "per uid (None where a group has no dataset), or one str for all")
    for i, d in enumerate(names):
        if d is not None and (not isinstance(d, str) or not d):
            raise ConfigError(f"{where}: dataset[{i}]={d!r} must be a non-empty str (the "
                              "dataset's name, e.g. 'math') or None")
    return names


def batch_id_arg(batch: Any, where: str = "release") -> int:
    """What `release` and `held_batch` take: a Batch (handled by the caller) or its integer id (a
    numpy integer too); a string, float or bool is refused rather than converted (int("3.7"),
    int(3.7) and int(True) would name another batch, or fail with a bare ValueError)."""
    batch_id = _integer(batch)
    if batch_id is not None:
        return batch_id
    raise ConfigError(f"{where}: {batch!r} is not a batch; pass the Batch that sample() returned "
                      f"or its integer batch_id (e.g. {where}(batch.batch_id))")
