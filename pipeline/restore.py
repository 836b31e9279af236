"""Restore a buffer from its lake: replay every table in `seq` order through the apply methods.

Trajectories, group events and decisions are merged by their global `seq`; consecutive rows of
one table are applied as one slice, so restoring a large lake stays vectorised where it matters.
Trajectories of groups that are gone for good (released, evicted, discarded) are filtered out as
their segments are read: the payload of a long run's history is never loaded just to be dropped.
Metric rows are history only and are not replayed.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.lake import read_table

if TYPE_CHECKING:
    from pipeline.buffer import ReplayBuffer

_REPLAYED = ("group_events", "trajectories", "decisions")


def _key(t: pa.Table) -> pa.Array:
    return pc.binary_join_element_wise(t.column("partition"), t.column("uid"), "\x00")


def restore(buf: ReplayBuffer, lake: str | os.PathLike) -> None:
    tables = {name: read_table(lake, name) for name in ("group_events", "decisions")}
    dec = tables["decisions"]
    gone = dec.filter(pc.is_in(dec.column("kind"), pa.array(["evict", "discard", "release"])))
    gone_keys = pc.unique(_key(gone)) if gone.num_rows else None
    tables["trajectories"] = read_table(
        lake, "trajectories",
        keep=None if gone_keys is None else (lambda t: pc.invert(pc.is_in(_key(t), gone_keys))))
    seqs = [tables[n].column("seq").to_numpy() for n in _REPLAYED]
    if not any(len(s) for s in seqs):
        return
    all_seq = np.concatenate(seqs)
    source = np.concatenate([np.full(len(s), i, dtype=np.int8) for i, s in enumerate(seqs)])
    local = np.concatenate([np.arange(len(s)) for s in seqs])
    order = np.argsort(all_seq, kind="stable")
    source, local = source[order], local[order]
    cuts = np.flatnonzero(np.diff(source)) + 1
    for run_src, run_idx in zip(np.split(source, cuts), np.split(local, cuts)):
        name = _REPLAYED[int(run_src[0])]
        rows = tables[name].slice(int(run_idx[0]), len(run_idx))
        if name == "group_events":
            buf.apply_group_events(rows)
        elif name == "trajectories":
            buf.apply_trajectories(rows)
        else:
            _apply_decisions(buf, rows)
    # metric rows are not replayed, but they took seq numbers too: never hand those out again
    metric_seq = read_table(lake, "metrics").column("seq").to_numpy()
    buf._journal.next_seq = int(max(all_seq.max(), metric_seq.max(initial=-1))) + 1
    dec = tables["decisions"]
    if dec.num_rows:
        ids = dec.column("batch_id").drop_null().to_numpy()
        buf._next_batch = int(ids.max()) + 1 if len(ids) else 0
        buf._next_call = int(dec.column("call_id").to_numpy().max()) + 1


def _apply_decisions(buf: ReplayBuffer, rows: pa.Table) -> None:
    cols = [rows.column(c).to_pylist() for c in ("partition", "kind", "uid", "batch_id", "step")]
    for p, kind, uid, batch_id, step in zip(*cols):
        part = buf._part(p)
        if kind == "evict":
            if uid in part.groups and part.groups[uid].removed is None:
                part.apply_removed([uid], "evicted")   # a group evicted for 2 reasons: 2 rows
        elif kind == "discard":
            part.apply_removed([uid], "discarded")
        elif kind == "select":
            part.apply_removed([uid], "selected", batch_id, step)
        elif kind == "release":
            if batch_id in part.batches:
                part.apply_released(batch_id)
