"""The staleness report as one self-contained HTML file: inline CSS, figures as data: URIs.

Nothing in the page refers to another file or to the network, so the report can be mailed,
attached to a ticket or opened years later. Every text that comes from the lake (partition
names, configuration values) is escaped.
"""
from __future__ import annotations

import datetime as dt
import html
from collections.abc import Callable
from typing import Any

from pipeline.analysis.report.data import (
    HEATMAP_COLUMNS,
    PROMPTS_TOP,
    SMOOTH_FROM,
    PartitionData,
    ReportData,
)
from pipeline.analysis.report.settings import settings

# headline rows: (column of report_headline, label, how to read it)
HEADLINE = (
    ("first_step", "first trained step", ""),
    ("last_step", "last trained step", ""),
    ("batches", "batches handed out", ""),
    ("trajectories", "trajectories trained", "non-padding"),
    ("response_tokens", "response tokens trained", ""),
    ("staleness_mean", "staleness, mean", "step − 1 − newest version"),
    ("staleness_max", "staleness, max", ""),
    ("token_staleness_mean", "staleness, token-weighted mean", "weighted by response tokens"),
    ("span_mean", "span, mean", "versions per trajectory"),
    ("span_max", "span, max", ""),
    ("groups_dispatched", "groups dispatched", "by dispatch step"),
    ("groups_trained", "groups trained", ""),
    ("groups_evicted", "groups evicted", "any reason"),
    ("groups_filtered", "of which by the zero-variance filter", ""),
    ("groups_discarded", "groups discarded as surplus", "sync DAPO"),
    ("groups_live", "dispatched groups still live", "at the end of the lake"),
)

# the Prompts section's boards: (board of prompt_leaders, title, what it ranks, columns shown as
# (column, header))
PROMPT_BOARDS = (
    ("wasteful", "Prompts that waste the most generation",
     "response tokens spent on groups never trained (evicted, discarded, or partial answers a "
     "re-issue dropped)",
     (("tokens_wasted", "tokens wasted"), ("wasted_share", "share of its tokens"),
      ("n_groups", "groups"), ("trained", "trained"), ("evicted", "evicted"),
      ("reward_mean", "mean reward"))),
    ("solved", "Solved prompts",
     "every response got the best reward seen in the partition; most responses generated first",
     (("n_responses", "responses"), ("tokens_generated", "tokens generated"),
      ("n_groups", "groups"), ("trained", "trained"), ("evicted", "evicted"),
      ("last_trained_step", "last trained step"))),
)

CSS = """
* { box-sizing: border-box; }
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 24px auto;
       padding: 0 16px; max-width: 1240px; color: #222; line-height: 1.45;
       overflow-wrap: break-word; }
h1 { font-size: 24px; margin-bottom: 4px; } h2 { font-size: 20px; margin-top: 36px;
  border-bottom: 2px solid #ddd; padding-bottom: 4px; } h3 { font-size: 16px; margin: 22px 0 6px; }
.meta { color: #555; font-size: 13px; } code { overflow-wrap: anywhere; }
.scroll { overflow-x: auto; max-width: 100%; margin: 8px 0 16px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0 16px; }
.scroll > table { margin: 0; }
th, td { border: 1px solid #ddd; padding: 3px 10px; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
th { background: #f4f4f4; } .note { color: #666; font-size: 12px; }
figure { margin: 0 0 8px; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 13px; color: #444; max-width: 1100px; margin-top: 4px; }
.columns { display: flex; gap: 0 40px; flex-wrap: wrap; }
.columns > div { min-width: 0; max-width: 100%; }
table.config { max-width: 860px; } table.config td { white-space: nowrap; }
table.config td.meaning { color: #555; white-space: normal; min-width: 16em; }
@media (max-width: 600px) {
  body { margin: 12px auto; padding: 0 10px; }
  th, td { padding: 3px 6px; }
  table.config td { white-space: normal; }
}
"""

# the page's opening: phones lay it out at their own width instead of a zoomed-out desktop one
HEAD = ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        '<meta name="viewport" content="width=device-width, initial-scale=1">')


def scroll(table: str) -> str:
    """A wide table in a box that scrolls sideways on a narrow screen (the page itself does
    not, and no column is cut off)."""
    return f"<div class='scroll'>{table}</div>"


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return f"{v:,.3f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _config(data: ReportData) -> str:
    if data.config is None:
        return "<p class='note'>This lake recorded no configuration (written before replaylake " \
               "kept one).</p>"
    rows = "".join(f"<tr><th>{html.escape(s.name)}</th><td>{html.escape(s.value)}</td>"
                   f"<td class='meaning'>{html.escape(s.meaning)}</td></tr>"
                   for s in settings(data.config))
    more = "" if data.config_versions <= 1 else (
        f"<p class='note'>The lake recorded {data.config_versions} configurations; this is the "
        "newest (an earlier part of the run was decided under another).</p>")
    return scroll(f"<table class='config'><tr><th>setting</th><th>value</th><th>what it does</th>"
                  f"</tr>{rows}</table>") + more


