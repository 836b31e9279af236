"""What a replay reads of the recorded lake: its metadata, never its token payload, streamed in
seq windows so that memory does not grow with the lake's length.

The replay's decisions (eviction, selection, the zero-variance filter, the staleness bound, the
overlong rule, the certificates) read a trajectory's keys, versions, reward, reward metrics,
version spans and response length, and whether it reported rollout log-probs; no decision reads a
token id. So the recorded trajectories are scanned with only those columns (`lake.scan`: the
committed rows of every file, cut at one seq), the response length taken from the stored
`n_response_tokens` and the presence of log-probs from the list's validity.

`Record` holds one such scan open for a replay and reads it in three passes, none of which holds
a table whole:

* `Record.check` streams `group_events` and the keys of every table's rows once: a re-issued group
  (not replayable) or an orphan row (refused as `read_lake` refuses it) stops the replay before it
  starts. What it keeps: each registration's key and seq (the refill pool is drawn from them).
* `Record.calls` streams the `decisions` that name a sample call or a release: per call its step,
  partition, poll points, selected groups and batch id; per recorded batch the seq of its release.
* `Record.windows` yields the group events and trajectory metadata of one window of `WINDOW_SEQS`
  consecutive seqs at a time, in seq order (`_by_seq`), read with the window as the scan's filter.

So what a replay holds of its record is one window of rows, plus a few integers per sample call
and a key per group; not the rows of the run.

The buffer takes trajectories with their token lists, so each put gets a stand-in payload
(`stand_in`): response tokens and log-probs as zeros of the recorded length (exact lengths, so
the replay's lake stores the recorded `n_response_tokens` and every length check holds), no
prompt tokens and no loss mask. A replay's lake therefore holds zeros where the recorded one holds
tokens; its metadata, decisions and lengths are what the figures read.
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
from schemas import TRAJECTORIES_INPUT

TABLES = ("group_events", "trajectories", "decisions")
# the per-token columns a replay does not read (the buffer gets a stand-in for them)
PAYLOAD = ("prompt_ids", "response_ids", "response_mask", "rollout_log_probs")
LENGTH = "n_response_tokens"
HAS_LOG_PROBS = "has_rollout_log_probs"
METADATA = [n for n in TRAJECTORIES_INPUT.names if n not in PAYLOAD]
# seqs per window of `Record.windows`: the journal numbers every table's rows from one counter,
# so a window holds at most this many rows (about 100 bytes of metadata each)
WINDOW_SEQS = 1 << 16
_CALL_COLUMNS = ["call_id", "step", "partition", "poll", "seq", "kind", "uid", "batch_id"]


@dataclass
class Call:
    """One recorded sample call that handed out a batch."""

    call_id: int
    step: int
    partition: str
    points: dict[int, int] = field(default_factory=dict)    # poll -> its first seq
    selected: dict[int, tuple[str, int]] = field(default_factory=dict)  # seq -> (uid, batch)
    last_seq: int = -1

    @property
    def uids(self) -> list[str]:
        """The selected groups in the order they were selected."""
        return [u for _, (u, _) in sorted(self.selected.items())]

    @property
    def batch_id(self) -> int:
        return self.selected[min(self.selected)][1]


class Record:
    """One consistent snapshot of a recorded lake, read by streaming (see the module doc)."""

    def __init__(self, lake: Path, window_seqs: int | None = None):
        from pipeline.lake import require_lake, scan_lake
        self.window_seqs = window_seqs or WINDOW_SEQS
        self.root = require_lake(lake)
        self.scan = scan_lake(self.root)
        self.registered_seq = np.zeros(0, dtype=np.int64)   # every registration, in seq order
        self.registered_key = pa.array([], pa.string())
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
        seqs, keys = [], []
        for b in self._batches("group_events", ["partition", "uid", "event", "seq"]):
            if pc.any(pc.equal(b["event"], "reissued")).as_py():
                raise LakeError("the lake holds re-issued groups (a restore); a what-if replay "
                                "cannot re-issue through the public API")
            reg = b.filter(pc.equal(b["event"], "registered"))
            seqs.append(reg["seq"].to_numpy())
            keys.append(orphans.key(reg))
            self.last_seq = max(self.last_seq, _max_seq(b))
        seq = np.concatenate(seqs) if seqs else np.zeros(0, dtype=np.int64)
        key = pa.concat_arrays(keys) if keys else pa.array([], pa.string())
        seq, first = np.unique(seq, return_index=True)     # sorted; a compacted copy once
        self.registered_seq, self.registered_key = seq, key.take(pa.array(first))
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
        """The recorded sample calls that handed out a batch, in call order, and the seq of each
        recorded batch's release ((partition, batch id) -> its first release row)."""
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
        return [c for _, c in sorted(calls.items()) if c.selected], released

    def refills(self) -> list[tuple[int, int]]:
        """(seq, count) of every refill the recorded run's refill_fn served, in seq order."""
        rows = []
        keep = ds.field("kind").isin(["refill", "refill_failed"])
        for b in self._batches("decisions", ["partition", "call_id", "poll", "kind", "seq",
                                             "count"], keep):
            rows += b.to_pylist()
        failed = {(r["partition"], r["call_id"], r["poll"]) for r in rows
                  if r["kind"] == "refill_failed"}
        served = {r["seq"]: r["count"] for r in rows if r["kind"] == "refill"
                  and (r["partition"], r["call_id"], r["poll"]) not in failed}
        return sorted(served.items())

    def windows(self, first: int = 0) -> Iterator[tuple[pa.Table, pa.Table]]:
        """(group events, trajectory metadata) of each window of ``window_seqs`` seqs
        (`WINDOW_SEQS` by default) from ``first`` on, each sorted by seq; empty windows are
        skipped. Call `check` first (it finds the last seq)."""
        events = self.scan.tables["group_events"]
        files = _traj_files(self.scan.tables["trajectories"])
        schema = self.scan.tables["trajectories"].schema
        columns = {n: ds.field(n) for n in [*METADATA, LENGTH, "seq"]}
        span = self.window_seqs
        for lo in range(first, self.last_seq + 1, span):
            hi = lo + span
            window = (ds.field("seq") >= lo) & (ds.field("seq") < hi)
            if self.scan.cut is not None:
                window = window & (ds.field("seq") <= self.scan.cut)
            ev = events.to_table(filter=window)
            parts = [f.read(schema, columns, window) for f in files if f.meets(lo, hi)]
            tr = pa.concat_tables([p for p in parts if p.num_rows] or [_empty_meta(schema)])
            if ev.num_rows or tr.num_rows:
                yield _by_seq(ev), _by_seq(tr)


