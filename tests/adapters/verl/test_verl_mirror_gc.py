"""The verl mirror's per-key maps stay out of the youngest generation of Python's collector.

A poll adds every new TransferQueue key to the mirror's maps (kind, arrival order, by-uid lists).
An exact dict that CPython stopped tracking is tracked again, in the youngest generation, on the
next insert of a fresh container, and every young collection then walks it whole: at 10,000
groups that is 50,000 entries per collection. The maps avoid it by what they hold: strings and
ints (never tracked at all) or lists (tracked for good, so the dict ages like any survivor).
This pins that property, without timing anything and without Ray (a dict stands in for
TransferQueue's listing)."""
from __future__ import annotations

import gc

from pipeline.adapters.verl.mirror import PartitionMirror
from pipeline.buffer import ReplayBuffer


class _Listing:
    """kv_list / kv_clear over a dict, as TransferQueue lists a partition (fresh tag dicts)."""

    def __init__(self) -> None:
        self.tags: dict[str, dict] = {}

    def kv_list(self, partition_id: str) -> dict:
        return {partition_id: {k: dict(t) for k, t in self.tags.items()}}

    def kv_clear(self, keys: list[str], partition_id: str) -> None:
        for k in keys:
            self.tags.pop(k, None)

    def arrive(self, uids: list[str]) -> None:
        """Finished groups of 4 trajectories whose tags carry their versions and response
        lengths, as verl's agent loop tags them (nothing to read)."""
        for u in uids:
            self.tags[u] = {"is_prompt": True, "status": "finished", "global_steps": 3}
            for s in range(4):
                self.tags[f"{u}_{s}_0"] = {"status": "success", "global_steps": 3,
                                           "response_len": 5, "min_global_steps": 2,
                                           "max_global_steps": 2}


def _in_youngest(obj: object) -> bool:
    return any(o is obj for o in gc.get_objects(0))


def test_a_poll_leaves_the_large_maps_out_of_the_youngest_generation():
    tq = _Listing()
    mirror = PartitionMirror(ReplayBuffer.async_(), tq, "train", "decisions", None)
    tq.arrive([f"a{i}" for i in range(50)])
    mirror.sync()
    gc.collect()                           # survivors move to the oldest generation
    tq.arrive([f"b{i}" for i in range(8)])
    mirror.sync()
    assert len(mirror.kind) == 58 * 5 and len(mirror.order) == 58 * 4
    for name in ("kind", "order", "watch"):
        assert not gc.is_tracked(getattr(mirror, name)), name
    assert gc.is_tracked(mirror.by_uid) and not _in_youngest(mirror.by_uid)

    plain = {"a0": tuple(["a0", 0, 0])}    # what a map of fresh tuples does: the case guarded
    gc.collect()
    plain["a1"] = tuple(["a1", 0, 0])
    assert _in_youngest(plain)
