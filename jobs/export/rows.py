"""Which lake rows an export holds: the trained groups' trajectories with their Batch provenance.

*Trained data* is what the trainer got: every trajectory of every group a ``select`` decision
handed out, with the provenance columns the Batch carried (``schemas.BATCH_PROVENANCE``,
recomputed exactly as ``pipeline.decide.batch.with_provenance`` does). Split in two so that the payload
part (`attach_provenance`) can run per lake file on Ray Data workers (`jobs.export.ray`) while the
small metadata part (`trained_groups`) runs once on the driver.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs.export.manifest import ExportError
from pipeline.decide import row_provenance
from pipeline.lake import dropped_payload, read_table
from schemas import BATCH_PROVENANCE


def trained_groups(lake: Path, partition: str, selects: pa.Table) -> pa.Table:
    """One row per selected group: uid, step, batch_id, sel_seq (its select), is_stale (handed
    out masked), gs and start_seq (its last (re)registration before the select) and status (its
    terminal event, if any)."""
    import polars as pl

    # a `select` recorded with reason 'stale' handed the group out masked (strategy mask)
    sel = (pl.from_arrow(selects.select(["uid", "step", "batch_id", "seq", "reason"]))
           .sort("seq").unique("uid", keep="first", maintain_order=True)
           .with_columns(is_stale=pl.col("reason").eq("stale").fill_null(False))
           .drop("reason").rename({"seq": "sel_seq"}))
    ev = pl.from_arrow(read_table(lake, "group_events", [partition])
                       .select(["uid", "event", "global_steps", "seq"]))
    starts = (sel.join(ev.filter(pl.col("event").is_in(["registered", "reissued"])), on="uid")
              .filter(pl.col("seq") < pl.col("sel_seq")).sort("seq")
              .group_by("uid").agg(pl.col("global_steps").last().alias("gs"),
                                   pl.col("seq").last().alias("start_seq")))
    ends = (sel.join(ev.filter(pl.col("event").is_in(["finished", "failure"])), on="uid")
            .filter(pl.col("seq") < pl.col("sel_seq")).sort("seq")
            .group_by("uid").agg(pl.col("event").last().alias("status")))
    return sel.join(starts, on="uid").join(ends, on="uid", how="left").to_arrow()


def attach_provenance(traj: pa.Table, groups: pa.Table) -> pa.Table:
    """The rows of ``traj`` that belong to the trained groups (after the group's last
    (re)registration, before its select), with the provenance their Batch carried, ordered by
    (batch_id, seq)."""
    import polars as pl

    rows = (pl.from_arrow(traj.select(["uid", "seq"])).with_row_index("row")
            .join(pl.from_arrow(groups), on="uid")
            .filter((pl.col("seq") > pl.col("start_seq")) & (pl.col("seq") < pl.col("sel_seq")))
            .sort(["batch_id", "seq"]))
    out = traj.take(pa.array(rows["row"].to_numpy().astype(np.int64)))
    step = rows["step"].to_numpy().astype(np.int64)
    gs = rows["gs"].to_numpy().astype(np.int64)
    cols = {"batch_id": rows["batch_id"].to_numpy(), "step": step, "global_steps": gs,
            "status": rows["status"].fill_null("finished").to_list(),
            "times_sampled": np.ones(len(step), np.int32),
            "is_stale": rows["is_stale"].to_numpy().astype(bool)}
    cols.update(row_provenance(step, gs, *(out.column(c).to_numpy().astype(np.int64, copy=False)
                                           for c in ("min_global_steps", "max_global_steps"))))
    for f in BATCH_PROVENANCE:
        out = out.append_column(f, pa.array(cols[f.name], type=f.type))
    return out


KEYS = ("batch_id", "seq", "step", "n_response_tokens")


def _width(t: pa.DataType) -> int:
    """Bytes one value of ``t`` takes in Arrow, about: exact for fixed-width types, their sum
    for a struct, 16 for anything of variable size held inside a list (a string, a map)."""
    if pa.types.is_struct(t):
        return sum(_width(t.field(i).type) for i in range(t.num_fields))
    try:
        return max(t.bit_width // 8, 1)
    except ValueError:
        return 16


def row_nbytes(rows: pa.Table) -> pa.Array:
    """Per row: about how many bytes it holds in Arrow (its fixed-width values, and each list's
    values and offset). It sizes a shard's Parquet row groups from the plan, before any row is
    gathered, so that every writer cuts a shard into the same row groups."""
    total = np.zeros(rows.num_rows, np.int64)
    for field, col in zip(rows.schema, rows.columns):
        t = field.type
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
            n = np.concatenate([np.diff(c.offsets.to_numpy()) for c in col.chunks] or
                               [np.zeros(0, np.int64)])   # a null list has no values
            total += n.astype(np.int64) * _width(t.value_type if not pa.types.is_map(t)
                                                else pa.struct([t.key_field, t.item_field])) + 4
        elif pa.types.is_string(t) or pa.types.is_binary(t):
            total += pc.binary_length(col).fill_null(0).to_numpy(
                zero_copy_only=False).astype(np.int64) + 4
        else:
            total += _width(t)
    return pa.array(total, pa.int64())


def row_keys(rows: pa.Table) -> pa.Table:
    """What the export plans and checks shards by, per row: `KEYS`, ``dropped``
    (`dropped_payload`) and ``nbytes`` (`row_nbytes`). A few bytes a row: with Ray, only these
    reach the driver."""
    return (rows.select(list(KEYS)).append_column("dropped", dropped_payload(rows))
            .append_column("nbytes", row_nbytes(rows)))


def step_ranges(steps: list[int]) -> str:
    """``[1, 2, 3, 7]`` -> ``"1-3, 7"``."""
    out: list[str] = []
    for s in sorted(set(steps)):
        if out and s == int(out[-1].split("-")[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{s}"
        else:
            out.append(str(s))
    return ", ".join(out)


def refuse_dropped_payload(todo: list[tuple[str, pa.Table]]) -> None:
    """Refuse (before writing anything) to write shards holding rows without their token
    payload (retention dropped it, or the producer sent the response length alone): a trainer
    reading them would get empty token lists where the rows say there were tokens. Shards
    written before stay complete and are kept. ``todo`` holds each shard's `row_keys`."""
    lost: dict[str, list[pa.Table]] = {}
    for p, rows in todo:
        mask = rows.column("dropped")
        if pc.any(mask).as_py():
            lost.setdefault(p, []).append(rows.filter(mask).select(["step", "n_response_tokens"]))
    if not lost:
        return
    hit = {p: pa.concat_tables(t) for p, t in lost.items()}
    where = "; ".join(f"partition {p}: {t.num_rows:,} trajectories "
                      f"({pc.sum(t.column('n_response_tokens')).as_py():,} response tokens) trained "
                      f"at step(s) {step_ranges(t.column('step').to_pylist())}"
                      for p, t in hit.items())
    first_kept = max(pc.max(t.column("step")).as_py() for t in hit.values()) + 1
    raise ExportError(
        f"trained rows hold no token payload ({where}): their rows keep their metadata, but "
        "prompt_ids and response_ids are empty, and an export is what the trainer received. "
        "Either `replaylake retain` dropped it: export later steps (e.g. --steps "
        f"{first_kept}:), or from a copy of the lake taken before the retention, and run "
        "exports more often than retain's --older-than horizon to keep every step. Or it was "
        "never stored: a lake written by the verl adapter holds the tokens only with "
        "mirror_fields='full' (verl's trainer reads them from TransferQueue)")
