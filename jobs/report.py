"""`replaylake report`: one self-contained HTML staleness report of a lake (figures embedded).

    replaylake report runs/demo/latest/lake -o report.html --steps 100:200

Reads the lake through the read-only SQL connection (never the token payload), so it is safe
while a buffer writes. Data: pipeline.analysis.report.data; figures: pipeline.analysis.report.figures; page:
pipeline.analysis.report.html.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from jobs.cli import LakeArg, LakeOpt, one_lake


def main(
    lake_arg: LakeArg = None,
    lake: LakeOpt = None,
    out: Annotated[Path, typer.Option(
        "--out", "-o", metavar="FILE", help="the HTML file to write")] = Path("report.html"),
    steps: Annotated[str | None, typer.Option(
        "--steps", metavar="A:B", help="only trainer steps A to B (inclusive; A: or :B), or "
        "step A alone")] = None,
    partition: Annotated[list[str] | None, typer.Option(
        "--partition", metavar="NAME", help="only this partition (repeat for more)")] = None,
    progress: Annotated[bool, typer.Option(help="show a progress bar on stderr")] = True,
) -> None:
    """Write an HTML report of a run's staleness, evictions, occupancy and selection bias.

    Examples:
        replaylake report runs/demo/latest/lake -o report.html
        replaylake report runs/demo/latest/lake -o window.html --steps 10:20
    """
    from tqdm import tqdm

    from jobs.progress import hidden
    from pipeline.analysis.report import QUERIES, gather, parse_steps
    from pipeline.lake import require_lake

    root = one_lake("report", lake_arg, lake)
    require_lake(root)                       # before the progress bar starts
    if out.is_dir():                         # refused before any work: the page is one file
        typer.echo(f"error: -o {out} is a directory; name the HTML file to write, e.g. "
                   f"-o {out / 'report.html'}", err=True)
        raise typer.Exit(2)
    window = parse_steps(steps)
    import matplotlib
    matplotlib.use("Agg")
    from pipeline.analysis.report import FIGURES, png_base64, render

    start = time.perf_counter()
    # one total from the start: a tick per query (and one for the Prompts section's), per
    # figure (drawn for every partition at once, so the count of partitions, known only after
    # the queries, does not change it) and one for writing the page
    ticks = len(QUERIES) + 1 + len(FIGURES) + 1
    with tqdm(total=ticks, unit="stage", desc="report", disable=hidden(progress)) as bar:
        data = gather(root, steps=window, partitions=partition,
                      progress=lambda name: (bar.set_postfix_str(name), bar.update()))
        drawn: dict[str, list[tuple[str, str, str, str]]] = {p.name: [] for p in data.partitions}
        for spec in FIGURES:
            bar.set_postfix_str(spec.key)
            for p in data.partitions:
                drawn[p.name].append((spec.key, spec.title, spec.caption,
                                      png_base64(spec.draw(p))))
            bar.update()
        page = render(data, drawn.__getitem__, took_s=time.perf_counter() - start)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp")
        try:                                 # the page appears whole or not at all
            tmp.write_text(page, encoding="utf-8")
            tmp.replace(out)
        finally:
            tmp.unlink(missing_ok=True)
        bar.set_postfix_str("written")
        bar.update()
    n_fig = sum(len(v) for v in drawn.values())
    typer.echo(f"wrote {out} ({len(page.encode()) / 1e6:.1f} MB, {n_fig} figures, partitions "
               f"{', '.join(drawn)}) in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    from jobs.cli import run
    run(main)       # through the one handler of user errors
