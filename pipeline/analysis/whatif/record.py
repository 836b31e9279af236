"""What a replay reads of the recorded lake: its metadata, never its token payload, streamed in
seq windows so that memory does not grow with the lake's length.

The replay's decisions (eviction, selection, the zero-variance filter, the staleness bound, the
overlong rule, the certificates) read a trajectory's keys, versions, reward, reward metrics,
version spans and response length; no decision reads a token id or a log-prob. So the recorded
trajectories are scanned with only those columns (`lake.scan`: the committed rows of every file,
cut at one seq), the response length taken from the stored `n_response_tokens`.

`Record` holds one such scan open for a replay and reads it in three passes, none of which holds
a table whole:

* `Record.check` streams `group_events` and the keys of every table's rows once: a re-issued group
  (not replayable) or an orphan row (refused as `read_lake` refuses it) stops the replay before it
  starts. What it keeps: each registration's key, partition and seq (the refill pools are drawn
  from them).
* `Record.calls` streams the `decisions` that name a call or a release: per call its step,
  partition, poll points, selected groups and batch id (none for a call that handed out no
  batch) and the polls whose refill_fn raised (with the exception's type); per recorded batch
  the seq of its release.
* `Record.windows` yields the group events and trajectory metadata of one window of `WINDOW_SEQS`
  consecutive seqs at a time, in seq order (`_by_seq`), read with the window as the scan's filter.

So what a replay holds of its record is one window of rows, plus a few integers per sample call
and a key per group; not the rows of the run.

The buffer takes a response's length without its tokens (`n_response_tokens` beside empty token
lists, as a producer that keeps the tokens elsewhere sends it), so each put sends the recorded
length alone (`stand_in`): no token ids, no loss mask, no log-probs. A replay's lake therefore
holds the recorded lengths and no payload; its metadata, decisions and lengths are what the
figures read, and the groups the replay's buffer holds, and each batch it hands out, cost their
metadata only (nothing a replay decides or reports reads a token).
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from pipeline.errors import LakeError
from pipeline.state.constants import empty_lists
from schemas import TRAJECTORIES_INPUT

# the per-token columns a replay does not read (it sends them empty, `stand_in`)
PAYLOAD = ("prompt_ids", "response_ids", "response_mask", "rollout_log_probs")
# the rest, the response length (`n_response_tokens`) among them
METADATA = [n for n in TRAJECTORIES_INPUT.names if n not in PAYLOAD]
# seqs per window of `Record.windows`: the journal numbers every table's rows from one counter,
# so a window holds at most this many rows (about 100 bytes of metadata each)
WINDOW_SEQS = 1 << 16
_CALL_COLUMNS = ["call_id", "step", "partition", "poll", "seq", "kind", "uid", "batch_id"]


@dataclass
class Call:
    """One recorded call that decided something: a sample that handed out a batch, or a call
    that handed out none (a sample that timed out, was interrupted, was killed with its process
    or whose refill_fn raised; or a wait_for_sampleable)."""

    call_id: int
    step: int
    partition: str
    points: dict[int, int] = field(default_factory=dict)    # poll -> its first seq
    selected: dict[int, tuple[str, int]] = field(default_factory=dict)  # seq -> (uid, batch)
    failed: dict[int, str] = field(default_factory=dict)   # poll -> what its refill_fn raised
    last_seq: int = -1

    @property
    def uids(self) -> list[str]:
        """The selected groups in the order they were selected."""
        return [u for _, (u, _) in sorted(self.selected.items())]

    @property
    def batch_id(self) -> int:
        return self.selected[min(self.selected)][1]

    @property
    def last_point(self) -> int:
        """The first seq of the call's last deciding poll: the last poll saw every row before it."""
        return max(self.points.values())


