"""Export job: the lake's trained data as Parquet (and tensor) shards with a resumable manifest.

*Trained data* is what the trainer got: every trajectory of every group a ``select`` decision
handed out, with the provenance columns the Batch carried (``schemas.BATCH_PROVENANCE``,
recomputed exactly as ``pipeline.decide.batch.with_provenance`` does). Rows that a ``reissued`` event
dropped, and groups never selected (evicted, discarded, still live), are not exported.

Layout (one directory per partition; rows ordered by ``batch_id`` then arrival ``seq``, i.e. the
order the trainer saw them; batch ids only grow, so a growing lake only appends shards)::

    <out>/manifest.json
    <out>/<partition>/shard-00000.parquet   zstd; row groups of <= --row-group-mb MiB of Arrow
                                            data (a streaming reader holds one at a time)
    <out>/<partition>/shard-00000.pt        with --format pt: torch.save of {tensor name: tensor}
                                            from pipeline.to_torch.convert (--tensor-layout), plus
                                            per-row `batch_id` and `step`

Every shard holds ``--rows-per-shard`` rows (the last of a partition fewer). The manifest lists
each shard (rows, step and batch-id range, sha256 and size of each file, and a fingerprint of the
rows' ``seq`` values), the selection, the source step range and the schema.

Resumable: files are written to a temporary name and renamed, and the manifest is rewritten
(atomically) after every shard, so a killed export leaves only whole shards behind. A re-run with
the same options skips every shard whose rows' fingerprint matches the manifest and whose files
still have the recorded size and sha256, and writes the rest (a shard damaged in place is written
again; see jobs.export.manifest); re-running later on a grown lake appends the new shards. Two
exports must not write into the same directory at the same time.

After `replaylake retain` the rows of old groups keep their metadata but not their tokens; an
export is what the trainer received, so a shard to be written that holds such rows is refused
(naming the steps) before anything is written, while shards exported before the retention stay
complete.
"""
from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import typer

from jobs.cli import LakeArg, LakeOpt
from jobs.export.local import LocalRows
from jobs.export.manifest import (
    MANIFEST_FORMAT,
    ExportError,
    atomic,
    check_out,
    intact,
    read_done,
    shard_path,
    write_manifest,
)
from jobs.export.rows import (
    attach_provenance,
    refuse_dropped_payload,
    trained_groups,
)
from pipeline.lake import mkdir_durably, read_table, require_lake
from schemas import BATCH_PROVENANCE, TRAJECTORIES

__all__ = ["ExportConfig", "ExportError", "LocalRows", "attach_provenance", "export", "main",
           "parse_steps", "trained_groups", "write_shard"]

FORMATS = ("parquet", "pt")


@dataclass(frozen=True)
class ExportConfig:
    """What to export and how; validated at construction."""

    lake: Path
    out: Path
    partitions: tuple[str, ...] = ()             # empty: every partition with trained data
    steps: tuple[int | None, int | None] = (None, None)   # inclusive; None = open end
    formats: tuple[str, ...] = ("parquet",)
    rows_per_shard: int = 4096
    row_group_mb: int = 64
    tensor_layout: str = "packed"
    pad_token_id: int = 0
    progress: bool = True

    def __post_init__(self) -> None:
        # the errors name the command-line flags (`main`), the way a user of the CLI wrote them
        bad = [f for f in self.formats if f not in FORMATS]
        if bad or not self.formats:
            shown = " ".join(f"--format {f}" for f in bad) or "no --format"
            raise ExportError(f"{shown}: use parquet and/or pt (repeat --format for both)")
        for flag, value in (("--rows-per-shard", self.rows_per_shard),
                            ("--row-group-mb", self.row_group_mb)):
            if value < 1:
                raise ExportError(f"{flag} {value}: give 1 or more")
        if self.tensor_layout not in ("padded", "packed"):
            raise ExportError(f"--tensor-layout {self.tensor_layout}: use packed or padded")
        lo, hi = self.steps
        if lo is not None and hi is not None and lo > hi:
            raise ExportError(f"--steps {lo}:{hi}: the first step is after the last")

    def selection(self) -> dict[str, Any]:
        """The options a resumed export must share with the manifest it continues."""
        keep = ("partitions", "steps", "formats", "rows_per_shard", "row_group_mb",
                "tensor_layout", "pad_token_id")
        return {k: list(v) if isinstance(v, tuple) else v
                for k, v in asdict(self).items() if k in keep}


