"""What a replay reads of the recorded lake: its metadata, never its token payload.

The replay's decisions (eviction, selection, the zero-variance filter, the staleness bound, the
overlong rule, the certificates) read a trajectory's keys, versions, reward, reward metrics,
version spans and response length, and whether it reported rollout log-probs; no decision reads a
token id. So the recorded trajectories are scanned with only those columns (`lake.scan`: the
committed rows of every file, cut at one seq, one record batch at a time), the response length
taken from the stored `n_response_tokens` and the presence of log-probs from the list's validity.

The buffer takes trajectories with their token lists, so each put gets a stand-in payload
(`stand_in`): response tokens and log-probs as zeros of the recorded length (exact lengths, so
the replay's lake stores the recorded `n_response_tokens` and every length check holds), no
prompt tokens and no loss mask. A replay's lake therefore holds zeros where the recorded one holds
tokens; its metadata, decisions and lengths are what the figures read.

The recorded tables are held as metadata alone: about a hundred bytes per trajectory and per
event, whatever the length of the answers.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from schemas import TRAJECTORIES_INPUT

TABLES = ("group_events", "trajectories", "decisions")
# the per-token columns a replay does not read (the buffer gets a stand-in for them)
PAYLOAD = ("prompt_ids", "response_ids", "response_mask", "rollout_log_probs")
LENGTH = "n_response_tokens"
HAS_LOG_PROBS = "has_rollout_log_probs"
METADATA = [n for n in TRAJECTORIES_INPUT.names if n not in PAYLOAD]


def read_metadata(lake: Path) -> dict[str, pa.Table]:
    """The recorded `group_events` and `decisions` and the trajectories' metadata (`METADATA`,
    the response length and whether log-probs were reported, plus `seq`), each sorted by seq,
    from one consistent snapshot of the committed rows. Refuses orphan rows as `read_lake` does."""
    from pipeline.lake import orphans, require_lake, scan_lake
    root = require_lake(lake)
    scan = scan_lake(root)
    try:
        columns = {n: ds.field(n) for n in [*METADATA, LENGTH, "seq"]}
        columns[HAS_LOG_PROBS] = ds.field("rollout_log_probs").is_valid()
        tables = {"group_events": scan.tables["group_events"].to_table(),
                  "trajectories": scan.tables["trajectories"].to_table(columns=columns),
                  "decisions": scan.tables["decisions"].to_table()}
    finally:
        scan.close()
    tables = {name: _by_seq(t) for name, t in tables.items()}
    orphans.refuse(root, orphans.summary(orphans.orphans_in(tables)))
    return tables


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
    `read_metadata` returns, with the stand-in payload the module doc describes."""
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