class Record:
    """One consistent snapshot of a recorded lake, read by streaming (see the module doc)."""

    def __init__(self, lake: Path, window_seqs: int | None = None):
        from pipeline.lake import require_lake, scan_lake
        self.window_seqs = window_seqs or WINDOW_SEQS
        self.root = require_lake(lake)
        self.scan = scan_lake(self.root)
        self.registered_seq = np.zeros(0, dtype=np.int64)   # every registration, in seq order
        self.registered_key = pa.array([], pa.string())
        self.registered_partition = pa.array([], pa.string())
        self.last_seq = -1

    def close(self) -> None:
        self.scan.close()

    def __enter__(self) -> Record:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _batches(self, table: str, columns, filter=None) -> Iterator[pa.RecordBatch]:
        yield from self.scan.tables[table].to_batches(columns=columns, filter=filter)

    def check(self) -> None:
        """Refuse a lake a replay cannot follow: re-issued groups, orphan rows (module doc)."""
        from pipeline.lake import orphans
        seqs, keys, parts = [], [], []
        for b in self._batches("group_events", ["partition", "uid", "event", "seq"]):
            if pc.any(pc.equal(b["event"], "reissued")).as_py():
                raise LakeError("the lake holds re-issued groups (a restore); a what-if replay "
                                "cannot re-issue through the public API")
            reg = b.filter(pc.equal(b["event"], "registered"))
            seqs.append(reg["seq"].to_numpy())
            keys.append(orphans.key(reg))
            parts.append(reg["partition"])
            self.last_seq = max(self.last_seq, _max_seq(b))
        seq = np.concatenate(seqs) if seqs else np.zeros(0, dtype=np.int64)
        key = pa.concat_arrays(keys) if keys else pa.array([], pa.string())
        part = pa.concat_arrays(parts) if parts else pa.array([], pa.string())
        seq, first = np.unique(seq, return_index=True)     # sorted; a compacted copy once
        self.registered_seq, self.registered_key = seq, key.take(pa.array(first))
        self.registered_partition = part.take(pa.array(first))
        registered = pc.unique(self.registered_key)
        found = {}
        for name, cols in (("group_events", ["event"]), ("trajectories", []),
                           ("decisions", [])):
            parts = []
            for b in self._batches(name, ["partition", "uid", "seq", *cols]):
                self.last_seq = max(self.last_seq, _max_seq(b))
                t = pa.Table.from_batches([b])
                bad = t.filter(orphans.orphan_mask(name, t, registered))
                if bad.num_rows:
                    parts.append(bad)
            if parts:
                found[name] = pa.concat_tables(parts)
        orphans.refuse(self.root, orphans.summary(found))

    def calls(self) -> tuple[list[Call], dict[tuple[str, int], int]]:
        """The recorded calls that decided something, in call order (those that handed out no
        batch included: their evictions and refills are part of the run), and the seq of each
        recorded batch's release ((partition, batch id) -> its first release row). A call that
        decided nothing wrote no row and is not among them."""
        calls: dict[int, Call] = {}
        released: dict[tuple[str, int], int] = {}
        keep = (ds.field("call_id") >= 0) | (ds.field("kind") == "release")
        for b in self._batches("decisions", _CALL_COLUMNS, keep):
            for r in b.to_pylist():
                if r["kind"] == "release":
                    k = (r["partition"], r["batch_id"])
                    released[k] = min(released.get(k, r["seq"]), r["seq"])
                if r["call_id"] is None or r["call_id"] < 0:
                    continue
                c = calls.setdefault(r["call_id"], Call(r["call_id"], r["step"],
                                                        r["partition"]))
                c.points[r["poll"]] = min(c.points.get(r["poll"], r["seq"]), r["seq"])
                c.last_seq = max(c.last_seq, r["seq"])
                if r["kind"] == "select":
                    c.selected[r["seq"]] = (r["uid"], r["batch_id"])
        for (call_id, poll), reason in self._failed_refills().items():
            if call_id in calls:        # its call wrote the refill row it belongs to
                calls[call_id].failed[poll] = reason
        return [c for _, c in sorted(calls.items())], released

    def _failed_refills(self) -> dict[tuple[int, int], str]:
        """(call id, poll) -> the type of the exception its refill_fn raised, for every
        `refill_failed` row (a few rows: read on their own, not with every call's rows)."""
        keep = (ds.field("kind") == "refill_failed") & (ds.field("call_id") >= 0)
        return {(r["call_id"], r["poll"]): r["reason"]
                for b in self._batches("decisions", ["call_id", "poll", "reason"], keep)
                for r in b.to_pylist()}

    def refills(self) -> list[tuple[int, int, int, str]]:
        """(seq, count, step, partition) of every refill the recorded run's refill_fn served, in
        seq order (step and partition: those of the call that asked)."""
        rows = []
        keep = ds.field("kind").isin(["refill", "refill_failed"])
        for b in self._batches("decisions", ["partition", "call_id", "poll", "kind", "seq",
                                             "count", "step"], keep):
            rows += b.to_pylist()
        failed = {(r["partition"], r["call_id"], r["poll"]) for r in rows
                  if r["kind"] == "refill_failed"}
        served = {r["seq"]: (r["count"], r["step"], r["partition"]) for r in rows
                  if r["kind"] == "refill" and (r["partition"], r["call_id"], r["poll"]) not in failed}
        return [(seq, *asked) for seq, asked in sorted(served.items())]

    def windows(self, first: int = 0) -> Iterator[tuple[pa.Table, pa.Table]]:
        """(group events, trajectory metadata) of each window of ``window_seqs`` seqs
        (`WINDOW_SEQS` by default) from ``first`` on, each sorted by seq; empty windows are
        skipped. Call `check` first (it finds the last seq). The window is the scan's filter:
        a compacted file whose seq statistics miss it is not read."""
        columns = [*METADATA, "seq"]
        span = self.window_seqs
        for lo in range(first, self.last_seq + 1, span):
            window = (ds.field("seq") >= lo) & (ds.field("seq") < lo + span)
            ev = self.scan.tables["group_events"].to_table(filter=window)
            tr = self.scan.tables["trajectories"].to_table(columns=columns, filter=window)
            if ev.num_rows or tr.num_rows:
                yield _by_seq(ev), _by_seq(tr)


