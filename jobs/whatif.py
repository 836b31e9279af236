"""`replaylake whatif`: replay a recorded run with other eviction settings and print what changes.

    replaylake whatif --lake runs/demo/latest/lake --threshold 1
    replaylake whatif --lake runs/demo/latest/lake --filter-metric none --max-response-length 12
    replaylake whatif --lake runs/demo/latest/lake --rule short_response.min_response_length=4
    replaylake whatif --lake runs/demo/latest/lake --rule overlong=off

Settings not given are the lake's recorded ones, so `replaylake whatif --lake L` alone replays
the run as it was and must reproduce every batch (it says so, or names the first difference).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

STATS = """
select
  (select count(*) from batches) as batches,
  (select count(*) from decisions where kind = 'evict') as evicted,
  (select coalesce(map_from_entries(list(struct_pack(k := reason, v := n))), map())
     from (select reason, count(*) as n from decisions where kind = 'evict' group by reason))
     as evicted_by_reason,
  (select avg(staleness) from provenance where not is_padding) as staleness_mean,
  (select max(staleness) from provenance where not is_padding) as staleness_max,
  (select sum(token_staleness_sum) / nullif(sum(span_tokens), 0) from provenance)
     as token_staleness_mean
"""


def stats(lake: Path, filter_metric: str | None) -> dict:
    """Batches, evictions per reason and staleness of one lake, read with SQL."""
    from pipeline.analysis import connect
    row = connect(lake, filter_metric=filter_metric).sql(STATS).to_arrow_table().to_pylist()[0]
    row["evicted_by_reason"] = dict(row["evicted_by_reason"] or {})
    return row


def main(
    lake: Annotated[Path, typer.Option("--lake", metavar="DIR", help="the recorded lake")],
    threshold: Annotated[int | None, typer.Option(
        "--threshold", metavar="N", help="max_off_policy_threshold")] = None,
    strategy: Annotated[str | None, typer.Option(
        "--strategy", metavar="drop|wait", help="max_off_policy_strategy: drop | wait "
        "(admit is refused: a replay cannot pace the recorded dispatches)")] = None,
    filter_metric: Annotated[str | None, typer.Option(
        "--filter-metric", metavar="NAME", help="filter_groups_metric ('none': no filter)")]
    = None,
    max_response_length: Annotated[int | None, typer.Option(
        "--max-response-length", metavar="N", help="evict groups with longer responses")] = None,
    rule: Annotated[list[str] | None, typer.Option(
        "--rule", metavar="RULE.PARAM=VALUE", help="set an opt-in rule's parameter, or RULE=off "
        "(repeatable; the recorded rules stay as they were unless named)")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", metavar="DIR", help="keep the replay's lake here (default: a temp dir)")] = None,
) -> None:
    """Replay a recorded run with other settings; print batches, evictions and staleness.

    Examples:
        replaylake whatif --lake runs/demo/latest/lake --threshold 1
        replaylake whatif --lake runs/demo/latest/lake --strategy wait
    """
    from pipeline.analysis.whatif import future_summary, recorded, recorded_settings, replay
    from pipeline.config import rules_from_options
    settings = {"max_off_policy_threshold": threshold, "max_off_policy_strategy": strategy,
                "filter_groups_metric": filter_metric, "max_response_length":
                max_response_length, "rules": rules_from_options(rule or ()) or None}
    base = recorded_settings(lake)
    if filter_metric == "none":
        settings["filter_groups_metric"] = None
        base["filter_groups_metric"] = None
    t0 = time.perf_counter()
    result = replay(lake, out, **{k: v for k, v in settings.items() if v is not None})
    took = time.perf_counter() - t0
    rec = recorded(lake)
    metric_new = settings["filter_groups_metric"] or base["filter_groups_metric"]
    before, after = stats(lake, base["filter_groups_metric"]), stats(result.lake, metric_new)
    same = sum(a == b for a, b in zip(rec.batches, result.batches))
    typer.echo(f"replayed {len(rec.batches)} sample calls in {took:.1f} s")
    typer.echo(f"{'':24}{'recorded':>14}{'what-if':>14}")
    for key in ("batches", "evicted", "staleness_mean", "staleness_max", "token_staleness_mean"):
        typer.echo(f"{key:24}{_fmt(before[key]):>14}{_fmt(after[key]):>14}")
    for reason in sorted(set(before["evicted_by_reason"]) | set(after["evicted_by_reason"])):
        typer.echo(f"{'evicted: ' + reason:24}{before['evicted_by_reason'].get(reason, 0):>14}"
                   f"{after['evicted_by_reason'].get(reason, 0):>14}")
    typer.echo(f"identical batches: {same} of {len(rec.batches)}; unfilled steps: "
               f"{result.unfilled or 'none'}; refills the record could not serve: "
               f"{result.refill_shortfall}")
    summary = future_summary(result, len(rec.batches))
    if summary is not None:
        typer.echo(summary)


def _fmt(v: object) -> str:
    return "NULL" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)


if __name__ == "__main__":
    from jobs.cli import run
    run(main)       # through the one handler of user errors
