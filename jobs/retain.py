"""`replaylake retain`: drop the token payload of old released/evicted/discarded groups
(pipeline.lake.retention); the decision log, group events, metrics and every row's metadata stay.

    replaylake retain --lake runs/demo/latest/lake --older-than 100

Compacts first (only compacted files are rewritten). Safe while a buffer writes, idempotent.
"""
from __future__ import annotations

from typing import Annotated

import typer

from jobs.cli import LakeArg, LakeOpt, one_lake


def main(
    older_than: Annotated[int, typer.Option(
        "--older-than", metavar="STEPS",
        help="drop the payload of groups whose release/eviction/discard is more than STEPS "
             "steps older than the newest step in the lake")],
    lake_arg: LakeArg = None,
    lake_opt: LakeOpt = None,
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
) -> None:
    """Physically drop the token payload of groups gone for more than STEPS steps.

    Examples:
        replaylake retain --lake runs/demo/latest/lake --older-than 100
        replaylake retain runs/demo/latest/lake --older-than 100
    """
    from tqdm import tqdm

    from jobs.cli import echo_wrapped
    from jobs.progress import hidden
    from pipeline.lake import require_lake, retain

    if older_than < 0:                       # checked, like the lake, before the progress bar
        raise typer.BadParameter(f"--older-than {older_than}: give a number of steps >= 0")
    lake = one_lake("retain", lake_arg, lake_opt)
    require_lake(lake)
    with tqdm(unit="file", desc="retain", disable=hidden(progress)) as bar:
        def tick(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)
        r = retain(lake, older_than, progress=tick)
    c = r.compaction
    first = f"compacted {len(c.compacted) if c else 0:,} segment(s) first; "
    if r.horizon is None or r.horizon < 0:     # the lake's history is shorter than --older-than
        newest = "no step decided yet" if r.horizon is None else \
            f"the newest step is {r.horizon + older_than:,}"
        echo_wrapped(f"{first}nothing is {older_than:,} steps old yet ({newest}): no payload "
                     "dropped")
        return
    echo_wrapped(f"{first}horizon step {r.horizon:,}: {r.groups:,} group(s) old enough, payload "
                 f"dropped from {r.rows:,} trajectory row(s) in {len(r.rewritten):,} file(s) "
                 f"({r.bytes_before / 1e6:.1f} MB -> {r.bytes_after / 1e6:.1f} MB)")


if __name__ == "__main__":
    from jobs.cli import run
    run(main)       # through the one handler of user errors
