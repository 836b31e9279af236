"""The staleness report's figures: one matplotlib Figure per question, drawn from `analysis.report.data`.

Drawn with the primitives of `analysis.report.plot` (Agg canvas, no pyplot) and encoded as PNG. Import
this module only where matplotlib is wanted (the command imports it inside the job, so
`replaylake --help` never pays for it). Each figure has a caption (`FIGURES`)
saying how to read it; a figure without data says so inside its axes instead of showing empty ones.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from pipeline.analysis.report import plot
from pipeline.analysis.report.data import PartitionData
from pipeline.analysis.report.plot import png_base64
from pipeline.numbers_text import value_text

__all__ = ["FIGURES", "FigureSpec", "png_base64"]

REASON_COLORS = {"stale": "#d62728", "zero_variance": "#1f77b4", "failure": "#7f7f7f",
                 "overlong": "#9467bd"}
STATUS_COLORS = {"pending": "#c7c7c7", "running": "#ffbb78", "finished": "#2ca02c",
                 "failure": "#7f7f7f"}
OUTSIDE = {"loc": "upper left", "bbox_to_anchor": (1.005, 1.0), "fontsize": 8, "frameon": False}
COHORT_COLORS = {"generated": "#7f7f7f", "trained": "#2ca02c", "evicted": "#d62728"}


def _profile(p: PartitionData, measure: str, label: str, lines: list[tuple[str, str]]) -> Figure:
    fig, (ax, hm) = plot.figure(2)
    rows = p.tables["staleness_by_step"]
    for i, (key, name) in enumerate(lines):
        x, y = plot.series(rows, key)
        if len(x):          # each next series a smaller, other marker on top: equal values show
            plot.line(ax, x, y, "max" if key.endswith("_max") else "mean", label=name,
                      marker="osD^"[i % 4] if len(x) <= 30 else None,
                      ms=(3 if len(x) > 5 else 8) - 1.2 * i * (len(x) <= 5))
    if ax.lines:
        ax.set_ylabel(label)
        plot.steps_axis(ax)
        ax.margins(y=0.08)
        ax.legend(loc="lower left", bbox_to_anchor=(0, 1.01), ncol=2, fontsize=8, frameon=False)
    else:
        plot.empty(ax, "no trained trajectory in these steps")
    plot.heatmap(hm, p.tables["trained_distribution"], measure, label)
    hm.set_title(f"distribution of {label} per step", fontsize=10)
    return fig


def staleness(p: PartitionData) -> Figure:
    return _profile(p, "staleness", "staleness", [
        ("staleness_mean", "mean"), ("staleness_max", "max"),
        ("token_staleness_mean", "mean, token-weighted"),
        ("token_staleness_exact_mean", "per-token exact mean")])


def span(p: PartitionData) -> Figure:
    return _profile(p, "span", "span", [("span_mean", "mean"), ("span_max", "max")])


def evictions(p: PartitionData) -> Figure:
    fig, (ax,) = plot.figure()
    rows = p.tables["evictions_by_reason"]
    if not rows:
        plot.empty(ax, "no group was evicted in these steps")
        return fig
    plot.stacked_bars(ax, rows, "reason", "n_groups", REASON_COLORS)
    ax.set_ylabel("groups evicted")
    plot.integer_axis(ax.yaxis)
    plot.steps_axis(ax)
    totals = {}
    for r in rows:
        totals[r["reason"]] = totals.get(r["reason"], 0) + r["n_groups"]
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles, [f"{lb} ({totals[lb]})" for lb in labels], **OUTSIDE)
    return fig


def filtered(p: PartitionData) -> Figure:
    fig, (ax,) = plot.figure()
    rows = p.tables["filtered_rewards"]
    if not rows:
        plot.empty(ax, "the zero-variance filter evicted no group in these steps")
        return fig
    totals: dict[float, int] = {}
    for r in rows:
        totals[r["value"]] = totals.get(r["value"], 0) + r["n_groups"]
    keep = sorted(sorted(totals, key=lambda v: -totals[v])[:6])
    rows = [{**r, "value": value_text(r["value"]) if r["value"] in keep else "other"} for r in rows]
    palette = ["#d62728", "#2ca02c", "#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#7f7f7f"]
    colors = {value_text(v): palette[i] for i, v in enumerate(keep)} | {"other": palette[-1]}
    plot.stacked_bars(ax, rows, "value", "n_groups", colors)
    ax.set_ylabel("groups filtered")
    plot.integer_axis(ax.yaxis)
    plot.steps_axis(ax)
    handles, labels = ax.get_legend_handles_labels()
    count = {lb: sum(r["n_groups"] for r in rows if r["value"] == lb) for lb in labels}
    ax.legend(handles, [f"all = {lb} ({count[lb]})" for lb in labels], **OUTSIDE,
              title="shared value", title_fontsize=8)
    return fig


def occupancy(p: PartitionData) -> Figure:
    fig, (ax,) = plot.figure()
    rows = p.tables["occupancy_by_step"]
    if not rows:
        plot.empty(ax, "no decision in these steps")
        return fig
    if not any(r["n_groups"] for r in rows):
        plot.empty(ax, "the buffer held no group at the end of these steps")
        return fig
    steps = sorted({r["step"] for r in rows})
    w = plot.window(len(steps))
    if w == 1:              # one bar per step, touching: the state holds from step to step
        plot.stacked_bars(ax, rows, "status", "n_groups", STATUS_COLORS, width=1.0)
    else:                   # many steps: the rolling mean of each band
        col = {s: i for i, s in enumerate(steps)}
        order = [s for s in STATUS_COLORS if any(r["status"] == s for r in rows)]
        ys = np.zeros((len(order), len(steps)))
        for r in rows:
            ys[order.index(r["status"]), col[r["step"]]] = r["n_groups"]
        ys = np.vstack([plot.rolling(y, w) for y in ys])
        ax.stackplot(steps, ys, labels=order, colors=[STATUS_COLORS[s] for s in order],
                     linewidth=0)
    ax.set_ylabel("groups in the buffer")
    plot.integer_axis(ax.yaxis)
    plot.steps_axis(ax, "trainer step (state at the end of the step)")
    ax.legend(**OUTSIDE)
    return fig


def selection_bias(p: PartitionData) -> Figure:
    fig, axes = plot.figure(3)
    rows = p.tables["selection_bias"]
    panels = [("response_len_mean", "mean response length (tokens)"),
              ("reward_mean", "mean reward"),
              ("version_lag", "newest weight version − dispatch step")]
    rows = [{**r, "version_lag": None if r["version_mean"] is None
             else r["version_mean"] - r["dispatch_step"]} for r in rows]
    for ax, (key, label) in zip(axes, panels):
        means: list[str] = []
        for cohort, color in COHORT_COLORS.items():
            sel = [r for r in rows if r["cohort"] == cohort]
            x, y = plot.series(sel, key, "dispatch_step")
            if not len(x):
                continue
            w = np.asarray([r["n_trajectories"] for r in sel if r[key] is not None], float)
            plot.line(ax, x, y, color=color, label=cohort)
            means.append(f"{cohort} {np.average(y, weights=w):.2f}")
        if not ax.lines:
            plot.empty(ax, "no reward known (the verl adapter's decisions mode reads none)"
                       if rows and key == "reward_mean" else "no trajectory in these steps")
            continue
        ax.set_title(f"{label}\n{' · '.join(means)}", fontsize=9)
        plot.steps_axis(ax, "dispatch step")
    handles = [Line2D([], [], color=c, lw=1.6) for c in COHORT_COLORS.values()]
    fig.legend(handles, list(COHORT_COLORS), loc="outside upper center", ncol=3, fontsize=9,
               frameon=False)
    return fig


@dataclass(frozen=True)
class FigureSpec:
    """One figure of a partition's section: its title, how to read it, how to draw it."""

    key: str
    title: str
    caption: str
    draw: Callable[[PartitionData], Figure]


