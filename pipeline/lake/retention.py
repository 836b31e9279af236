"""Retention: physically drop the token payload of groups that are gone for good and old.

Why: the token ids and log-probs are nearly all of a lake's bytes, and once a group was released
(trained on), evicted or discarded nothing in the buffer will ever read them again: a restart
skips such groups' trajectories, and the questions asked of an old run ("how stale were the
batches", "why was this prompt evicted") read the decision log and the per-trajectory metadata.

What is dropped: `prompt_ids` and `response_ids` become empty lists, `response_mask` and
`rollout_log_probs` null, for every trajectory of a group whose terminal decision (release,
evict, discard) was taken more than ``older_than`` steps before the newest step in the lake.
Every row stays, with its seq, rewards, versions, version spans and status; the decision log,
group events and metrics are untouched, so lineage and the staleness views answer as before. One
thing changes: a retained trajectory's `len(response_ids)` reads 0.

Only compacted files are rewritten (retention compacts the sealed segments first); a live
writer's open segments are left for a later run. A file is never rewritten in place, nor renamed
over: a reader that planned over it (a DuckDB connection made before the run) would read bytes
that are not the file it planned over. The rewrite is the segment's next generation
(`lake.names`: `S.parquet` -> `S.r1.parquet` -> `S.r2.parquet` ...), written to a hidden
temporary file, fsync'ed, renamed into place, the directory fsync'ed, and only then is the file
it rewrote deleted. A reader listing in between counts the newest generation only; one that
listed the old file reads the new one if the old is gone when it opens it; one that has mapped it
(every SQL connection maps the files it scans, `lake.scan`) keeps reading it. Every reader sees
each row once, with its payload or without it, never half of it.

Idempotent: files with nothing left to drop are not touched, and a run killed anywhere (kill
points `retain.tmp_written`, `retain.renamed`, `retain.deleted`) is finished by the next one (its
compaction step deletes a dead run's temporary file, and a file a newer generation replaced).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.errors import ConfigError
from pipeline.lake import kill as lake_kill
from pipeline.lake import parquet
from pipeline.lake.compaction import CompactReport, compact, job_lock
from pipeline.lake.files import fsync_dir, replace_durably
from pipeline.lake.names import next_generation
from pipeline.lake.read import current_files, read_table

EMPTIED = ("prompt_ids", "response_ids")          # not nullable: emptied
NULLED = ("response_mask", "rollout_log_probs")   # nullable: set to null
TERMINAL = ("release", "evict", "discard")


@dataclass
class RetainReport:
    """What one retention run did."""

    horizon: int | None = None       # groups whose terminal decision is at or before this step
    groups: int = 0                  # groups old enough to lose their payload
    rewritten: list[Path] = field(default_factory=list)    # the new files (each the next
                                                            # generation of the one it replaced)
    rows: int = 0                    # trajectories whose payload was dropped by this run
    bytes_before: int = 0
    bytes_after: int = 0
    compaction: CompactReport | None = None


def _key(t: pa.Table) -> pa.Array:
    return pc.binary_join_element_wise(t.column("partition"), t.column("uid"), "\x00")


def _old_groups(root: Path, older_than: int) -> tuple[int | None, pa.Array]:
    dec = read_table(root, "decisions")
    if dec.num_rows == 0:
        return None, pa.array([], pa.string())
    horizon = int(pc.max(dec.column("step")).as_py()) - older_than
    done = dec.filter(pc.and_(pc.is_in(dec.column("kind"), pa.array(TERMINAL)),
                              pc.less_equal(dec.column("step"), horizon)))
    return horizon, pc.unique(_key(done)) if done.num_rows else pa.array([], pa.string())


def _has_payload(t: pa.Table) -> pa.Array:
    out = None
    for name in EMPTIED:
        m = pc.greater(pc.list_value_length(t.column(name)), 0)
        out = m if out is None else pc.or_(out, m)
    for name in NULLED:
        out = pc.or_(out, pc.is_valid(t.column(name)))
    return out.fill_null(False)


def _stripped(t: pa.Table, mask: pa.Array) -> pa.Table:
    for name in (*EMPTIED, *NULLED):
        i = t.schema.get_field_index(name)
        col = t.column(name)
        if name in EMPTIED:
            empty = pa.array([[]] * t.num_rows, col.type)
            new = pc.if_else(mask, empty, col)
        else:
            new = pc.if_else(mask, pa.nulls(t.num_rows, col.type), col)
        t = t.set_column(i, t.schema.field(i), new)
    return t


def _rewrite(path: Path, gone: pa.Array) -> tuple[Path, int] | None:
    """Drop the payload of ``gone`` groups' rows of one Parquet file into its next generation,
    which replaces it (module doc); (the new file, rows changed), None when nothing changed."""
    f = parquet.open_file(path)     # mapped and verified once for both reads
    meta = f.metadata
    keys = f.read(columns=["partition", "uid"])
    if not pc.any(pc.is_in(_key(keys), gone)).as_py():
        return None
    t = f.read()
    mask = pc.and_(pc.is_in(_key(t), gone), _has_payload(t))
    changed = int(pc.sum(mask.cast(pa.int64())).as_py() or 0)
    if changed == 0:
        return None
    t = _stripped(t, mask).replace_schema_metadata(meta.schema.to_arrow_schema().metadata)
    new = next_generation(path)
    tmp = new.with_name(f".{new.name}.tmp")
    rows_per_group = max(meta.row_group(0).num_rows, 1) if meta.num_row_groups else None
    parquet.write_table(t, tmp, row_group_size=rows_per_group)
    replace_durably(tmp, new, synced="retain.tmp_written", replaced="retain.renamed")
    path.unlink()
    fsync_dir(path.parent)
    lake_kill.hit("retain.deleted")
    return new, changed


def retain(root: str | os.PathLike, older_than: int,
           progress: Callable[[int, int], None] | None = None) -> RetainReport:
    """Compact, then drop the payload of old released/evicted/discarded groups (module doc)."""
    if not isinstance(older_than, int) or isinstance(older_than, bool) or older_than < 0:
        raise ConfigError(f"older_than={older_than!r}: give a number of steps >= 0")
    root = Path(root)
    lake_kill.arm_once()
    report = RetainReport(compaction=compact(root))
    with job_lock(root):
        report.horizon, gone = _old_groups(root, older_than)
        report.groups = len(gone)
        files = [p for p in current_files(root, "trajectories") if p.suffix == ".parquet"]
        if report.groups:
            for i, path in enumerate(files):
                before = path.stat().st_size
                done = _rewrite(path, gone)
                if done is not None:
                    report.rewritten.append(done[0])
                    report.rows += done[1]
                    report.bytes_before += before
                    report.bytes_after += done[0].stat().st_size
                if progress is not None:
                    progress(i + 1, len(files))
    return report


def dropped_payload(rows: pa.Table, tokenless: bool = True) -> pa.Array:
    """Per row: whether it lacks the token payload its row says the response had: `replaylake
    retain` dropped it, or the producer never sent it (a response length sent without its
    tokens, as the verl adapter does without `mirror_fields="full"`: verl's trainer reads the
    tokens from TransferQueue). Ingest stores each trajectory's response length
    (`n_response_tokens`) beside its tokens and retention keeps it while it empties `prompt_ids`
    and `response_ids`, so a row whose `response_ids` hold fewer tokens than that does not hold
    what the trainer received. A retained row that had no
    response tokens lost its prompt ids only, so a row with neither prompt nor response tokens
    counts as dropped too: it would hand a trainer nothing, and loudly refusing a row that never
    had tokens is the safe side of the doubt (``tokenless=False`` leaves such rows out: a
    batch's own conversion takes rows without tokens as they are)."""
    held = pc.list_value_length(rows.column("response_ids")).cast(pa.int64())
    shorter = pc.not_equal(held, rows.column("n_response_tokens")).fill_null(False)
    if not tokenless:
        return shorter
    empty = pc.and_(pc.equal(held, 0), pc.equal(pc.list_value_length(rows.column("prompt_ids")), 0))
    return pc.or_(shorter, empty).fill_null(False)


__all__ = ["RetainReport", "retain", "EMPTIED", "NULLED", "dropped_payload"]
