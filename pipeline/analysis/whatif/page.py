"""The comparison of several policies as an HTML section with plots (`whatif --compare --out`).

Drawn with the staleness report's machinery (its Agg figures, PNG encoding and page style), one
colour per policy in every plot (the recorded run in black). Figures: what each policy trains,
wastes and how stale; staleness per step; the trained length and reward distributions against
the generated ones; per-dataset shares and starvation where the lake names datasets. Import
only where matplotlib is wanted.
"""
from __future__ import annotations

import html
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from pipeline.analysis.report import plot
from pipeline.analysis.report.html import CSS, HEAD, scroll
from pipeline.analysis.whatif.board import DATASET_COLUMNS, SECTIONS, cell, fmt, reasons
from pipeline.analysis.whatif.compare import Comparison, Row

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#17becf", "#bcbd22", "#7f7f7f")
RECORDED = "#222222"
# after the recorded run's solid line with dots, each policy's own dashes and marker, so that
# policies that train alike stay apart where their lines coincide
DASHES = ("--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)), (0, (8, 2)))
MARKERS = ("s", "^", "D", "v", "P", "X", "<", ">")


def colors(cmp: Comparison) -> list[str]:
    """One colour per row, the same in every figure: black for the recorded run."""
    return [RECORDED] + [PALETTE[i % len(PALETTE)] for i in range(len(cmp.rows) - 1)]


def widths(cmp: Comparison) -> list[float]:
    """Line widths, widest for the recorded run and narrower for each next policy, so that
    policies that train alike show as nested lines instead of hiding one another."""
    n = len(cmp.rows)
    return [4.0 - 2.8 * i / max(n - 1, 1) for i in range(n)]


def styles(cmp: Comparison) -> list[tuple[object, str]]:
    """(line style, marker) per row: solid with dots for the recorded run, then per policy."""
    return [("-", "o")] + [(DASHES[i % len(DASHES)], MARKERS[i % len(MARKERS)])
                           for i in range(len(cmp.rows) - 1)]


def _legend(fig: Figure, cmp: Comparison, lines: bool = False) -> None:
    """One legend above the axes, read row by row in the rows' order; ``lines``: each policy's
    line style and marker (figures of lines), else a block of its colour (bars)."""
    ncol = min(len(cmp.rows), 4)
    order = [i for c in range(ncol) for i in range(c, len(cmp.rows), ncol)]  # column-major fill
    handles = [Line2D([], [], color=colors(cmp)[i], lw=2.5, ls=styles(cmp)[i][0],
                      marker=styles(cmp)[i][1], ms=6,
                      markerfacecolor="none" if i else colors(cmp)[i]) if lines
               else Line2D([], [], color=colors(cmp)[i], lw=6) for i in order]
    names = [f"{'rec' if i == 0 else i}: {cmp.rows[i].label}" for i in order]
    fig.legend(handles, names, loc="outside upper center", ncol=ncol, fontsize=9, frameon=False)


def _bars(ax, cmp: Comparison, values: list[float], label: str, hatched: list[float] | None = None,
          floors: list[bool] | None = None) -> None:
    x = np.arange(len(cmp.rows))
    cs = colors(cmp)
    ax.bar(x, values, color=cs)
    if hatched is not None:
        ax.bar(x, hatched, bottom=values, color="white", edgecolor=cs, hatch="//", linewidth=1)
    for i, floor in enumerate(floors or []):
        if floor:
            ax.annotate(">=", (x[i], values[i]), ha="center", va="bottom", fontsize=9)
    ax.set_xticks(x, [str(i) if i else "rec" for i in x], fontsize=9)
    ax.set_xlabel("policy (see the legend)", fontsize=9)
    ax.set_ylabel(label)
    ax.grid(True, axis="y", alpha=0.3)
    ax.margins(y=0.08)       # room above the tallest bar (and its ">=" mark) below the frame


def overview(cmp: Comparison) -> Figure:
    fig, axes = plot.figure(4)
    f = [r.figures for r in cmp.rows]
    _bars(axes[0], cmp, [x["trained_trajectories"] for x in f], "trajectories trained")
    _bars(axes[1], cmp, [x["wasted_tokens"] for x in f], "response tokens never trained",
          hatched=[x["saved_tokens"] for x in f])
    for ax in axes[:2]:
        plot.integer_axis(ax.yaxis)
    future = [bool(x["future_rows"]) for x in f]
    _bars(axes[2], cmp, [x["staleness_mean_floor" if fut else "staleness_mean"] or 0
                         for x, fut in zip(f, future)], "mean staleness of trained rows",
          floors=future)
    _bars(axes[3], cmp, [x["ks_response_len"] or 0 for x in f],
          "KS statistic, response length")
    axes[1].set_title("solid: wasted · hatched: saved (admit)", fontsize=9)
    axes[2].set_title("'>=': a floor (rows from the future)", fontsize=9)
    axes[3].set_title("trained vs generated (0: alike)", fontsize=9)
    _legend(fig, cmp)
    return fig


def staleness(cmp: Comparison) -> Figure:
    fig, axes = plot.figure(2)
    for ax, key, label in ((axes[0], "staleness_mean", "mean staleness"),
                           (axes[1], "staleness_max", "max staleness")):
        # the recorded run (widest) first, each next policy narrower, dashed and on top
        for i, (r, c, w, (ls, mk)) in enumerate(zip(cmp.rows, colors(cmp), widths(cmp),
                                                    styles(cmp))):
            rows = [s for s in r.staleness_by_step if s["partition"] == _train(cmp)]
            x, y = plot.series(rows, key)
            if len(x):
                ax.plot(x, y, color=c, lw=w, ls=ls, marker=mk if len(x) <= 30 else None,
                        ms=w + 3, markerfacecolor="none" if i else c, zorder=2 + i)
        if not ax.lines:
            plot.empty(ax, "no trained row in any policy")
            continue
        ax.set_ylabel(f"{label} of trained rows")
        plot.steps_axis(ax)
    plot.integer_axis(axes[1].yaxis)                # the max of integers
    _legend(fig, cmp, lines=True)
    return fig


def _train(cmp: Comparison) -> str:
    """The partition the staleness figure shows: the one that trained the most rows."""
    counts: dict[str, int] = {}
    for s in cmp.rows[0].staleness_by_step:
        counts[s["partition"]] = counts.get(s["partition"], 0) + s["n_trajectories"]
    return max(counts, key=counts.get) if counts else "train"


def distributions(cmp: Comparison) -> Figure:
    fig, axes = plot.figure(2)
    for ax, measure, label in ((axes[0], "response_len", "response length (tokens)"),
                               (axes[1], "reward", "reward")):
        gen = [d for d in cmp.rows[0].distributions if d["measure"] == measure]
        ax.step([d["value"] for d in gen], [d["cdf_generated"] for d in gen], where="post",
                color="#999999", lw=3, ls="--", label="generated (recorded run)")
        for i, (r, c, w, (ls, _)) in enumerate(zip(cmp.rows, colors(cmp), widths(cmp),
                                                   styles(cmp))):
            rows = [d for d in r.distributions if d["measure"] == measure
                    and d["cdf_trained"] is not None]
            ax.step([d["value"] for d in rows], [d["cdf_trained"] for d in rows], where="post",
                    color=c, lw=w, ls=ls, zorder=3 + i)
        if measure == "response_len":
            plot.integer_axis(ax.xaxis)             # tokens come whole
        ax.set_xlabel(label)
        ax.set_ylabel("share of trained trajectories <= x")
        ax.set_ylim(0, 1.02)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower right", fontsize=8, frameon=False)
    _legend(fig, cmp, lines=True)
    return fig


def datasets(cmp: Comparison) -> Figure:
    fig, axes = plot.figure(2)
    keys = sorted({(d["partition"], d["dataset"]) for r in cmp.rows for d in r.datasets})
    width = 0.8 / len(cmp.rows)
    for i, (r, c) in enumerate(zip(cmp.rows, colors(cmp))):
        by = {(d["partition"], d["dataset"]): d for d in r.datasets}
        x = np.arange(len(keys)) + (i - (len(cmp.rows) - 1) / 2) * width
        axes[0].bar(x, [(by.get(k) or {}).get("trained_share") or 0 for k in keys], width,
                    color=c)
        axes[1].bar(x, [(by.get(k) or {}).get("longest_starved") or 0 for k in keys], width,
                    color=c)
    names = [d if len({p for p, _ in keys}) == 1 else f"{p}/{d}" for p, d in keys]
    for ax, label in ((axes[0], "share of trained trajectories"),
                      (axes[1], "longest starvation (steps)")):
        ax.set_xticks(np.arange(len(keys)), names)
        ax.set_xlabel("dataset")
        ax.set_ylabel(label)
        ax.grid(True, axis="y", alpha=0.3)
    axes[1].yaxis.get_major_locator().set_params(integer=True)
    _legend(fig, cmp)
    return fig


FIGURES = (
    ("overview", "What each policy trains, wastes, and how stale",
     "Per policy (numbered as in the legend): trajectories trained; response tokens generated "
     "and never trained (for admit, hatched: the tokens of the groups it would not have "
     "dispatched); mean staleness of the trained rows ('>=' marks a floor where the replay "
     "reached rollouts from the future); the Kolmogorov-Smirnov statistic between the trained "
     "and the generated response lengths.", overview),
    ("staleness", "Staleness per step",
     "Mean and max staleness (step − 1 − newest weight version) of the trained rows at each "
     "trainer step of the partition that trained most, one line per policy (narrower for each "
     "next one, so policies that train alike show as nested lines). A value below 0 is a row "
     "from the future, which only a replay reaches (see the notes).", staleness),
    ("distributions", "Trained against generated: response length and reward",
     "Cumulative share of the trained trajectories at or below each value, one line per "
     "policy; the dashed grey line is every trajectory the recorded run generated. A policy "
     "whose line sits above the grey one on the left trains shorter (or lower-reward) answers "
     "than were generated; the table's KS column is each policy's largest gap to its own "
     "generated set.", distributions),
    ("datasets", "Datasets: trained share and starvation",
     "Left: each dataset's share of the trained trajectories per policy. Right: the longest "
     "stretch of consecutive steps in which the dataset had groups in flight and none trained.",
     datasets),
)


def _tables(cmp: Comparison) -> str:
    """The text's sections as HTML tables, each row led by its policy's colour."""
    out = []
    for title, columns in SECTIONS:
        cols = list(columns)
        if title.startswith("trained"):
            cols += [(f"evicted {r}", f"evicted {r}") for r in reasons(cmp)]
        out.append(_table(cmp, title, [h for _, h in cols],
                          [[cell(r, k) for k, _ in cols] for r in cmp.rows]))
    if any(r.datasets for r in cmp.rows):
        body, who = [], []
        for i, r in enumerate(cmp.rows):
            body += [[fmt(d[k], k) for k, _ in DATASET_COLUMNS] for d in r.datasets]
            who += [i] * len(r.datasets)
        out.append(_table(cmp, "datasets: share of the trained and generated trajectories, "
                          "starvation (steps with groups in flight, none trained)",
                          [h for _, h in DATASET_COLUMNS], body, who))
    return "".join(out)


def _table(cmp: Comparison, title: str, header: list[str], body: list[list[str]],
           who: list[int] | None = None) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    rows = []
    for n, cells in enumerate(body):
        i = n if who is None else who[n]
        tds = "".join(f"<td class='num'>{html.escape(c)}</td>" for c in cells)
        rows.append(f"<tr><th style='white-space:nowrap'><span style='color:"
                    f"{colors(cmp)[i]}'>&#9632;</span> {'rec' if i == 0 else i}: "
                    f"{html.escape(cmp.rows[i].label)}</th>{tds}</tr>")
    return (f"<h3>{html.escape(title[0].upper() + title[1:])}</h3>"
            + scroll(f"<table><tr><th>policy</th>{head}</tr>{''.join(rows)}</table>"))


def _notes(rows: list[Row]) -> str:
    out = []
    for i, r in enumerate(rows):
        if r.notes:
            items = "".join(f"<li>{html.escape(n)}</li>" for n in r.notes)
            out.append(f"<h4>{i}: {html.escape(r.label)}</h4><ul class='note'>{items}</ul>")
    return "".join(out) or "<p class='note'>Every replay reproduced the recorded batches.</p>"


def render(cmp: Comparison) -> str:
    """The page: the table, the approximations per policy, then the figures."""
    parts = [HEAD,
             f"<title>replaylake what-if: {html.escape(str(cmp.lake))}</title>",
             f"<style>{CSS}</style></head><body>",
             "<h1>replaylake what-if: policies compared</h1>",
             f"<p class='meta'>lake <code>{html.escape(str(cmp.lake))}</code> · "
             f"{cmp.calls} sample calls replayed per policy</p>",
             "<h2 id='whatif-table'>Figures per policy</h2>", _tables(cmp),
             "<h3>What the replay approximates</h3>", _notes(cmp.rows)]
    has_datasets = any(r.datasets for r in cmp.rows)
    for key, title, caption, draw in FIGURES:
        if key == "datasets" and not has_datasets:
            continue
        png = plot.png_base64(draw(cmp))
        parts.append(f"<h3 id='whatif-{key}'>{html.escape(title)}</h3><figure><img "
                     f"alt='{html.escape(title)}' src='data:image/png;base64,{png}'>"
                     f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_page(cmp: Comparison, out: Path) -> Path:
    """Write the page as ``out/whatif.html`` (self-contained: figures embedded)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "whatif.html"
    path.write_text(render(cmp), encoding="utf-8")
    return path