def _headline(data: ReportData) -> str:
    names = [p.name for p in data.partitions]
    head = "".join(f"<th>{html.escape(n)}</th>" for n in names)
    body = []
    for key, label, note in HEADLINE:
        cells = "".join(f"<td class='num'>{html.escape(_fmt(p.headline[key]))}</td>"
                        for p in data.partitions)
        hint = f" <span class='note'>({html.escape(note)})</span>" if note else ""
        body.append(f"<tr><th>{html.escape(label)}{hint}</th>{cells}</tr>")
    return scroll(f"<table><tr><th>partition</th>{head}</tr>{''.join(body)}</table>")


def _board(rows: list[dict[str, Any]], columns: tuple[tuple[str, str], ...]) -> str:
    head = "".join(f"<th>{html.escape(label)}</th>" for _, label in columns)
    body = "".join(
        f"<tr><td class='num'>{r['rank']}</td><td class='num'>{r['prompt_id']}</td>"
        + "".join(f"<td class='num'>{html.escape(_fmt(r[c]))}</td>" for c, _ in columns)
        + "</tr>" for r in rows)
    return scroll(f"<table><tr><th>rank</th><th>prompt id</th>{head}</tr>{body}</table>")


def _prompts(p: PartitionData) -> str:
    """The partition's Prompts section: the top prompts of each board of `prompt_leaders`."""
    out = [f"<h3 id='{html.escape(p.name)}-prompts'>Prompts</h3>"]
    if not p.prompts:
        out.append("<p class='note'>No prompt of this partition wasted generation or was solved, "
                   "or its groups carry no prompt id (register them with "
                   "<code>prompt_ids=</code>).</p>")
        return "".join(out)
    out.append("<div class='columns'>")
    for board, title, what, columns in PROMPT_BOARDS:
        rows = [r for r in p.prompts if r["board"] == board]
        out.append(f"<div><h4>{html.escape(title)}</h4><p class='note'>{html.escape(what)}; top "
                   f"{PROMPTS_TOP}.</p>")
        out.append(_board(rows, columns) if rows else "<p class='note'>none</p>")
        out.append("</div>")
    out.append("</div><p class='note'>Over the whole lake, whatever the step window (the "
               "<code>prompt_history</code> view has every prompt's history).</p>")
    return "".join(out)


def _missing_note(missing: tuple[str, ...]) -> str:
    """What a partition's trajectories lack, said before its figures show zeros or gaps."""
    why = {"rewards": "every reward is null: not known (the verl adapter's decisions mode reads "
                      "none), so the reward figures are empty",
           "response tokens": "every response has 0 tokens counted (its producer sent "
                              "neither the tokens nor their count), so the length, token and "
                              "waste figures are not the run's"}
    return "".join(f"<p class='note'><strong>This partition's trajectories hold no "
                   f"{html.escape(m)}</strong>: {html.escape(why[m])}.</p>" for m in missing)


def render(data: ReportData, figures: Callable[[str], list[tuple[str, str, str, str]]],
           *, took_s: float | None = None) -> str:
    """The page: header, configuration, headline numbers, then one section per partition (its
    figures and its Prompts tables).

    ``figures(partition)`` returns that partition's ``(key, title, caption, png_base64)``."""
    lo, hi = data.steps
    window = "every step" if data.steps == (None, None) else \
        f"steps {'first' if lo is None else lo} to {'last' if hi is None else hi}"
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    parts = [HEAD,
             f"<title>replaylake report: {html.escape(str(data.lake))}</title>",
             f"<style>{CSS}</style></head><body>",
             "<h1>replaylake staleness report</h1>",
             f"<p class='meta'>lake <code>{html.escape(str(data.lake))}</code> · {window} · "
             f"partitions {html.escape(', '.join(p.name for p in data.partitions))} · "
             f"made {now}</p>",
             "<div class='columns'><div><h2>Headline numbers</h2>", _headline(data),
             "<p class='note'>Trained, evicted and discarded count the decisions taken in the "
             "window; dispatched and live count groups by their dispatch step.</p></div>",
             "<div><h2>Run configuration</h2>", _config(data), "</div></div>"]
    for p in data.partitions:
        parts.append(f"<h2>Partition {html.escape(p.name)}</h2>")
        if p.missing:
            parts.append(_missing_note(p.missing))
        if len(p.tables["staleness_by_step"]) >= SMOOTH_FROM:
            parts.append(
                f"<p class='note'>{len(p.tables['staleness_by_step'])} trained steps: in the line "
                "plots the faint lines are the per-step values and the bold ones their centred "
                "rolling mean over about 1/40 of the steps (rolling max for maxima); the heatmaps "
                f"sum consecutive steps into at most {HEATMAP_COLUMNS} columns.</p>")
        for key, title, caption, png in figures(p.name):
            parts.append(f"<h3 id='{html.escape(p.name)}-{key}'>{html.escape(title)}</h3>"
                         f"<figure><img alt='{html.escape(title)}' "
                         f"src='data:image/png;base64,{png}'>"
                         f"<figcaption>{html.escape(caption)}</figcaption></figure>")
        parts.append(_prompts(p))
    if took_s is not None:
        parts.append(f"<p class='note'>Made by <code>replaylake report</code> in {took_s:.1f} s."
                     "</p>")
    parts.append("</body></html>")
    return "\n".join(parts)
