"""`replaylake whatif`: replay a recorded run with other eviction settings and print what changes.

    replaylake whatif --lake runs/demo/latest/lake --threshold 1
    replaylake whatif --lake runs/demo/latest/lake --filter-metric none --max-response-length 12
    replaylake whatif --lake runs/demo/latest/lake --rule short_response.min_response_length=4
    replaylake whatif --lake runs/demo/latest/lake --rule overlong=off
    replaylake whatif --lake runs/demo/latest/lake --selection-order spread_first

Settings not given are the lake's recorded ones, so `replaylake whatif --lake L` alone replays
the run as it was and must reproduce every batch (it says so, or names the first difference).
"""
from __future__ import annotations

import textwrap
import time
from pathlib import Path
from typing import Annotated

import typer


def main(
    lake: Annotated[Path, typer.Option("--lake", metavar="DIR", help="the recorded lake")],
    threshold: Annotated[int | None, typer.Option(
        "--threshold", metavar="N", help="max_off_policy_threshold")] = None,
    strategy: Annotated[str | None, typer.Option(
        "--strategy", metavar="drop|wait|mask", help="max_off_policy_strategy: drop | wait | "
        "mask (admit is refused: a replay cannot pace the recorded dispatches)")] = None,
    filter_metric: Annotated[str | None, typer.Option(
        "--filter-metric", metavar="NAME", help="filter_groups_metric ('none': no filter)")]
    = None,
    max_response_length: Annotated[int | None, typer.Option(
        "--max-response-length", metavar="N", help="evict groups with longer responses")] = None,
    rule: Annotated[list[str] | None, typer.Option(
        "--rule", metavar="RULE.PARAM=VALUE", help="set an opt-in rule's parameter, or RULE=off "
        "(repeatable; the recorded rules stay as they were unless named)")] = None,
    selection_order: Annotated[str | None, typer.Option(
        "--selection-order", metavar="oldest|spread_first|oldest_version",
        help="which candidates a sample takes first: oldest dispatch (verl's order), widest "
        "metric spread, or oldest weight version")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", metavar="DIR", help="keep the replay's lake here (default: a temp dir)")] = None,
) -> None:
    """Replay a recorded run with other settings; print batches, evictions and staleness.

    Examples:
        replaylake whatif --lake runs/demo/latest/lake --threshold 1
        replaylake whatif --lake runs/demo/latest/lake --strategy wait
    """
    from pipeline.analysis.whatif import approximations, figures, recorded, recorded_settings, replay, table
    from pipeline.config import rules_from_options
    settings = {"max_off_policy_threshold": threshold, "max_off_policy_strategy": strategy,
                "filter_groups_metric": filter_metric, "max_response_length":
                max_response_length, "rules": rules_from_options(rule or ()) or None,
                "selection_order": selection_order}
    base = recorded_settings(lake)
    if filter_metric == "none":
        settings["filter_groups_metric"] = None
        base["filter_groups_metric"] = None
    t0 = time.perf_counter()
    result = replay(lake, out, **{k: v for k, v in settings.items() if v is not None})
    took = time.perf_counter() - t0
    rec = recorded(lake)
    metric_new = settings["filter_groups_metric"] or base["filter_groups_metric"]
    before, after = figures(lake, base["filter_groups_metric"]), figures(result.lake, metric_new)
    same = sum(a == b for a, b in zip(rec.batches, result.batches))
    typer.echo(f"replayed {len(rec.batches)} sample calls in {took:.1f} s")
    for line in table(before, after):
        typer.echo(line)
    typer.echo(textwrap.fill(
        f"identical batches: {same} of {len(rec.batches)}; unfilled steps: "
        f"{result.unfilled or 'none'}; refills the record could not serve: "
        f"{result.refill_shortfall}", 80, subsequent_indent="  "))
    chosen = {**base, **{k: v for k, v in settings.items() if v is not None}}
    notes = approximations(after, result, len(rec.batches), same, chosen)
    if notes:
        typer.echo("what the replay approximates:")
        for note in notes:
            typer.echo(textwrap.fill(note, 80, initial_indent="  - ", subsequent_indent="    "))


if __name__ == "__main__":
    from jobs.cli import run
    run(main)       # through the one handler of user errors
