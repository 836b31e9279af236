"""Drawing primitives of the staleness report: a Figure on the Agg canvas, smoothed step lines,
a value-by-step heatmap, stacked bars per step, and PNG encoding.

Many steps make per-step lines and columns unreadable, so from `SMOOTH_FROM` steps on lines get
a centred rolling mean (or max) drawn over the faint per-step values, and heatmaps sum
consecutive steps into at most `HEATMAP_COLUMNS` columns. Import only where matplotlib is wanted.
"""
from __future__ import annotations

import base64
import io
import itertools
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from pipeline.analysis.report.data import HEATMAP_COLUMNS, SMOOTH_FROM, Rows

WIDTH, HEIGHT, DPI = 12.0, 3.8, 100
MOST_TICKS = 12         # x ticks of a heatmap: every step up to this many, else round steps
FEW_STEPS = 4           # a step axis spanning fewer steps ticks each one and is at least this wide


def figure(ncols: int = 1) -> tuple[Figure, list[Any]]:
    """A page-wide Figure of ``ncols`` axes on its own Agg canvas (no pyplot: no global state)."""
    fig = Figure(figsize=(WIDTH, HEIGHT), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


def empty(ax: Any, text: str) -> None:
    """Say inside the axes why there is nothing to draw (better than blank axes)."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#555555",
            fontsize=11)
    ax.set_xticks([])
    ax.set_yticks([])


def steps_axis(ax: Any, label: str = "trainer step") -> None:
    """Label a step axis and fit it to the steps drawn (half a step beyond each end, so the
    first and last bars are whole); steps are integers, so are its ticks. A few steps get a
    tick each and some room around them, so one step shows as a point or a slim bar over its
    own tick instead of filling the axes."""
    ax.set_xlabel(label)
    ax.grid(True, alpha=0.3)
    x0, x1 = ax.dataLim.intervalx
    if not (np.isfinite(x0) and np.isfinite(x1)):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        return
    lo, hi = int(np.ceil(x0 - 1e-9)), int(np.floor(x1 + 1e-9))
    lo, hi = (lo, hi) if lo <= hi else (round(x0), round(x0))
    pad = max(0.5, (FEW_STEPS - (hi - lo)) / 2)
    ax.set_xlim(lo - pad, hi + pad)
    if hi - lo < FEW_STEPS:
        ax.set_xticks(range(lo, hi + 1))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def integer_axis(axis: Any) -> None:
    """Ticks at whole numbers only: for counts, tokens, maxima of integers."""
    axis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def series(rows: Rows, key: str, step: str = "step") -> tuple[np.ndarray, np.ndarray]:
    pts = [(r[step], r[key]) for r in rows if r[key] is not None]
    if not pts:
        return np.array([]), np.array([])
    x, y = zip(*pts)
    return np.asarray(x, dtype=float), np.asarray(y, dtype=float)


def window(n: int) -> int:
    """Steps per smoothing window: none up to SMOOTH_FROM steps, then about n / 40."""
    return 1 if n < SMOOTH_FROM else max(3, round(n / 40))


def rolling(y: np.ndarray, w: int, how: str = "mean") -> np.ndarray:
    """Centred rolling mean (or max) over ``w`` points; the ends repeat the first / last."""
    if w <= 1 or len(y) < w:
        return y
    pad = np.pad(y, (w // 2, w - 1 - w // 2), mode="edge")
    win = np.lib.stride_tricks.sliding_window_view(pad, w)
    return win.max(axis=1) if how == "max" else win.mean(axis=1)


def line(ax: Any, x: np.ndarray, y: np.ndarray, how: str = "mean", **kw: Any) -> None:
    """Many steps: the raw values faint, their rolling mean (or max) on top; few: the values."""
    w = window(len(x))
    if w == 1:              # few points get markers (``marker``, ``ms`` may set them)
        ax.plot(x, y, lw=1.2, **{"marker": "o" if len(x) <= 30 else None,
                                 "ms": 3 if len(x) > 5 else 6, **kw})
        return
    kw = {k: v for k, v in kw.items() if k not in ("marker", "ms")}
    (raw,) = ax.plot(x, y, lw=0.6, alpha=0.25, color=kw.get("color"))
    ax.plot(x, rolling(y, w, how), lw=1.6, color=raw.get_color(),
            **{k: v for k, v in kw.items() if k != "color"})


def heatmap(ax: Any, rows: Rows, measure: str, label: str) -> None:
    """Share of the response tokens (trajectories, when none has tokens) at each value, per
    step, or per bin of consecutive steps when there are many."""
    rows = [r for r in rows if r["measure"] == measure]
    steps = sorted({r["step"] for r in rows})
    values = sorted({r["value"] for r in rows})
    if not rows:
        empty(ax, "no trained trajectory in these steps")
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
    # one column per trained step (steps without training are left out), or bins of steps
    edges = np.arange(len(starts) + 1) - 0.5 if per_bin == 1 else \
        np.asarray(starts + [steps[-1] + 1], dtype=float) - 0.5
    mesh = ax.pcolormesh(edges, np.arange(len(values) + 1) - 0.5, grid, cmap="viridis",
                         vmin=0.0, vmax=1.0, shading="flat")
    ax.set_yticks(range(len(values)), [str(v) for v in values])
    if per_bin == 1:
        ticks = column_ticks(steps)
        ax.set_xticks(ticks, [str(steps[i]) for i in ticks])
    else:                   # the x axis is in steps: tick exact steps, both ends included
        ax.set_xticks(step_ticks(steps[0], steps[-1]))
    ax.set_xlabel("trainer step" if per_bin == 1 else f"trainer step (bins of {per_bin})")
    ax.set_ylabel(label)
    what = "tokens" if weight == "n_tokens" else "trajectories"
    ax.figure.colorbar(mesh, ax=ax, label=f"share of {what}", pad=0.01)


def step_ticks(lo: int, hi: int, most: int = MOST_TICKS) -> list[int]:
    """Integers from ``lo`` to ``hi`` to tick, both ends included: every one when there are at
    most ``most``, else the ends and the multiples of a round stride (1, 2, 5, 10, 20, ...)
    between them, none nearer an end than half a stride (their labels would overlap)."""
    if hi - lo + 1 <= most:
        return list(range(lo, hi + 1))
    stride = next(k * 10**e for e in itertools.count() for k in (1, 2, 5)
                  if (hi - lo) / (k * 10**e) <= most - 1)
    inner = range(-(-lo // stride) * stride, hi + 1, stride)
    return [lo, *(v for v in inner if v - lo >= stride / 2 and hi - v >= stride / 2), hi]


def column_ticks(steps: list[int]) -> list[int]:
    """The columns to tick of a heatmap with one column per trained step (ascending): those of
    `step_ticks` when the steps run without a gap, else evenly chosen columns; both ends."""
    if steps[-1] - steps[0] + 1 == len(steps):
        return [s - steps[0] for s in step_ticks(steps[0], steps[-1])]
    return step_ticks(0, len(steps) - 1)


def stacked_bars(ax: Any, rows: Rows, key: str, count: str, colors: dict[str, str],
                 width: float | None = None) -> None:
    """Per step, one bar of the ``count`` of each ``key`` stacked, bottom up in the order of
    ``colors`` (others after, by name); ``width`` 1.0 makes them touch (a state held from step
    to step)."""
    steps = sorted({r["step"] for r in rows})
    col = {s: i for i, s in enumerate(steps)}
    bottom = np.zeros(len(steps))
    rank = {name: i for i, name in enumerate(colors)}
    for k in sorted({r[key] for r in rows}, key=lambda v: (rank.get(str(v), len(rank)), str(v))):
        h = np.zeros(len(steps))
        for r in rows:
            if r[key] == k:
                h[col[r["step"]]] += r[count]
        ax.bar(steps, h, bottom=bottom,
               width=width or (1.0 if len(steps) >= SMOOTH_FROM else 0.8),
               label=str(k), color=colors.get(str(k)), linewidth=0)
        bottom += h


def png_base64(fig: Figure) -> str:
    """The figure as a base64-encoded PNG (what a data: URI embeds)."""
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=DPI)
    return base64.b64encode(out.getvalue()).decode("ascii")
