"""Restore a buffer from its lake: replay every table in `seq` order through `BufferState.apply`,
the very path live calls take (decisions included).

Trajectories, group events and decisions are merged by their global `seq`; consecutive rows of
one table are applied as one slice, so restoring a large lake stays vectorised where it matters.
Trajectories of groups that are gone for good (released, evicted, discarded) are filtered out as
their segments are read: the payload of a long run's history is never loaded just to be dropped.
Metric rows are history, and only those a `wait_for_sampleable` wrote (no batch: the evictions
it reported, which no later batch repeats) are replayed. The groups that were terminal but undecided
get their aggregates in one query, at the first poll.
"""
from __future__ import annotations

import logging
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.lake import highest_seq, orphans, read_table
from pipeline.state.buffer_state import BufferState

_REPLAYED = ("group_events", "trajectories", "decisions", "metrics")
log = logging.getLogger("replaylake")


def _orphans_dropped(lake: str | os.PathLike, tables: dict[str, pa.Table]) -> int:
    """Drop the rows of groups whose registration is not in the lake, where a salvage set
    registrations aside (they cannot be restored); anywhere else they are damage (see
    `pipeline.lake.orphans`). Returns how many were dropped."""
    found = orphans.orphans_in(tables)
    orphans.refuse(lake, orphans.summary(found))
    registered = orphans.registered_keys(tables["group_events"])
    for name in found:
        tables[name] = tables[name].filter(pc.invert(orphans.orphan_mask(name, tables[name], registered)))
    return sum(t.num_rows for t in found.values())


def restore(state: BufferState, lake: str | os.PathLike) -> None:
    tables = {name: read_table(lake, name) for name in ("group_events", "decisions")}
    dec = tables["decisions"]
    gone = dec.filter(pc.is_in(dec.column("kind"), pa.array(["evict", "discard", "release"])))
    gone_keys = pc.unique(orphans.key(gone)) if gone.num_rows else None
    tables["trajectories"] = read_table(
        lake, "trajectories",
        keep=None if gone_keys is None else (lambda t: pc.invert(pc.is_in(orphans.key(t), gone_keys))))
    dropped = _orphans_dropped(lake, tables)
    if dropped:
        log.warning("restore of %s: %d row(s) belong to groups whose registration is not in the "
                    "lake (set aside by `replaylake lake salvage`); they were skipped", lake,
                    dropped)
    metrics = read_table(lake, "metrics", columns=["partition", "batch_id", "seq"])
    metric_seq = metrics.column("seq").to_numpy()
    # of the metric rows (history), only the reports of `wait_for_sampleable` are replayed
    tables["metrics"] = metrics.filter(pc.is_null(metrics.column("batch_id")))
    seqs = [tables[n].column("seq").to_numpy() for n in _REPLAYED]
    all_seq = np.concatenate(seqs)
    source = np.concatenate([np.full(len(s), i, dtype=np.int8) for i, s in enumerate(seqs)])
    local = np.concatenate([np.arange(len(s)) for s in seqs])
    order = np.argsort(all_seq, kind="stable")
    source, local = source[order], local[order]
    cuts = np.flatnonzero(np.diff(source)) + 1
    for run_src, run_idx in zip(np.split(source, cuts), np.split(local, cuts)):
        if len(run_idx) == 0:
            continue
        name = _REPLAYED[int(run_src[0])]
        state.apply(name, tables[name].slice(int(run_idx[0]), len(run_idx)))
    state.settle_restored()
    # metric rows took seq numbers too, and so did calls torn by a crash (rows on disk that no
    # reader accepts): never hand any of those out again
    seen = int(max(all_seq.max(initial=-1), metric_seq.max(initial=-1)))
    top = highest_seq(lake)
    state.journal.next_seq = max(seen, top) + 1
    if top > seen and state.journal.lake is not None:
        # the seqs of the call a crash tore: logged as never to be written, so readers do not
        # take them for a write in flight and hide every acknowledged row after them
        state.journal.lake.record_burnt(seen + 1, top)
