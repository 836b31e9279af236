"""The staleness report's figures: one matplotlib Figure per question, drawn from `report_data`.

Built on `matplotlib.figure.Figure` with the Agg canvas (no pyplot, no global state, no display)
and encoded as PNG. Import this module only where matplotlib is wanted (the command imports it
inside the job, so `replaylake --help` never pays for it). Each figure has a caption (`FIGURES`)
saying how to read it; a figure without data says so inside its axes instead of showing empty ones.
"""
from __future__ import annotations

import base64
import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from pipeline.report_data import HEATMAP_COLUMNS, SMOOTH_FROM, PartitionData, Rows

WIDTH, HEIGHT, DPI = 12.0, 3.8, 100
REASON_COLORS = {"stale": "#d62728", "zero_variance": "#1f77b4", "failure": "#7f7f7f",
                 "overlong": "#9467bd"}
STATUS_COLORS = {"pending": "#c7c7c7", "running": "#ffbb78", "finished": "#2ca02c",
                 "failure": "#7f7f7f"}
OUTSIDE = {"loc": "upper left", "bbox_to_anchor": (1.005, 1.0), "fontsize": 8, "frameon": False}
COHORT_COLORS = {"generated": "#7f7f7f", "trained": "#2ca02c", "evicted": "#d62728"}


def _figure(ncols: int = 1) -> tuple[Figure, list[Any]]:
    fig = Figure(figsize=(WIDTH, HEIGHT), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#555555",
            fontsize=11)
    ax.set_xticks([])
    ax.set_yticks([])


def _steps_axis(ax: Any, label: str = "trainer step") -> None:
    ax.set_xlabel(label)
    ax.grid(True, alpha=0.3)

def _series(rows: Rows, key: str, step: str = "step") -> tuple[np.ndarray, np.ndarray]:
    pts = [(r[step], r[key]) for r in rows if r[key] is not None]
    if not pts:
        return np.array([]), np.array([])
    x, y = zip(*pts)
    return np.asarray(x, dtype=float), np.asarray(y, dtype=float)


def _window(n: int) -> int:
    """Steps per smoothing window: none up to SMOOTH_FROM steps, then about n / 40."""
    return 1 if n < SMOOTH_FROM else max(3, round(n / 40))