def _max_seq(b: pa.RecordBatch) -> int:
    return int(pc.max(b["seq"]).as_py()) if b.num_rows else -1


def _by_seq(table: pa.Table) -> pa.Table:
    """Sorted by seq, each seq once (a segment and its compacted copy may both be listed while
    a compaction runs)."""
    if table.num_rows == 0:
        return table.combine_chunks()
    table = table.take(pc.sort_indices(table, [("seq", "ascending")])).combine_chunks()
    seq = table.column("seq").to_numpy()
    repeat = np.flatnonzero(seq[1:] == seq[:-1]) + 1
    if repeat.size:
        keep = np.ones(len(seq), dtype=bool)
        keep[repeat] = False
        table = table.filter(pa.array(keep))
    return table


def stand_in(meta: pa.Table) -> pa.Table:
    """Trajectories as the buffer takes them (`TRAJECTORIES_INPUT`) from rows of the metadata
    `Record.windows` yields: the recorded response length (`n_response_tokens`) sent without
    tokens, as the module doc describes."""
    n = meta.num_rows
    made = {name: empty_lists(n, TRAJECTORIES_INPUT.field(name).type.value_type)
            for name in ("prompt_ids", "response_ids")}
    made["response_mask"] = pa.nulls(n, TRAJECTORIES_INPUT.field("response_mask").type)
    made["rollout_log_probs"] = pa.nulls(n, TRAJECTORIES_INPUT.field("rollout_log_probs").type)
    columns = [made[f.name] if f.name in made else meta.column(f.name) for f in TRAJECTORIES_INPUT]
    return pa.Table.from_arrays(columns, schema=TRAJECTORIES_INPUT)