def parse_steps(text: str | None) -> tuple[int | None, int | None]:
    """``A:B`` (inclusive), ``A``, ``A:`` or ``:B``."""
    if not text:
        return None, None
    lo, sep, hi = text.partition(":")
    try:
        a = int(lo) if lo.strip() else None
        b = (int(hi) if hi.strip() else None) if sep else a
    except ValueError as exc:
        raise ExportError(f"--steps {text!r}: write A:B (inclusive), A, A: or :B") from exc
    return a, b


def _selections(cfg: ExportConfig) -> dict[str, pa.Table]:
    """Per partition: the `select` decisions in the step range (checked against the lake)."""
    require_lake(cfg.lake)
    known = sorted({p.name.split("=", 1)[1] for t in ("decisions", "trajectories")
                    for p in (cfg.lake / t).glob("partition=*")})
    if not known:
        raise ExportError(f"no lake data at {cfg.lake} (no decisions or trajectories)")
    unknown = [p for p in cfg.partitions if p not in known]
    if unknown:
        raise ExportError(f"unknown partition(s) {', '.join(map(repr, unknown))} (--partition); "
                          f"the lake at {cfg.lake} has {', '.join(known)}")
    out = {}
    for p in cfg.partitions or known:
        dec = read_table(cfg.lake, "decisions", [p])
        out[p] = dec.filter(pc.equal(dec.column("kind"), "select"))
    trained = np.concatenate([t.column("step").to_numpy() for t in out.values()])
    names = ", ".join(out)
    if trained.size == 0:
        raise ExportError(f"nothing was trained in partition(s) {names}: no select decisions")
    first, last = int(trained.min()), int(trained.max())
    for label, s in zip(("first", "last"), cfg.steps):
        if s is not None and not first <= s <= last:
            raise ExportError(f"unknown step {s} ({label} of --steps): partition(s) {names} "
                              f"trained steps {first}..{last}")
    lo, hi = (first if cfg.steps[0] is None else cfg.steps[0],
              last if cfg.steps[1] is None else cfg.steps[1])
    if not ((trained >= lo) & (trained <= hi)).any():
        raise ExportError(f"no trained step in {lo}:{hi} for partition(s) {names}")
    return {p: t.filter(pc.and_(pc.greater_equal(t.column("step"), lo),
                                pc.less_equal(t.column("step"), hi))) for p, t in out.items()}


