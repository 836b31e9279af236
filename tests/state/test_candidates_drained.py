"""The groups awaiting their aggregates are held in a dict that is drained at every poll; a dict
keeps the room of its deleted entries and walking it walks them, so after a restore (or a first
poll) of many groups every later poll walked them all to find its few new ones (0.5 ms a call at
a million groups). A drained one is replaced: pinned here by its size, without timing."""
from __future__ import annotations

import sys

from pipeline.state.candidates import CandidateIndex


def _row(uid: str, seq: int) -> tuple:
    return tuple(["train", uid, 3, seq, "finished"])


def test_the_unaggregated_groups_take_no_room_once_completed():
    index = CandidateIndex()
    uids = [f"g{i}" for i in range(50_000)]
    for i, u in enumerate(uids):
        index.add(u, 3, i, "finished")
    assert sys.getsizeof(index.unaggregated) > 1_000_000
    index.complete([_row(u, i) for i, u in enumerate(uids)])
    assert not index.unaggregated
    assert sys.getsizeof(index.unaggregated) <= sys.getsizeof({"g": 1})
    index.add("new", 3, 50_000, "finished")          # the next poll's one new group
    assert list(index.unaggregated) == ["new"]