@dataclass
class _TrajFile:
    """One trajectories file of the scan: its seq range and whether its rows reported log-probs
    ("all", "none", or None: read per row)."""

    fragment: ds.Fragment
    lo: int
    hi: int
    log_probs: str | None

    def meets(self, lo: int, hi: int) -> bool:
        return self.lo < hi and self.hi >= lo

    def read(self, schema: pa.Schema, columns: dict, window: ds.Expression) -> pa.Table:
        cols = dict(columns)
        if self.log_probs is None:       # the only payload read: the list's validity
            cols[HAS_LOG_PROBS] = ds.field("rollout_log_probs").is_valid()
        t = self.fragment.to_table(schema=schema, columns=cols, filter=window)
        if self.log_probs is not None:
            t = t.append_column(HAS_LOG_PROBS, pa.array(
                np.full(t.num_rows, self.log_probs == "all"), pa.bool_()))
        return t


def _traj_files(data: ds.Dataset) -> list[_TrajFile]:
    """Every trajectories file of a scan with its seq range and log-prob presence.

    Why: whether a row reported log-probs is the validity of its `rollout_log_probs` list, and a
    compacted file stores that list's values with its validity: reading it decodes every
    log-prob of the file (about half of a real run's payload). Parquet statistics answer it
    without reading the column: a row group whose leaf values hold no null has every list
    present and non-empty; one whose leaf holds one null (a null or empty list) per row and no
    value, while every row has response tokens (so a reported list could not be empty), has
    none. Only a file with a row group in between (some rows without log-probs, or empty
    answers) is read. A
    live segment's copy is mapped Arrow, where validity is a bitmap: read as it is."""
    kids = data.children if isinstance(data, ds.UnionDataset) else [data]
    out = []
    for kid in kids:
        for frag in kid.get_fragments():
            meta = getattr(frag, "metadata", None)
            got = _parquet_facts(meta) if meta is not None else None
            if got is None:
                seq = frag.to_table(columns=["seq"]).column("seq")
                if not len(seq):
                    continue
                got = (pc.min(seq).as_py(), pc.max(seq).as_py(), None)
            out.append(_TrajFile(frag, *got))
    return out


