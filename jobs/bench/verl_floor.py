"""The bound TransferQueue sets on `bench verl`: its bare calls that a default-mode `sample` of
the adapter makes, timed in the same interleaved rounds as the buffers, and their figures."""
from __future__ import annotations

import statistics
import time
from typing import Any

from jobs.bench.out import figure
from jobs.bench.tq_systems import Systems
from jobs.bench.verl_groups import PER_GROUP, spread, write_groups

FLOOR = "tq_floor"        # the bare TransferQueue calls (`Floor`), interleaved with the buffers
FLOOR_PARTS = ("list", "get", "clear")


class Floor:
    """No buffer: the bare TransferQueue calls a default-mode `sample` of ours makes inside the
    call and cannot leave out, on a partition of the same size with the same arrivals: the
    listing of the partition, and in `rewards` mode one `kv_batch_get` of `rm_scores` and
    `extra_fields` for the keys that arrived since the last call. Then, timed apart, the
    `kv_clear` of the selected groups' prompt keys (the oldest ``batch``), which the adapter's
    thread makes right after the call and verl's `sample` makes inside it (verl lists as well;
    its listing covers every partition of its TransferQueue, here only this one)."""

    impl = FLOOR

    def __init__(self, tq: Any, part: str, n: int, batch: int, fresh: list[int],
                 systems: Systems):
        self.tq, self.part, self.batch, self.fresh, self.systems = tq, part, batch, fresh, systems
        self.queue = [f"b{i}" for i in range(n)]        # the partition's groups, oldest first
        self.new: list[str] = []                        # trajectory keys since the last call
        self.parts: dict[str, list[float]] = {k: [] for k in FLOOR_PARTS}
        self.last: list[str] | None = None

    def _refill(self) -> None:
        self.tq.kv_clear(keys=self.last, partition_id=self.part)
        uids = [f"n{self.fresh[0] + i}" for i in range(self.batch)]
        self.fresh[0] += self.batch
        write_groups(self.tq, uids, self.part)
        self.queue.extend(uids)
        self.new = [f"{u}_{s}_0" for u in uids for s in range(PER_GROUP)]

    def call(self) -> None:
        self.systems.of(self.part)
        if self.last is not None:
            self._refill()
        tq, part = self.tq, self.part
        t0 = time.perf_counter()
        tq.kv_list(partition_id=part)
        t1 = time.perf_counter()
        if self.new:
            tq.kv_batch_get(keys=self.new, partition_id=part,
                            select_fields=["rm_scores", "extra_fields"])
        t2 = time.perf_counter()
        chosen, self.queue = self.queue[:self.batch], self.queue[self.batch:]
        tq.kv_clear(keys=chosen, partition_id=part)
        t3 = time.perf_counter()
        for k, v in zip(FLOOR_PARTS, (t1 - t0, t2 - t1, t3 - t2)):
            self.parts[k].append(v)
        self.last = [f"{u}_{s}_0" for u in chosen for s in range(PER_GROUP)]

    def finish(self) -> dict:
        self.systems.of(self.part)
        self._refill()
        lst, get = self.parts["list"][1:], self.parts["get"][1:]
        first = self.parts["list"][0]
        return {"decisions": spread(lst, first),
                "rewards": spread([a + b for a, b in zip(lst, get)], first),
                **{f"{k}_ms": statistics.median(self.parts[k][1:]) * 1e3 for k in FLOOR_PARTS}}


def floor_figures(r: dict[str, Any], n: int, verl_ms: float) -> list[dict[str, Any]]:
    """The bound TransferQueue sets: its bare calls that a default-mode `sample` of ours makes
    inside the call, against verl's `sample` (a reference row, no goal: no adapter making these
    calls inside the call can be faster than verl by more than this ratio)."""
    fl, out = r["tq_floor"], []
    for mode, what in (("decisions", "kv_list"),
                       ("rewards", "kv_list + kv_batch_get of the new keys' rm_scores and "
                                   "extra_fields")):
        ms = fl[mode]["median_ms"]
        out.append(figure(f"TransferQueue calls alone, {n:,} groups, {mode} mirror's ({what}; "
                          "interleaved: the most that mode's row can reach)", ms, "ms",
                          "verl 0.9.1 ms", verl_ms, verl_ms / ms, "x verl's speed at most", "",
                          None, in_summary=True))
    return out