FIGURES = (
    FigureSpec("staleness", "Staleness of trained trajectories",
               "Left: per trainer step, the mean and max staleness of the trajectories trained "
               "(step − 1 − the newest weight version that produced them: 0 is on-policy), and "
               "the mean weighted by response tokens (long answers count more); the exact "
               "per-token mean (each token's own version, so it can exceed the trajectory's) "
               "appears when producers reported version spans. Right: each "
               "column is one step (or bin of steps); the colour is the share of its tokens at "
               "each staleness. Mass creeping upwards means training on older rollouts.",
               staleness),
    FigureSpec("span", "Span of trained trajectories",
               "Span = weight versions that produced one trajectory (newest − oldest + 1): 1 "
               "means one policy wrote the whole answer, more means the weights changed "
               "mid-generation. Left: mean and max per step; right: the share of the tokens "
               "per span.", span),
    FigureSpec("evictions", "Evictions per reason",
               "Groups evicted at each trainer step, stacked by reason (the legend gives the "
               "totals). A group evicted for two reasons at once counts under each. Stale "
               "evictions growing means rollouts arrive too late for the staleness bound; "
               "zero-variance ones are the DAPO filter (next figure).", evictions),
    FigureSpec("filtered", "Filtered reward counts",
               "Groups the zero-variance filter evicted at each step, by the value all their "
               "responses shared on the recorded filter metric. With a 0/1 reward, 0 means "
               "every answer failed (too hard) and 1 that every answer succeeded (too easy): a "
               "growing share of 1s is the policy outgrowing its prompts.", filtered),
    FigureSpec("occupancy", "Buffer occupancy per status",
               "Groups still in the buffer (registered, not yet trained, evicted or discarded) "
               "at the end of each step, stacked by status: pending and running are being "
               "generated, finished groups wait to be trained, failed ones wait to be evicted. "
               "A growing finished band means rollouts outpace the trainer.", occupancy),
    FigureSpec("selection_bias", "Selection bias: generated vs trained vs evicted",
               "Per dispatch step, the mean response length, reward and newest weight version "
               "(relative to the dispatch step) of every generated trajectory, of those trained "
               "and of those evicted; each panel's title gives the overall means. Trained lines apart "
               "from the generated one mean the buffer's rules change what the trainer sees, "
               "e.g. shorter answers because long ones finish late and go stale.",
               selection_bias),
)