def _parquet_facts(meta) -> tuple[int, int, str | None] | None:
    """(min seq, max seq, log-prob presence) from a Parquet file's statistics; None when its
    statistics do not give the seq range."""
    paths = {meta.row_group(0).column(j).path_in_schema: j
             for j in range(meta.num_columns)} if meta.num_row_groups else {}
    seq, lp = paths.get("seq"), paths.get("rollout_log_probs.list.element")
    length = paths.get(LENGTH)
    if seq is None:
        return None
    lo, hi, kinds = None, None, set()
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        st = rg.column(seq).statistics
        if st is None or not st.has_min_max:
            return None
        lo = st.min if lo is None else min(lo, st.min)
        hi = st.max if hi is None else max(hi, st.max)
        lps = rg.column(lp).statistics if lp is not None else None
        lens = rg.column(length).statistics if length is not None else None
        if lps is None or not lps.has_null_count:
            kinds.add(None)
        elif lps.null_count == 0 and lps.num_values > 0:
            kinds.add("all")        # no null and no empty list: every row has log-probs
        elif lps.null_count == rg.num_rows and lps.num_values == 0 and lens is not None \
                and lens.has_min_max and lens.min > 0:
            kinds.add("none")       # one empty-or-null list a row, and every row has tokens
        else:
            kinds.add(None)
    if lo is None:
        return None
    return lo, hi, kinds.pop() if len(kinds) == 1 else None


def _empty_meta(schema: pa.Schema) -> pa.Table:
    fields = [schema.field(n) for n in [*METADATA, LENGTH, "seq"]]
    return pa.schema([*fields, pa.field(HAS_LOG_PROBS, pa.bool_())]).empty_table()


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


def _lists(lengths: np.ndarray, value_type: pa.DataType, valid: np.ndarray | None = None
           ) -> pa.Array:
    """A list array of zeros with the given lengths (null where ``valid`` is False)."""
    if valid is not None:
        lengths = np.where(valid, lengths, 0)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = pa.array(np.zeros(int(offsets[-1]), dtype=value_type.to_pandas_dtype()))
    mask = None if valid is None else pa.array(~valid)
    return pa.ListArray.from_arrays(pa.array(offsets), values, type=pa.list_(value_type),
                                    mask=mask)


def stand_in(meta: pa.Table) -> pa.Table:
    """Trajectories as the buffer takes them (`TRAJECTORIES_INPUT`) from rows of the metadata
    `Record.windows` yields, with the stand-in payload the module doc describes."""
    n = meta.num_rows
    lengths = meta.column(LENGTH).to_numpy()
    logged = np.asarray(meta.column(HAS_LOG_PROBS).to_numpy(zero_copy_only=False), dtype=bool)
    made = {
        "prompt_ids": _lists(np.zeros(n, dtype=np.int64), pa.int32()),
        "response_ids": _lists(lengths, pa.int32()),
        "response_mask": pa.nulls(n, pa.list_(pa.int8())),
        "rollout_log_probs": (_lists(lengths, pa.float32(), logged) if logged.any()
                              else pa.nulls(n, pa.list_(pa.float32()))),
    }
    columns = [made[f.name] if f.name in made else meta.column(f.name) for f in TRAJECTORIES_INPUT]
    return pa.Table.from_arrays(columns, schema=TRAJECTORIES_INPUT)
