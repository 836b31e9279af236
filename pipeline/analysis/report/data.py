"""What the staleness report shows, read from the lake with the named SQL queries.

Everything comes through the read-only, out-of-core connection (`pipeline.analysis.views.connect`), so
the token payload is never read. The per-step queries return small aggregates (a few rows per
step); the step window (``--steps A:B``) is applied to them here, except for the headline
numbers, whose query takes the window as parameters. A report describes trained batches, so a
lake (or a window) without any is an error that says so, not an empty page; a window outside
the trained steps is refused before any query runs, naming the steps the run trained.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError, ReplayLakeError

# the named queries the report runs, in order (each one progress tick)
QUERIES = ("report_headline", "staleness_by_step", "trained_distribution", "evictions_by_reason",
           "filtered_rewards", "occupancy_by_step", "selection_bias")
# where each query's step column lives (selection_bias is per dispatch step)
_STEP_COLUMN = {"selection_bias": "dispatch_step"}
# the Prompts section: its query (one more progress tick) and how many prompts per board
PROMPTS_QUERY = "prompt_leaders"
COVERAGE_QUERY = "lake_coverage"       # what the trajectories hold (rewards, response tokens)
PROMPTS_TOP = 10
_LAST_STEP = 2**62
SMOOTH_FROM = 60        # from this many steps on, figure lines are smoothed and heatmaps binned
HEATMAP_COLUMNS = 60
# derived views several of the report's queries read: computed once per report (see `gather`)
SHARED_VIEWS = ("groups", "provenance")


class ReportError(ReplayLakeError, ValueError):
    """The report cannot be made as asked: nothing trained yet, or a bad step window."""


Rows = list[dict[str, Any]]


@dataclass(frozen=True)
class PartitionData:
    """One partition's rows of every query (already cut to the step window)."""

    name: str
    headline: dict[str, Any]
    tables: dict[str, Rows] = field(default_factory=dict)
    prompts: Rows = field(default_factory=list)     # prompt_leaders rows (whole lake)
    missing: tuple[str, ...] = ()   # what its trajectories lack: "rewards", "response tokens"


@dataclass(frozen=True)
class ReportData:
    """The lake, its recorded configuration and what each partition's figures show."""

    lake: Path
    steps: tuple[int | None, int | None]      # the window asked for (None = open end)
    config: dict[str, Any] | None             # the configuration in force (newest recorded)
    config_versions: int                      # how many configurations the lake recorded
    partitions: list[PartitionData]


def _missing(coverage: dict[str, Any]) -> tuple[str, ...]:
    """What a partition's trajectories lack entirely (a `lake_coverage` row): rewards (every one
    null), response tokens (every `n_response_tokens` 0)."""
    if not coverage["n_rows"]:
        return ()
    return tuple(what for what, none in (("rewards", coverage["n_rewards"] == 0),
                                         ("response tokens", coverage["response_tokens"] == 0))
                 if none)


def parse_steps(text: str | None) -> tuple[int | None, int | None]:
    """``A:B``, ``A``, ``A:`` or ``:B`` (inclusive trainer steps) into a pair; None or ``:`` is
    all."""
    if text is None or text.strip() in ("", ":"):
        return (None, None)
    parts = text.split(":")
    try:
        if len(parts) > 2:
            raise ValueError(text)
        lo, hi = (int(p) if p.strip() else None for p in (parts * 2)[:2])
    except ValueError as exc:
        raise ReportError(f"--steps {text!r}: write A:B (inclusive trainer steps), A, A: or "
                          ":B") from exc
    if any(s is not None and s < 0 for s in (lo, hi)):
        raise ReportError(f"--steps {text!r}: trainer steps count from 0; write A:B with "
                          "0 <= A <= B")
    if lo is not None and hi is not None and lo > hi:
        raise ReportError(f"--steps {text!r}: the first step is after the last")
    return (lo, hi)


def _in_window(step: Any, lo: int | None, hi: int | None) -> bool:
    return step is not None and (lo is None or step >= lo) and (hi is None or step <= hi)


def _window_text(steps: tuple[int | None, int | None]) -> str:
    lo, hi = steps
    if steps == (None, None):
        return ""
    if lo == hi:
        return f" in step {lo}"
    return f" in steps {'' if lo is None else lo}:{'' if hi is None else hi}"


def trained_steps(con: Any, partitions: list[str] | None) -> dict[str, list[int]]:
    """Per partition (those named, else all), the steps that handed out a batch, ascending:
    read from the decision log alone, so it costs little next to the report's queries."""
    rows = con.execute("select partition, list(distinct step order by step) from decisions "
                       "where kind = 'select' group by partition order by partition").fetchall()
    return {p: steps for p, steps in rows if not partitions or p in partitions}


