"""`replaylake compact`: rewrite the lake's sealed IPC segments as zstd Parquet (pipeline.lake.compaction).

    replaylake compact --lake runs/demo/latest/lake

Safe while a buffer writes (a live writer's open segments are left for a later run), idempotent,
one compaction or retention per lake at a time. Prints what it did and its throughput.
"""
from __future__ import annotations

import time
from typing import Annotated

import typer

from jobs.cli import LakeArg, LakeOpt, one_lake


def main(
    lake_arg: LakeArg = None,
    lake_opt: LakeOpt = None,
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
) -> None:
    """Compact every sealed segment of a lake into Parquet (safe while a buffer writes).

    Examples:
        replaylake compact --lake runs/demo/latest/lake
        replaylake compact runs/demo/latest/lake
    """
    from tqdm import tqdm

    from jobs.cli import echo_wrapped
    from jobs.progress import hidden
    from pipeline.lake import compact, require_lake

    lake = one_lake("compact", lake_arg, lake_opt)
    require_lake(lake)                       # before the progress bar starts
    start = time.perf_counter()
    with tqdm(unit="segment", desc="compact", disable=hidden(progress)) as bar:
        def tick(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)
        r = compact(lake, progress=tick)
    took = time.perf_counter() - start
    mb = r.bytes_in / 1e6
    echo_wrapped(f"compacted {len(r.compacted):,} segment(s), {r.rows:,} row(s): {mb:.1f} MB of Arrow "
                 f"-> {r.bytes_out / 1e6:.1f} MB of Parquet in {took:.2f} s "
                 f"({mb / took if took else 0.0:.1f} MB/s); {r.skipped_open} left to the open "
                 f"writer; {r.cleaned} leftover(s) of an interrupted run removed")


if __name__ == "__main__":
    from jobs.cli import run
    run(main)       # through the one handler of user errors
