"""The demo's closing what-if: its own lake replayed under a tighter and a looser staleness
bound and under `admit`, over the first steps of the run, as one short table.

Why at the end of the demo: the run just made is the cheapest evidence of what the bound buys
(how much generation a tighter bound throws away, how stale a looser one trains, what admission
would never have dispatched). Only the first ``whatif_calls`` sample calls are replayed, so it
takes a few seconds; the command printed under the table compares the whole run, with every
figure and the notes on what a replay approximates.

A run made under `admit` gets no table (a replay cannot pace dispatches: its recorded row
would have nothing to reproduce), nor does a run without a bound (no tighter or looser one), nor
a resumed run (its lake holds re-issued groups, which a replay cannot re-issue).
"""
from __future__ import annotations

import time
from pathlib import Path

from jobs.demo.config import DemoConfig
from jobs.demo.shell import pasteable, program
from jobs.demo.summary import format_command


def policies(t: int) -> list[str]:
    """The compared settings for a run bounded at ``t``: the bound one tighter (when there is a
    tighter one), doubled, and admit at the run's bound."""
    return [*([f"threshold={t - 1}"] if t > 1 else []), f"threshold={2 * t}", "strategy=admit"]


def closing_whatif(cfg: DemoConfig, lake: Path, run_dir: Path, cwd: Path | None = None,
                   resumed: bool = False) -> list[str]:
    """Lines of at most 80 columns: the table and the command for the full comparison (or one
    line saying why there is none)."""
    why = ("no staleness bound" if cfg.threshold is None else
           "made under admit, which a replay cannot pace" if cfg.strategy == "admit" else
           "resumed: a replay cannot re-issue groups" if resumed else
           "--whatif-calls 0" if cfg.whatif_calls == 0 else None)
    if why is not None or cfg.threshold is None:
        return [f"What-if: none for this run ({why})."]
    from pipeline.analysis.whatif import compare_brief, compare_policies
    texts = policies(cfg.threshold)
    start = time.perf_counter()
    cmp = compare_policies(lake, texts, max_calls=min(cfg.whatif_calls, cfg.steps))
    took = time.perf_counter() - start
    lines = [f"[bold]What if[/] (this run's lake replayed under other settings, {took:.0f} s)",
             *compare_brief(cmp)]
    lines.append("  # the whole run, every figure, and what each replay approximates:")
    lines += format_command(["whatif", "--lake", pasteable(lake, cwd=cwd), "--compare", *texts,
                             "--out", pasteable(run_dir / "whatif", cwd=cwd)],
                            prog=program("replaylake", cwd=cwd))
    return lines
