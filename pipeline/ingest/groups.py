"""A put's checks against the live groups: every trajectory names a group that is in flight, no
(partition, uid, session_id, index) comes twice in the call, and no session reaches the group's
expected count ``n``. Problems name the rows, as pipeline/ingest/conform.py reports them. Rows whose
key is already stored (in flight, or terminal with its rows still in memory) are *repeats*: a
retry's, identical or not, which pipeline/ingest/retries.py tells apart.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from schemas import Problem

UNKNOWN_GROUP = "unknown_group"   # Problem.kind of rows naming a group that is not in flight


def _fresh_groups_only(cols: list[list], lookup: Callable[[str, str], Any]) -> bool:
    """True when `group_problems` cannot find anything: no (partition, uid, session, index)
    twice, and every group named is in flight with no trajectory stored yet and an ``n`` (if
    any) above every session id. The usual put -- a group's sessions sent together -- is then
    checked per group, not per row (walking every row was a large part of a big put)."""
    if len(set(zip(*cols))) != len(cols[0]):
        return False
    least_n = None
    for p, u in dict.fromkeys(zip(cols[0], cols[1])):
        g = lookup(p, u)
        if g is None or g.removed or g.status not in ("pending", "running") or g.keys:
            return False
        if g.n is not None and (least_n is None or g.n < least_n):
            least_n = g.n
    return least_n is None or max(cols[2], default=0) < least_n


def group_problems(cols: list[list], lookup: Callable[[str, str], Any]
                   ) -> tuple[list[Problem], list[int]]:
    """Checks against the live groups, over the (partition, uid, session_id, index) lists: the
    problems, and the rows whose key is already stored (repeats, to compare)."""
    if _fresh_groups_only(cols, lookup):
        return [], []
    out: list[Problem] = []
    unknown, closed, dup, repeats, out_of_n = [], [], [], [], []
    seen: set = set()
    groups: dict[tuple[str, str], Any] = {}   # a put sends a group's sessions together
    for i, (p, u, s, x) in enumerate(zip(*cols)):
        g = groups[p, u] if (p, u) in groups else groups.setdefault((p, u), lookup(p, u))
        if g is None:
            unknown.append(i)
            continue
        open_ = not g.removed and g.status in ("pending", "running")
        stored = (s, x) in g.keys and g.removed in (None, "sampled")   # its rows in memory
        if not open_ and not stored:
            closed.append(i)
            continue
        key = (p, u, s, x)
        if key in seen:
            dup.append(i)
        seen.add(key)
        if stored:
            repeats.append(i)
        elif g.n is not None and s >= g.n:
            out_of_n.append(i)
    if unknown:
        out.append(Problem("uid", tuple(unknown), "unknown group: register it before sending "
                                                  "its trajectories", UNKNOWN_GROUP))
    if closed:
        out.append(Problem("uid", tuple(closed), "group is not accepting trajectories (it is "
                                                 "terminal or already removed)", UNKNOWN_GROUP))
    if dup:
        out.append(Problem("session_id", tuple(dup),
                           "duplicate (uid, session_id, index) within this call"))
    if out_of_n:
        out.append(Problem("session_id", tuple(out_of_n), "session_id >= the group's n"))
    return out, repeats
