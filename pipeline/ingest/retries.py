"""Idempotent retries: a put that sends again rows the buffer already stores.

A producer that never saw a put's reply (its process died after the write, a Ray reply was lost)
sends the same rows again. Each row whose (partition, uid, session_id, index) is already stored --
in an in-flight group, or a terminal one whose rows are still in memory -- is compared with the
stored row, column by column (every column a producer sends): an identical row is taken out of the
call and counted (`PutResult.already_stored`); a row that differs is refused as a duplicate key,
naming the key and the columns that differ. Only rows whose key collides are compared, so a put of
new rows costs nothing more. A call mixing new and identical rows stores the new ones: every key
then ends up stored exactly once, which is what the producer asked for.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from schemas import TRAJECTORIES_INPUT, Problem

_COLUMNS = TRAJECTORIES_INPUT.names
# map columns (named reward metrics): the same pairs in another order are the same map
_MAPS = frozenset(f.name for f in TRAJECTORIES_INPUT if pa.types.is_map(f.type))
_KEYS_SHOWN = 5


class PutResult(int):
    """What `put` returns: an int, the rows newly stored, with ``already_stored``, the rows of
    the call that were stored identically before (a retry: nothing done for them)."""

    already_stored: int

    def __new__(cls, stored: int, already_stored: int = 0) -> PutResult:
        out = super().__new__(cls, stored)
        out.already_stored = already_stored
        return out

    def __reduce__(self) -> tuple:   # pickles (Ray, multiprocessing) with its count
        return type(self), (int(self), self.already_stored)

    def __repr__(self) -> str:
        return f"PutResult(stored={int(self)}, already_stored={self.already_stored})"


def _as_compared(column: str, value: Any) -> Any:
    """A map's (key, value) pairs by key, so their order does not count; other values as read."""
    if column in _MAPS and value is not None:
        return sorted(value, key=lambda kv: kv[0])
    return value


def _same(a: Any, b: Any) -> bool:
    """Equal values, NaN equal to NaN (a retry of a NaN reward metric is the same row)."""
    if a == b:
        return True
    if isinstance(a, float) and isinstance(b, float):
        return a != a and b != b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return all(_same(x, y) for x, y in zip(a, b))
    return False


def split_repeats(table: pa.Table, repeats: list[int],
                  stored: Callable[[str, str], pa.Table]) -> tuple[list[int], list[Problem]]:
    """Of the rows ``repeats`` of ``table`` (conformed input whose key is already stored),
    the identical ones, and the problem naming those that differ (none when all are identical).
    ``stored(partition, uid)`` is the group's stored rows."""
    by_group: dict[tuple[str, str], list[int]] = {}
    partitions, uids = table.column("partition"), table.column("uid")
    for i in repeats:
        by_group.setdefault((partitions[i].as_py(), uids[i].as_py()), []).append(i)
    identical: list[int] = []
    conflicts: list[tuple[int, tuple[str, int, int], list[str]]] = []
    for (p, u), rows in by_group.items():
        have = stored(p, u)
        at = {k: j for j, k in enumerate(zip(have.column("session_id").to_pylist(),
                                             have.column("index").to_pylist()))}
        mine = table.take(rows).select(_COLUMNS).to_pylist()
        theirs = have.take([at[r["session_id"], r["index"]] for r in mine]
                           ).select(_COLUMNS).to_pylist()
        for i, new, old in zip(rows, mine, theirs):
            differ = [c for c in _COLUMNS
                      if not _same(_as_compared(c, new[c]), _as_compared(c, old[c]))]
            if differ:
                conflicts.append((i, (u, new["session_id"], new["index"]), differ))
            else:
                identical.append(i)
    if not conflicts:
        return identical, []
    shown = "; ".join(f"{key} differs in {', '.join(cols)}"
                      for _, key, cols in conflicts[:_KEYS_SHOWN])
    more = f" (+{len(conflicts) - _KEYS_SHOWN} more)" if len(conflicts) > _KEYS_SHOWN else ""
    return identical, [Problem("session_id", tuple(sorted(i for i, _, _ in conflicts)), (
        f"duplicate (uid, session_id, index): already in the buffer with different content "
        f"({shown}{more}); an identical retry is a no-op, but a different row under a stored key "
        "is refused: send it under a new session_id / index, or not at all"))]