def write_shard(cfg: ExportConfig, keys: pa.Table, gather: Callable[[int, int], pa.Table],
                partition: str, index: int) -> dict[str, Any]:
    """Write one shard in every requested format; returns the files' manifest entries.

    ``keys``: the shard's `jobs.export.rows.row_keys` in plan order; ``gather(lo, hi)`` returns
    its rows ``lo:hi`` in that order. The Parquet file is written one row group at a time, each
    gathered when it is written, so a shard is never held whole (the `.pt` format needs it
    whole). The row groups are sized from the plan's ``nbytes`` (about ``row_group_mb`` each),
    so every row source cuts a shard the same way and writes the same bytes."""
    base = cfg.out / partition / f"shard-{index:05d}"
    mkdir_durably(base.parent)
    files = {}
    n = keys.num_rows
    if "parquet" in cfg.formats:
        per_row = max(1, (pc.sum(keys.column("nbytes")).as_py() or 0) // max(n, 1))
        group = max(int(min(n, max(1, cfg.row_group_mb * 2**20 // per_row))), 1)

        def write(tmp: Path) -> None:
            parts = (gather(lo, min(lo + group, n))
                     for lo in range(0, max(n, 1), group))   # an empty shard: one group
            first = next(parts)
            with pq.ParquetWriter(tmp, first.schema, compression="zstd") as writer:
                parts = itertools.chain([first], parts)
                del first
                for part in parts:
                    writer.write_table(part, row_group_size=group)
                    del part                 # dropped before the next one is gathered
        files["parquet"] = atomic(base.with_suffix(".parquet"), write)
    if "pt" in cfg.formats:
        import torch

        from pipeline.to_torch import batch_to_torch
        rows = gather(0, n)
        tensors = batch_to_torch(rows, layout=cfg.tensor_layout, pad_token_id=cfg.pad_token_id)
        tensors["batch_id"] = torch.from_numpy(rows.column("batch_id").to_numpy().copy())
        tensors["step"] = torch.from_numpy(rows.column("step").to_numpy().copy())
        del rows
        files["pt"] = atomic(base.with_suffix(".pt"), lambda tmp: torch.save(tensors, tmp))
    for fmt, entry in files.items():
        entry["path"] = shard_path(partition, index, fmt)
    return files


def export(cfg: ExportConfig, source: Any = None) -> dict[str, Any]:
    """Run the export; returns the manifest with this run's shard counts: ``written``,
    ``skipped`` (complete already) and ``repaired`` (written again: a file no longer matched),
    and ``writers``: the distinct processes that wrote shards (``[]`` in this process).

    ``source`` reads the trained rows and writes the shards (default `LocalRows`, in this
    process; `jobs.export.ray.RayRows` does both on Ray workers)."""
    from tqdm import tqdm

    from jobs.progress import hidden

    source = source or LocalRows()
    selections = _selections(cfg)
    check_out(cfg.out)
    mkdir_durably(cfg.out)
    for stale in cfg.out.glob("**/.*.tmp-*"):
        stale.unlink()                       # a killed run's half-written file
    done = read_done(cfg.out, cfg.selection(), str(cfg.lake.resolve()))
    schema = pa.unify_schemas([TRAJECTORIES, BATCH_PROVENANCE])
    manifest = {"format": MANIFEST_FORMAT, "lake": str(cfg.lake.resolve()),
                "selection": cfg.selection(), "complete": False, "partitions": {},
                "schema": [{"name": f.name, "type": str(f.type), "nullable": f.nullable}
                           for f in schema], "shards": []}
    tables = {p: source.plan(cfg.lake, p, s) for p, s in selections.items()}
    plan = []                                # (partition, index, row keys, rows key, state)
    for p, t in tables.items():
        for index, lo in enumerate(range(0, t.num_rows, cfg.rows_per_shard)):
            keys = t.slice(lo, cfg.rows_per_shard)
            key = hashlib.sha256(keys.column("seq").to_numpy().tobytes()).hexdigest()
            plan.append((p, index, keys, key, intact(cfg.out, done.get((p, index)), key,
                                                     cfg.formats)))
    todo = [(p, index, keys) for p, index, keys, _, state in plan if state != "done"]
    refuse_dropped_payload([(p, keys) for p, _, keys in todo])
    for p in {p for p, *_ in todo}:
        mkdir_durably(cfg.out / p)
    order = [(p, index) for p, index, *_ in plan]
    by_shard = {(p, index): (keys, key, state) for p, index, keys, key, state in plan}
    skipped = sum(state == "done" for *_, state in plan)
    written = repaired = 0
    writers: set[Any] = set()
    with tqdm(total=len(plan), initial=skipped, unit="shard", desc="export",
              disable=hidden(cfg.progress)) as bar:
        if not todo:                         # nothing to write: the manifest is still rewritten
            manifest["shards"] = [done[s] for s in order if s in done]
            write_manifest(cfg.out, manifest)
        for p, index, files, writer in source.write(cfg, todo):
            keys, key, state = by_shard[(p, index)]
            steps, batches = keys.column("step"), keys.column("batch_id")
            done[(p, index)] = {
                "partition": p, "index": index, "rows": keys.num_rows, "rows_key": key,
                "first_step": pc.min(steps).as_py(), "last_step": pc.max(steps).as_py(),
                "first_batch_id": batches[0].as_py(), "last_batch_id": batches[-1].as_py(),
                "files": files}
            written += 1
            repaired += state == "damaged"
            if writer is not None:
                writers.add(writer)
            manifest["shards"] = [done[s] for s in order if s in done]
            write_manifest(cfg.out, manifest)
            bar.update(1)
            bar.set_postfix(written=written, skipped=skipped)
    planned = set(order)
    for key, entry in done.items():          # shards of an earlier, longer plan
        if key not in planned:
            for f in entry["files"].values():
                (cfg.out / f["path"]).unlink(missing_ok=True)
    manifest["shards"] = [done[s] for s in order if s in done]
    for p, t in tables.items():
        steps = t.column("step")
        manifest["partitions"][p] = {
            "rows": t.num_rows, "shards": sum(1 for q, _ in order if q == p),
            "steps": [pc.min(steps).as_py(), pc.max(steps).as_py()],
            "batches": int(pc.count_distinct(t.column("batch_id")).as_py())}
    spans = [v["steps"] for v in manifest["partitions"].values() if v["rows"]]
    manifest["source_steps"] = [min(s[0] for s in spans), max(s[1] for s in spans)] if spans else None
    manifest["complete"] = True
    write_manifest(cfg.out, manifest)
    return {**manifest, "written": written, "skipped": skipped, "repaired": repaired,
            "writers": sorted(writers)}


def main(
    lake_arg: LakeArg = None,
    lake_opt: LakeOpt = None,
    out: Annotated[Path | None, typer.Option(metavar="DIR",
                                             help="directory for the shards and manifest.json "
                                             "(required)")] = None,
    partition: Annotated[list[str] | None, typer.Option(
        metavar="NAME", help="partition to export (repeat for several; default: every "
        "partition)")] = None,
    steps: Annotated[str | None, typer.Option(
        metavar="A:B", help="trained steps A:B (inclusive), A, A: or :B")] = None,
    format: Annotated[list[str] | None, typer.Option(
        metavar="FORMAT", help="parquet and/or pt (torch tensors); repeat for both; default "
        "parquet")] = None,
    rows_per_shard: Annotated[int, typer.Option(metavar="N", help="rows per shard")] = 4096,
    row_group_mb: Annotated[int, typer.Option(
        metavar="MIB", help="max MiB of Arrow data per row group")] = 64,
    tensor_layout: Annotated[str, typer.Option(
        metavar="LAYOUT", help="layout of .pt shards: packed or padded")] = "packed",
    pad_token_id: Annotated[int, typer.Option(metavar="ID", help="pad id of padded .pt shards")]
        = 0,
    # one flag, not --progress/--no-progress: the pair's width squeezed every description of
    # this help to a narrow column; the bar is on by default, so only its opposite is needed
    no_progress: Annotated[bool, typer.Option(
        "--no-progress", help="no progress bar (for cron jobs and logs)")] = False,
    progress: Annotated[bool, typer.Option(
        "--progress", hidden=True, help="show the progress bar (the default)")] = True,
    ray: Annotated[bool, typer.Option(
        "--ray", help="read the lake and write the shards on Ray workers (joins a running "
        "cluster, else starts one)")] = False,
) -> None:
    """Export the trained data of chosen steps/partitions as shards with a manifest (resumable).

    Examples:
        replaylake export --lake runs/demo/latest/lake --out runs/export
        replaylake export --lake runs/demo/latest/lake --out late --steps 5:20
        replaylake export runs/demo/latest/lake --out runs/export
    """
    from jobs.cli import fail, one_lake
    lake = one_lake("export", lake_arg, lake_opt)
    if out is None:
        fail("missing option '--out' (try: replaylake export --help)")
    cfg = ExportConfig(lake=lake, out=out, partitions=tuple(partition or ()),
                       steps=parse_steps(steps), formats=tuple(format or ("parquet",)),
                       rows_per_shard=rows_per_shard, row_group_mb=row_group_mb,
                       tensor_layout=tensor_layout, pad_token_id=pad_token_id,
                       progress=progress and not no_progress)
    source = None
    if ray:
        from jobs.export.ray import RayRows
        source = RayRows()
    result = export(cfg, source)
    rows = sum(p["rows"] for p in result["partitions"].values())
    damaged = f", {result['repaired']:,} of them damaged and rewritten" if result["repaired"] else ""
    typer.echo(f"exported {rows:,} rows in {len(result['shards']):,} shard(s) "
               f"({result['written']:,} written{damaged}, {result['skipped']:,} already complete) "
               f"to {out}")
    if ray:
        nodes = {node for node, _ in result["writers"]}
        typer.echo(f"shards written by {len(result['writers'])} Ray worker process(es) on "
                   f"{len(nodes)} node(s)")


if __name__ == "__main__":
    from jobs.cli import run
    run(main)       # through the one handler of user errors
