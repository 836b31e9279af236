"""`replaylake whatif`: replay a recorded run with other eviction settings and print what changes.

    replaylake whatif --lake runs/demo/latest/lake --threshold 1
    replaylake whatif --lake runs/demo/latest/lake --filter-metric none --max-response-length 12
    replaylake whatif --lake runs/demo/latest/lake --rule short_response.min_response_length=4
    replaylake whatif --lake runs/demo/latest/lake --rule overlong=off
    replaylake whatif --lake runs/demo/latest/lake --selection-order spread_first

    replaylake whatif --lake runs/demo/latest/lake --compare threshold=1 threshold=4 \
        strategy=wait strategy=admit strategy=mask --out whatif/

Settings not given are the lake's recorded ones, so `replaylake whatif --lake L` alone replays
the run as it was and must reproduce every batch (it says so, or names the first difference).
`--compare` replays once per KEY=VALUE[,KEY=VALUE...] item and prints one table, one row per
policy (pipeline.analysis.whatif.compare); with `--out` it also writes the table as Parquet and
an HTML page with plots; `--calls N` compares over the first N sample calls only (the
recorded row is then a replay of the recorded settings over the same calls).
"""
from __future__ import annotations

import textwrap
import time
from pathlib import Path
from typing import Annotated

import typer


def main(
    lake: Annotated[Path, typer.Option("--lake", metavar="DIR", help="the recorded lake")],
    threshold: Annotated[str | None, typer.Option(
        "--threshold", metavar="N", help="the staleness bound, max_off_policy_threshold: "
        "an int, or 'none' for no bound")] = None,
    strategy: Annotated[str | None, typer.Option(
        "--strategy", metavar="NAME", help="what to do with stale groups, "
        "max_off_policy_strategy: drop, wait or mask (admit is refused: a replay cannot pace "
        "the recorded dispatches)")] = None,
    filter_metric: Annotated[str | None, typer.Option(
        "--filter-metric", metavar="NAME", help="filter_groups_metric ('none': no filter)")]
    = None,
    max_response_length: Annotated[int | None, typer.Option(
        "--max-response-length", metavar="N", help="evict groups with longer responses")] = None,
    rule: Annotated[list[str] | None, typer.Option(
        "--rule", metavar="RULE.PARAM=VALUE", help="set an opt-in rule's parameter, or RULE=off "
        "(repeatable; the recorded rules stay as they were unless named)")] = None,
    selection_order: Annotated[str | None, typer.Option(
        "--selection-order", metavar="ORDER",
        help="which candidates a sample takes first: oldest (oldest dispatch, verl's order), "
        "spread_first (widest metric spread) or oldest_version (oldest weight version)")]
    = None,
    out: Annotated[Path | None, typer.Option(
        "--out", metavar="DIR", help="keep the replay's lake in DIR/lake (a new one; "
        "default: a temp dir); with --compare: write compare.parquet, datasets.parquet, "
        "whatif.html and the replays' lakes (replays/) here")] = None,
    compare: Annotated[bool, typer.Option(
        "--compare", help="replay once per POLICY given after the options and print one table, "
        "one row per policy plus the recorded run")] = False,
    calls: Annotated[int | None, typer.Option(
        "--calls", metavar="N", help="with --compare: only the first N recorded sample calls, "
        "each policy fed the rollouts the recorded run had by then (a quick look at a long "
        "run)")] = None,
    policies: Annotated[list[str] | None, typer.Argument(
        metavar="[POLICY]...", help="with --compare: KEY=VALUE[,KEY=VALUE...], KEY a buffer "
        "keyword or threshold | strategy | filter_metric | rule (RULE.PARAM=VALUE or RULE=off); "
        "VALUE read as JSON, else as a string, 'none' for None", show_default=False)] = None,
) -> None:
    """Replay a recorded run with other settings; print batches, evictions and staleness.

    Examples:
        replaylake whatif --lake runs/demo/latest/lake --threshold 1
        replaylake whatif --lake runs/demo/latest/lake --strategy wait
        replaylake whatif --lake runs/demo/latest/lake --compare threshold=1
    """
    from pipeline.analysis.whatif import (
        approximations,
        figures,
        recorded,
        recorded_settings,
        replay,
        step_ranges,
        table,
    )
    from pipeline.config import rules_from_options
    from pipeline.errors import ConfigError
    single = {"--threshold": threshold, "--strategy": strategy, "--filter-metric": filter_metric,
              "--max-response-length": max_response_length, "--rule": rule,
              "--selection-order": selection_order}
    if compare or policies:
        _compare(lake, policies or [], out, [k for k, v in single.items() if v is not None],
                 compare, calls)
        return
    if calls is not None:
        raise ConfigError("--calls windows a --compare (its recorded row is replayed over the "
                          "same calls); give --compare with POLICY items, or leave --calls out")
    settings = {"max_off_policy_strategy": strategy, "max_response_length": max_response_length,
                "rules": rules_from_options(rule or ()) or None, "selection_order": selection_order}
    base = recorded_settings(lake)
    given = {k: v for k, v in settings.items() if v is not None}
    if threshold is not None:                 # None (no bound) is a value of its own
        given["max_off_policy_threshold"] = _threshold(threshold)
    if filter_metric is not None:
        given["filter_groups_metric"] = None if filter_metric == "none" else filter_metric
    t0 = time.perf_counter()
    result = replay(lake, out, **given)
    took = time.perf_counter() - t0
    rec = recorded(lake)
    metric_new = given.get("filter_groups_metric", base["filter_groups_metric"])
    before, after = figures(lake, base["filter_groups_metric"]), figures(result.lake, metric_new)
    same = sum(a == b for a, b in zip(rec.batches, result.batches))
    typer.echo(_replayed(len(rec.batches), len(rec.no_batch), took))
    for line in table(before, after):
        typer.echo(line)
    typer.echo(textwrap.fill(
        f"identical batches: {same} of {len(rec.batches)}; unfilled steps: "
        f"{step_ranges(result.unfilled)}; refills the record could not serve: "
        f"{result.refill_shortfall}", 80, subsequent_indent="  "))
    chosen = {**base, **given}
    notes = approximations(after, result, len(rec.batches), same, chosen,
                           recorded_evicted=before["evicted"])
    if notes:
        typer.echo("what the replay approximates:")
        for note in notes:
            typer.echo(textwrap.fill(note, 80, initial_indent="  - ", subsequent_indent="    "))