def check_window(con: Any, root: Path, steps: tuple[int | None, int | None],
                 partitions: list[str] | None) -> None:
    """Refuse a step window in which nothing was trained before any query runs, naming the
    steps the run did train. A lake that trained nothing is left to `gather`'s own message."""
    trained = trained_steps(con, partitions)
    lo, hi = steps
    if steps == (None, None) or not trained:
        return
    if any(_in_window(s, lo, hi) for ss in trained.values() for s in ss):
        return
    first = min(ss[0] for ss in trained.values())
    last = max(ss[-1] for ss in trained.values())
    each = ", ".join(f"{p} {ss[0]}..{ss[-1]}" for p, ss in trained.items())
    raise ReportError(f"nothing to report for {root}{_window_text(steps)}: no batch was handed "
                      f"out there; the run trained steps {first}..{last} (partition"
                      f"{'s' if len(trained) > 1 else ''} {each}). "
                      "Give --steps inside them.")


def materialise(con: Any, views: tuple[str, ...]) -> None:
    """Compute ``views`` once into temporary tables of the same name, which every later query
    of this connection (and the views built on them) reads instead of recomputing the view.

    The report's queries share `groups` (headline, selection bias) and `provenance` (headline,
    per-step staleness, trained distribution, selection bias), each a scan and join over the
    whole lake; a temporary table lives in the connection's memory and goes with it."""
    db = con.sql("select current_database()").fetchall()[0][0]
    for view in views:
        con.execute(f'create or replace temp table {view} as select * from "{db}".main.{view}')


def gather(lake: str | os.PathLike, *, steps: tuple[int | None, int | None] = (None, None),
           partitions: list[str] | None = None,
           progress: Callable[[str], None] | None = None) -> ReportData:
    """Run the report's queries on ``lake`` and keep what falls in ``steps``.

    ``partitions`` limits the report (default: every partition that trained a batch in the
    window). ``progress(name)`` is called after each query. The zero-variance values are
    those of the filter metric the lake recorded."""
    from pipeline.analysis.views import connect
    from pipeline.lake import config as lake_config
    from pipeline.lake import require_lake
    from sql import loader

    root = require_lake(lake)
    config = lake_config.current(root)
    recorded = lake_config.read(root)
    metric = (config or {}).get("filter_groups_metric") or "reward"
    try:
        con = connect(root, filter_metric=metric)
    except ConfigError:
        con = connect(root)
    check_window(con, root, steps, partitions)
    materialise(con, SHARED_VIEWS)
    lo, hi = steps
    results: dict[str, Rows] = {}
    for name in QUERIES:
        if name == "report_headline":
            rows = loader.run(con, name, first_step=-1 if lo is None else lo,
                              last_step=_LAST_STEP if hi is None else hi).to_pylist()
        else:
            col = _STEP_COLUMN.get(name, "step")
            rows = [r for r in loader.run(con, name).to_pylist() if _in_window(r[col], lo, hi)]
        results[name] = rows
        if progress is not None:
            progress(name)
    # prompt histories span the whole run: the step window does not cut them
    prompts = loader.run(con, PROMPTS_QUERY, top=PROMPTS_TOP).to_pylist()
    if progress is not None:
        progress(PROMPTS_QUERY)
    missing = {r["partition"]: _missing(r) for r in loader.run(con, COVERAGE_QUERY).to_pylist()}
    con.close()

    headlines = {r["partition"]: r for r in results["report_headline"]}
    trained = [p for p, r in headlines.items() if r["batches"] > 0]
    if partitions:
        unknown = sorted(set(partitions) - set(headlines))
        if unknown:
            raise ReportError(f"no partition {', '.join(map(repr, unknown))} in {root}; its "
                              f"partitions: {', '.join(sorted(headlines)) or 'none'}")
        trained = [p for p in partitions if p in trained]
    if not trained:
        what = "no group was registered" if not headlines else "no batch was handed out"
        raise ReportError(f"nothing to report for {root}{_window_text(steps)}: {what}. The report "
                          "describes trained batches; run it once the trainer has sampled.")
    parts = [PartitionData(p, headlines[p],
                           {n: [r for r in results[n] if r["partition"] == p]
                            for n in QUERIES if n != "report_headline"},
                           [r for r in prompts if r["partition"] == p], missing.get(p, ()))
             for p in sorted(trained)]
    return ReportData(root, steps, config, len((recorded or {}).get("versions", [])), parts)
