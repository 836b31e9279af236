"""verl's TransferQueue keys: parsing trajectory keys, checking new prompt keys, clearing keys,
and the `KVBatchMeta` a sample returns."""
from __future__ import annotations

import copy
from typing import Any

from pipeline.errors import IngestError
from pipeline.ingest import STEP_LIMIT

# what the partition mirror knows a listed key to be
PROMPT, TRAJ, WAITING, IGNORED, UNTAGGED = "prompt", "traj", "waiting", "ignored", "untagged"


_MAX_NUMBER = 2 ** 31      # session and index are int32 in the trajectory schema


def parse_key(key: str) -> tuple[str, int, int] | None:
    """`{uid}_{session}_{index}` -> (uid, session, index); uid is the text before the first `_`
    (verl's rule, so uids must not contain `_`); session and index are ASCII digits, each below
    2**31. None for anything else (such a key is left alone)."""
    uid, sep, rest = key.partition("_")
    if not sep or not uid:
        return None
    s, sep, x = rest.partition("_")
    if not (sep and s.isascii() and s.isdigit() and x.isascii() and x.isdigit()):
        return None       # (str.isdigit alone takes '²', which int() refuses)
    session, index = int(s), int(x)
    if session >= _MAX_NUMBER or index >= _MAX_NUMBER:
        return None
    return uid, session, index


def check_prompts(partition: str, known: dict[str, Any], listing: dict[str, dict]) -> None:
    """Reject unusable new prompt keys before any state changes (verl would crash
    with a KeyError on a missing `global_steps`, or mis-attribute a uid containing `_`).
    ``known``: each new prompt key -> the core's lookup of it (None: never seen)."""
    problems = []
    for k, g in known.items():
        if g is not None:
            continue
        tag = listing[k]
        if "_" in k:
            problems.append(f"prompt key {k!r} contains '_': its trajectory keys "
                            "{uid}_{session}_{index} could not be told apart (verl's rule)")
        if "global_steps" not in tag:
            problems.append(f"prompt key {k!r} has no 'global_steps' tag (verl's trainer "
                            "always sets it)")
        else:
            gs = tag["global_steps"]
            if type(gs) is not int or not 0 <= gs < STEP_LIMIT:
                problems.append(f"prompt key {k!r} has global_steps {gs!r} "
                                f"({type(gs).__name__}): the step it was dispatched at must be "
                                f"an int >= 0 and < 2**62, as verl's trainer writes it")
    if problems:
        raise IngestError(f"verl prompt keys of partition {partition!r} (rewrite these tags "
                          "or kv_clear the keys, and the next poll goes on)", problems)


def clear(tq: Any, partition: str, keys: list[str]) -> None:
    """kv_clear, never with an empty key list (TransferQueue raises on one)."""
    if keys:
        tq.kv_clear(keys=keys, partition_id=partition)


_IMMUTABLE = frozenset({str, int, float, bool, bytes, type(None)})


def batch_meta(partition: str, keys: list[str], tags: list[dict]) -> Any:
    """TransferQueue's `KVBatchMeta` for a sampled batch, built as its constructor builds it
    (same checks, tags copied so the caller's listing stays private) but without `deepcopy`
    over every tag: verl's tags are flat dicts of scalars, for which a `dict` copy is a deep
    copy, at a fraction of `deepcopy`'s cost. A tag holding anything mutable is deep-copied."""
    from transfer_queue import KVBatchMeta
    meta = KVBatchMeta(partition_id=partition, keys=keys, tags=_Placeholders([None] * len(keys)))
    flat = _IMMUTABLE.issuperset
    meta.tags = [dict(t) if flat(map(type, t.values())) else copy.deepcopy(t) for t in tags]
    return meta


class _Placeholders(list):
    """The tags `KVBatchMeta` is made with, one per key, replaced right after: its constructor
    deep-copies its tags, and these copy as they are."""

    def __deepcopy__(self, memo: dict) -> _Placeholders:
        return self
