"""verl's TransferQueue keys: parsing trajectory keys, checking new prompt keys, clearing keys."""
from __future__ import annotations

from typing import Any

from pipeline.errors import IngestError


def parse_key(key: str) -> tuple[str, int, int] | None:
    """`{uid}_{session}_{index}` -> (uid, session, index); uid is the text before the first `_`
    (verl's rule, so uids must not contain `_`). None for anything else."""
    uid, sep, rest = key.partition("_")
    if not sep or not uid:
        return None
    s, sep, x = rest.partition("_")
    if not sep or not s.isdigit() or not x.isdigit():
        return None
    return uid, int(s), int(x)


def check_prompts(core: Any, partition: str, new: list[str], listing: dict[str, dict]
                  ) -> None:
    """Reject unusable new prompt keys before any state changes (verl would crash
    with a KeyError on a missing `global_steps`, or mis-attribute a uid containing `_`)."""
    problems = []
    for k in new:
        tag = listing[k]
        if not tag.get("is_prompt", False) or core.lookup(partition, k) is not None:
            continue
        if "_" in k:
            problems.append(f"prompt key {k!r} contains '_': its trajectory keys "
                            "{uid}_{session}_{index} could not be told apart (verl's rule)")
        if "global_steps" not in tag:
            problems.append(f"prompt key {k!r} has no 'global_steps' tag (verl's trainer "
                            "always sets it)")
    if problems:
        raise IngestError(f"verl prompt keys of partition {partition!r}", problems)


def clear(tq: Any, partition: str, keys: list[str]) -> None:
    """kv_clear, never with an empty key list (TransferQueue raises on one)."""
    if keys:
        tq.kv_clear(keys=keys, partition_id=partition)