def _rolling(y: np.ndarray, w: int, how: str = "mean") -> np.ndarray:
    """Centred rolling mean (or max) over ``w`` points; the ends repeat the first / last."""
    if w <= 1 or len(y) < w:
        return y
    pad = np.pad(y, (w // 2, w - 1 - w // 2), mode="edge")
    win = np.lib.stride_tricks.sliding_window_view(pad, w)
    return win.max(axis=1) if how == "max" else win.mean(axis=1)


def _line(ax: Any, x: np.ndarray, y: np.ndarray, how: str = "mean", **kw: Any) -> None:
    """Many steps: the raw values faint, their rolling mean (or max) on top; few: the values."""
    w = _window(len(x))
    if w == 1:
        ax.plot(x, y, lw=1.2, **kw)
        return
    (raw,) = ax.plot(x, y, lw=0.6, alpha=0.25, color=kw.get("color"))
    ax.plot(x, _rolling(y, w, how), lw=1.6, color=raw.get_color(),
            **{k: v for k, v in kw.items() if k != "color"})


def _heatmap(ax: Any, rows: Rows, measure: str, label: str) -> None:
    """Share of the response tokens (trajectories, when none has tokens) at each value, per
    step, or per bin of consecutive steps when there are many."""
    rows = [r for r in rows if r["measure"] == measure]
    steps = sorted({r["step"] for r in rows})
    values = sorted({r["value"] for r in rows})
    if not rows:
        _empty(ax, "no trained trajectory in these steps")
        return
    per_bin = 1 if len(steps) < SMOOTH_FROM else -(-len(steps) // HEATMAP_COLUMNS)
    starts = steps[::per_bin]
    col = {s: i // per_bin for i, s in enumerate(steps)}
    row = {v: i for i, v in enumerate(values)}
    grid = np.zeros((len(values), len(starts)))
    weight = "n_tokens" if sum(r["n_tokens"] for r in rows) > 0 else "n_trajectories"
    for r in rows:
        grid[row[r["value"]], col[r["step"]]] += r[weight]
    totals = grid.sum(axis=0)
    grid = np.divide(grid, totals, out=np.zeros_like(grid), where=totals > 0)
    edges = np.asarray(starts + [steps[-1] + 1], dtype=float) - 0.5
    mesh = ax.pcolormesh(edges, np.arange(len(values) + 1) - 0.5, grid, cmap="viridis",
                         vmin=0.0, vmax=1.0, shading="flat")
    ax.set_yticks(range(len(values)), [str(v) for v in values])
    ax.set_xlabel("trainer step" if per_bin == 1 else f"trainer step (bins of {per_bin})")
    ax.set_ylabel(label)
    what = "tokens" if weight == "n_tokens" else "trajectories"
    ax.figure.colorbar(mesh, ax=ax, label=f"share of {what}", pad=0.01)


def _profile(p: PartitionData, measure: str, label: str, lines: list[tuple[str, str]]) -> Figure:
    fig, (ax, hm) = _figure(2)
    rows = p.tables["staleness_by_step"]
    for key, name in lines:
        x, y = _series(rows, key)
        if len(x):
            _line(ax, x, y, "max" if key.endswith("_max") else "mean", label=name)
    ax.set_ylabel(label)
    _steps_axis(ax)
    ax.margins(y=0.08)
    ax.legend(loc="lower left", bbox_to_anchor=(0, 1.01), ncol=2, fontsize=8, frameon=False)
    _heatmap(hm, p.tables["trained_distribution"], measure, label)
    hm.set_title(f"distribution of {label} per step", fontsize=10)
    return fig


def staleness(p: PartitionData) -> Figure:
    return _profile(p, "staleness", "staleness", [
        ("staleness_mean", "mean"), ("staleness_max", "max"),
        ("token_staleness_mean", "mean, token-weighted"),
        ("token_staleness_exact_mean", "per-token exact mean")])


def span(p: PartitionData) -> Figure:
    return _profile(p, "span", "span", [("span_mean", "mean"), ("span_max", "max")])


def _stacked_bars(ax: Any, rows: Rows, key: str, count: str, colors: dict[str, str]) -> None:
    steps = sorted({r["step"] for r in rows})
    col = {s: i for i, s in enumerate(steps)}
    bottom = np.zeros(len(steps))
    for k in sorted({r[key] for r in rows}, key=lambda v: (str(v) not in colors, str(v))):
        h = np.zeros(len(steps))
        for r in rows:
            if r[key] == k:
                h[col[r["step"]]] += r[count]
        ax.bar(steps, h, bottom=bottom, width=1.0, label=str(k), color=colors.get(str(k)),
               linewidth=0)
        bottom += h


def evictions(p: PartitionData) -> Figure:
    fig, (ax,) = _figure()
    rows = p.tables["evictions_by_reason"]
    if not rows:
        _empty(ax, "no group was evicted in these steps")
        return fig
    _stacked_bars(ax, rows, "reason", "n_groups", REASON_COLORS)
    ax.set_ylabel("groups evicted")
    _steps_axis(ax)
    totals = {}
    for r in rows:
        totals[r["reason"]] = totals.get(r["reason"], 0) + r["n_groups"]
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles, [f"{lb} ({totals[lb]})" for lb in labels], **OUTSIDE)
    return fig


def filtered(p: PartitionData) -> Figure:
    fig, (ax,) = _figure()
    rows = p.tables["filtered_rewards"]
    if not rows:
        _empty(ax, "the zero-variance filter evicted no group in these steps")
        return fig
    totals: dict[float, int] = {}
    for r in rows:
        totals[r["value"]] = totals.get(r["value"], 0) + r["n_groups"]
    keep = sorted(sorted(totals, key=lambda v: -totals[v])[:6])
    rows = [{**r, "value": f"{r['value']:g}" if r["value"] in keep else "other"} for r in rows]
    palette = ["#d62728", "#2ca02c", "#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#7f7f7f"]
    colors = {f"{v:g}": palette[i] for i, v in enumerate(keep)} | {"other": palette[-1]}
    _stacked_bars(ax, rows, "value", "n_groups", colors)
    ax.set_ylabel("groups filtered")
    _steps_axis(ax)
    handles, labels = ax.get_legend_handles_labels()
    count = {lb: sum(r["n_groups"] for r in rows if r["value"] == lb) for lb in labels}
    ax.legend(handles, [f"all = {lb} ({count[lb]})" for lb in labels], **OUTSIDE,
              title="shared value", title_fontsize=8)
    return fig


def occupancy(p: PartitionData) -> Figure:
    fig, (ax,) = _figure()
    rows = p.tables["occupancy_by_step"]
    if not rows:
        _empty(ax, "no decision in these steps")
        return fig
    steps = sorted({r["step"] for r in rows})
    col = {s: i for i, s in enumerate(steps)}
    order = [s for s in STATUS_COLORS if any(r["status"] == s for r in rows)]
    ys = np.zeros((len(order), len(steps)))
    for r in rows:
        ys[order.index(r["status"]), col[r["step"]]] = r["n_groups"]
    w = _window(len(steps))
    if w > 1:
        ys = np.vstack([_rolling(y, w) for y in ys])
    ax.stackplot(steps, ys, labels=order, colors=[STATUS_COLORS[s] for s in order],
                 step="mid" if w == 1 else None, linewidth=0)
    ax.set_ylabel("groups in the buffer")
    ax.set_xlim(steps[0] - 0.5, steps[-1] + 0.5)
    _steps_axis(ax, "trainer step (state at the end of the step)")
    ax.legend(**OUTSIDE)
    return fig


def selection_bias(p: PartitionData) -> Figure:
    fig, axes = _figure(3)
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
            x, y = _series(sel, key, "dispatch_step")
            if not len(x):
                continue
            w = np.asarray([r["n_trajectories"] for r in sel if r[key] is not None], float)
            _line(ax, x, y, color=color, label=cohort)
            means.append(f"{cohort} {np.average(y, weights=w):.2f}")
        if not ax.lines:
            _empty(ax, "no trajectory in these steps")
            continue
        ax.set_title(f"{label}\n{' · '.join(means)}", fontsize=9)
        _steps_axis(ax, "dispatch step")
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
               "((step − 1) − newest weight version that produced them: 0 is on-policy), and "
               "the mean weighted by response tokens (long answers count more); the exact "
               "per-token mean appears when producers reported version spans. Right: each "
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


def png_base64(fig: Figure) -> str:
    """The figure as a base64-encoded PNG (what a data: URI embeds)."""
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=DPI)
    return base64.b64encode(out.getvalue()).decode("ascii")
