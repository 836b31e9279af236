"""The decision log's rows, made in one place.

Every decision the buffer takes (an eviction, a selection, a discard, a refill asked or failed, a
release) lands in the lake as rows of `schemas.DECISIONS`. Their shared columns (partition, step,
call, poll, kind, count) are filled here, so a new column or a new kind is one edit, and no site
can spell a kind or forget a column that restore and the lake's readers rely on.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipeline.errors import InvariantError
from pipeline.state.journal import Columns

KINDS = ("evict", "select", "discard", "refill", "refill_failed", "refill_deferred", "release")
OUTSIDE_A_CALL = -1        # the call id of decisions no sample call took (retire, release)
_ONE_ROW = ("refill", "refill_failed", "refill_deferred")   # a refill names no group: one row


def decision_rows(kind: str, *, partition: str, step: int | Sequence[int],
                  call_id: int = OUTSIDE_A_CALL, poll: int = 0,
                  uids: Sequence[str] | None = None, reason: Any = None, group_span: Any = None,
                  value: Any = None, batch_id: int | None = None, count: int = 1,
                  replaces: Any = None, bound: Any = None, strategy: Any = None,
                  request: str | None = None) -> Columns:
    """The rows of one decision, ready for `BufferState.commit("decisions", ...)`.

    A group decision (evict, select, discard, release) has one row per uid of ``uids``; its
    ``step``, ``reason``, ``group_span``, ``value``, ``replaces``, ``bound`` and ``strategy`` are
    either one value shared by every row or a list of one value per row (None: null). A refill
    (or a failed one) is one row without a uid: ``count`` prompts, ``replaces`` the evicted uids
    they replace; a `refill_deferred` row, the prompts admission held back (owed, asked by the
    next refill). ``request``: the key a `sample` was named with (its selection's rows)."""
    if kind not in KINDS:
        raise InvariantError(f"unknown decision kind {kind!r}; kinds: {', '.join(KINDS)}")
    if (kind in _ONE_ROW) != (uids is None):
        raise InvariantError(f"a {kind!r} decision {'names no' if kind in _ONE_ROW else 'needs'} "
                             "uids")
    if uids is None:
        n = 1
        replaces = None if replaces is None else [list(replaces)]
    else:
        n = len(uids)
        uids = list(uids)
    return Columns("decisions", n, {
        "partition": partition, "step": _each(step), "call_id": call_id, "poll": poll,
        "kind": kind, "uid": uids, "reason": _each(reason), "group_span": _each(group_span),
        "value": _each(value), "batch_id": batch_id, "count": count, "replaces": replaces,
        "bound": _each(bound), "strategy": _each(strategy), "request": request})


def _each(v: Any) -> Any:
    """A per-row sequence as the list `Columns` takes; a shared value as it is."""
    return list(v) if isinstance(v, (list, tuple)) else v
