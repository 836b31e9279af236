"""The candidate index stays where Python's collector ages long-lived objects.

CPython stops tracking an exact dict that holds only scalars and tuples of scalars, and tracks it
again, in the youngest generation, on the next insert of a fresh tuple; every young collection
then walks the whole index (measured ~5.6 ms per `sample` at 250k groups). This pins the
property that avoids it, without timing anything."""
from __future__ import annotations

import gc

from pipeline.state.candidates import CandidateIndex


def _row(uid: str, seq: int) -> tuple:
    return tuple(["train", uid, 3, seq, "finished"])     # a fresh tuple, as the index gets them


def _in_youngest(obj: object) -> bool:
    return any(o is obj for o in gc.get_objects(0))


def test_a_new_row_leaves_the_index_in_the_oldest_generation():
    index = CandidateIndex()
    index.add("g0", 3, 1, "finished")
    index.complete([_row("g0", 1)])
    gc.collect()                          # survivors move to the oldest generation
    index.add("g1", 3, 2, "finished")
    index.complete([_row("g1", 2)])
    assert gc.is_tracked(index.alive) and not _in_youngest(index.alive)

    plain = {"g0": _row("g0", 1)}
    gc.collect()
    plain["g1"] = _row("g1", 2)
    assert _in_youngest(plain)            # what an exact dict does: the case this guards against