def _compare(lake: Path, policies: list[str], out: Path | None, single: list[str],
             flag: bool, calls: int | None) -> None:
    from pipeline.analysis.whatif import compare_lines, compare_policies, write_compare
    from pipeline.errors import ConfigError
    if not flag:
        raise ConfigError(f"whatif got {policies[0]!r} without --compare: give --compare to "
                          "replay several policies, or the single-policy options alone")
    if not policies:
        raise ConfigError("--compare needs at least one POLICY after the options, e.g. "
                          "`whatif --lake L --compare threshold=1 strategy=wait`")
    if calls is not None and calls < 1:
        raise ConfigError(f"--calls {calls}: give a number of sample calls >= 1")
    if single:
        raise ConfigError(f"--compare takes the settings as POLICY items, not {', '.join(single)}"
                          f": write them as items (e.g. {_item(single[0])})")
    cmp = compare_policies(lake, policies, out, progress=lambda label: typer.echo(
        f"replaying {label} ...", err=True), max_calls=calls)
    for line in compare_lines(cmp):
        typer.echo(line)
    if out is not None:
        from pipeline.analysis.whatif import write_page
        paths = [*write_compare(cmp, out), write_page(cmp, out)]
        typer.echo("wrote:")
        for path in paths:
            typer.echo(f"  {path}")


def _replayed(calls: int, no_batch: int, took: float) -> str:
    """The first line: how many recorded calls were replayed, and how long it took."""
    also = f" and {no_batch} that handed out no batch" if no_batch else ""
    return f"replayed {calls} sample calls{also} in {took:.1f} s"


def _threshold(text: str) -> int | None:
    """``--threshold``: an int, or 'none' / 'off' for no staleness bound (None)."""
    from pipeline.errors import ConfigError
    if text.strip().lower() in ("none", "off"):
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"--threshold {text!r}: give a whole number of steps (e.g. 2), or "
                          "'none' for no staleness bound") from None


def _item(flag: str) -> str:
    return {"--rule": "rule=overlong=off", "--filter-metric": "filter_metric=none",
            "--strategy": "strategy=wait", "--selection-order": "selection_order=spread_first"}.get(
        flag, f"{flag.removeprefix('--').replace('-', '_')}=1")


if __name__ == "__main__":
    from jobs.cli import run
    run(main)       # through the one handler of user errors
