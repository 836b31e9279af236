"""The figures `replaylake whatif` prints for a recorded run and its replay, and what a replay
can stand behind.

The figures are one named query (`whatif_figures`) over each lake. A replay cannot make every
figure real, and the table says so in the cell itself rather than in a footnote read after it:

* Rows "from the future" (newest weight version not older than the step) exist only in a
  replay: each rollout keeps its recorded weight version, and a replay that evicts more reaches
  rollouts the recorded run generated later. Their staleness reads below zero, which no live
  run can train at. Where a lake has such rows, each staleness cell shows the floor instead
  (those rows counted at staleness 0, the least a live run could have trained them at) as
  ``>= x``, or ``-`` where there is nothing to floor (the per-token figure of a lake whose
  rows report no version spans).
* Every approximation the replay made for the settings asked for is one line under the table
  (`approximations`): recorded arrival times, rows that `wait` trained above the bound because
  the recorded rollout side ran ahead, rows that `mask` trained with their loss off, refills
  the record could not serve or asked for at another step, recorded calls that handed out no
  batch, (in a comparison) the sample calls whose batch never filled, the calls that filled
  only by polling past the recorded call, and (last) the rows from the future behind the
  floors.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.analysis.whatif.outcome import (
    Outcome,
    future_summary,
    no_batch_summary,
    refill_timing_summary,
    unfilled_summary,
    waited_summary,
)

ROWS = ("batches", "trained_rows", "evicted", "staleness_mean", "staleness_max",
        "token_staleness_exact_mean", "over_bound_rows", "future_rows")
# the staleness figures a row from the future makes impossible, and the floor shown instead
FLOORS = {"staleness_mean": "staleness_mean_floor", "staleness_max": "staleness_max_floor",
          "token_staleness_exact_mean": "token_staleness_exact_mean_floor"}


def figures(lake: Path, filter_metric: str | None) -> dict[str, Any]:
    """The `whatif_figures` row of one lake, with its evictions per reason."""
    from pipeline.analysis import connect
    from sql import loader
    con = connect(lake, filter_metric=filter_metric)
    row = loader.run(con, "whatif_figures").to_pylist()[0]
    by_reason: dict[str, int] = {}
    for r in loader.run(con, "evictions_by_reason").to_pylist():
        by_reason[r["reason"]] = by_reason.get(r["reason"], 0) + r["n_groups"]
    row["evicted_by_reason"] = by_reason
    return row


def cell(figs: dict[str, Any], key: str) -> str:
    """One cell of the table: the figure, or its floor marked ``>=`` where rows from the future
    make the figure itself impossible."""
    if key in FLOORS and figs["future_rows"]:
        floor = figs[FLOORS[key]]
        return "-" if floor is None else ">= " + _fmt(floor)
    return _fmt(figs[key])


def table(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The comparison, one line per figure and per eviction reason (80 columns)."""
    lines = [f"{'':28}{'recorded':>12}{'what-if':>12}"]
    lines += [f"{key:28}{cell(before, key):>12}{cell(after, key):>12}" for key in ROWS]
    for reason in sorted(set(before["evicted_by_reason"]) | set(after["evicted_by_reason"])):
        lines.append(f"{'evicted: ' + reason:28}{before['evicted_by_reason'].get(reason, 0):>12,}"
                     f"{after['evicted_by_reason'].get(reason, 0):>12,}")
    return lines


def approximations(after: dict[str, Any], outcome: Outcome, calls: int, identical: int,
                   chosen: dict[str, Any], unfilled: bool = False,
                   recorded_evicted: int | None = None) -> list[str]:
    """What the replay approximated for these settings, one sentence each (none when it
    reproduced every recorded batch and, where ``recorded_evicted`` gives the recorded run's
    evictions, as many evictions). ``unfilled``: name the sample calls whose batch never
    filled too (the single-policy line names them itself)."""
    same_evictions = recorded_evicted is None or recorded_evicted == after["evicted"]
    unused = _unused(chosen)
    if identical == calls and not outcome.refill_shortfall and same_evictions:
        return unused
    out = unused + ([outcome.settings_changed] if outcome.settings_changed else [])
    out += ["arrivals: every rollout keeps its recorded arrival order and weight version; a "
           "replay cannot re-time generation (a live run with these settings would also have "
           "dispatched differently)"]
    if chosen.get("max_off_policy_strategy") == "wait" and after["over_bound_rows"]:
        out.append(f"wait: {after['over_bound_rows']:,} of {after['trained_rows']:,} trained "
                   f"rows were trained above the bound (group span > "
                   f"{chosen.get('max_off_policy_threshold')}): `wait` never evicts for "
                   "staleness, and in the recorded timing the rollout side ran ahead of the "
                   "trainer, so finished groups waited in the buffer. A live `wait` run trains "
                   "above the bound as much only if its rollout side runs as far ahead")
    if chosen.get("max_off_policy_strategy") == "mask" and after["over_bound_rows"]:
        out.append(f"mask: {after['over_bound_rows']:,} of {after['trained_rows']:,} trained "
                   f"rows are masked (group span > {chosen.get('max_off_policy_threshold')}, "
                   "trained with their loss off, counted in the staleness figures); how many "
                   "go stale depends on the recorded arrival timing above")
    if outcome.refill_shortfall:
        out.append(f"refills: {outcome.refill_shortfall:,} refilled group(s) the replay asked "
                   "for were never generated in the recorded run, so its batches trained other "
                   "groups or stayed short")
    if outcome.refill_undrawn:
        out.append(_undrawn_summary(outcome))
    short = unfilled_summary(outcome, calls) if unfilled else None
    more = (refill_timing_summary(outcome), no_batch_summary(outcome), short,
            waited_summary(outcome, calls), future_summary(outcome, calls))
    return out + [x for x in more if x is not None]


def _unused(chosen: dict[str, Any]) -> list[str]:
    """Settings the chosen preset takes but does not act on (the sync preset and staleness)."""
    given = [k for k in ("max_off_policy_threshold", "max_off_policy_strategy")
             if chosen.get(k) is not None]
    if chosen.get("preset") != "sync" or not given:
        return []
    return [f"staleness: the sync preset ignores {' and '.join(given)} (verl's sync buffer "
            "trains on-policy: nothing is evicted, held or masked for staleness), so in this "
            "replay they change nothing"]


def _undrawn_summary(outcome: Outcome) -> str:
    """The recorded refill groups the replay never asked for; and, only where some recorded
    refill_fn registered its groups after the run had moved on, that the attribution of those
    groups is a guess."""
    line = (f"refills: {outcome.refill_undrawn:,} group(s) the recorded refills registered "
            "were never asked for by the replay, so they are not in it")
    if not outcome.refill_late:
        return line
    return (f"{line}. The replay takes the registrations of the asking partition right after "
            f"each recorded refill decision for that refill's groups, and {outcome.refill_late:,} "
            "of them were registered only after the run's next decision (the recorded "
            "refill_fn returned before registering them): groups the trainer or another "
            "producer registered meanwhile may be among them (check with the decision_log "
            "query)")


def _fmt(v: object) -> str:
    """A figure: '-' where there is none (a policy that trained nothing has no staleness)."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}"
    return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v)
