"""The comparison of several policies as text (80 columns) and as Parquet.

One row per policy (the recorded run first). The figures come in sections (trained and evicted,
waste, staleness and bias, datasets); a section wider than a terminal is split into tables of
at most `WIDTH` columns, each repeating the policy column, and the approximations each replay
made are printed under the tables, one block per policy.
"""
from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

from pipeline.analysis.whatif.compare import Comparison, Row
from pipeline.analysis.whatif.headline import FLOORS

WIDTH = 80
LABEL_MAX = 24
# (section title, [(figure, header)]); the eviction reasons join the first section
SECTIONS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("trained (groups, trajectories) and evicted (groups per reason)",
     (("batches", "batches"), ("identical", "same batches"), ("trained_groups", "groups"),
      ("trained_trajectories", "trajs"))),
    ("waste: generated and never trained (admit: saved = never dispatched)",
     (("wasted_trajectories", "wasted trajs"), ("wasted_tokens", "wasted tokens"),
      ("wasted_generation_s", "wasted gen s"), ("saved_trajectories", "saved trajs"),
      ("saved_tokens", "saved tokens"), ("live_trajectories", "left at end"))),
    ("staleness of the trained rows (token exact: the exact mean per response token, over "
     "rows that report version spans); certificate violations (trained rows over their "
     "bound); bias: KS statistic of the trained against the generated distribution (0: alike)",
     (("staleness_mean", "stale mean"), ("staleness_max", "stale max"),
      ("token_staleness_exact_mean", "token exact"), ("future_rows", "future rows"),
      ("over_bound_rows", "over bound"), ("ks_response_len", "KS length"),
      ("ks_reward", "KS reward"))),
)
DATASET_COLUMNS = (("partition", "partition"), ("dataset", "dataset"),
                   ("trained_share", "trained share"), ("generated_share", "generated share"),
                   ("starved_stretches", "starved stretches"),
                   ("longest_starved", "longest starved"))


def fmt(v: Any, key: str = "") -> str:
    """A cell: '-' for no value, shares as percentages, seconds to 0.1, other floats to 0.001."""
    if v is None:
        return "-"
    if isinstance(v, float):
        if key.endswith("_share"):
            return f"{100 * v:.1f}%"
        return f"{v:,.1f}" if key.endswith("_s") else f"{v:.3f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def cell(row: Row, key: str) -> str:
    """A figure of a row; a staleness figure that rows from the future make impossible is
    shown as its floor, marked ``>=``."""
    f = row.figures
    if key in FLOORS and f["future_rows"] and f[FLOORS[key]] is not None:
        return ">=" + fmt(f[FLOORS[key]])
    if key == "identical":
        return fmt(row.identical)
    if key.startswith("evicted "):
        return fmt(f["evicted_by_reason"].get(key.removeprefix("evicted "), 0))
    return fmt(f[key], key)


def label(cmp: Comparison, i: int) -> str:
    """Row ``i``'s policy as the tables show it: as given, or numbered and cut to LABEL_MAX
    characters (the notes under the tables give it whole)."""
    text = cmp.rows[i].label
    if len(text) <= LABEL_MAX:
        return text
    head = f"#{i} "
    return head + text[:LABEL_MAX - len(head) - 1] + "~"


def _tables(title: str, header: list[str], body: list[list[str]], first: int) -> list[str]:
    """``body`` rows under ``header``, the first ``first`` columns repeated in every table, the
    rest packed into tables of at most WIDTH characters; headers wrap onto two lines."""
    heads = [textwrap.wrap(h, max(8, max(len(w) for w in h.split()))) or [""] for h in header]
    heads = [h if len(h) == 2 else [""] * (2 - len(h)) + h[:2] for h in heads]
    widths = [max(len(x) for x in [*heads[i], *(r[i] for r in body)]) for i in range(len(header))]
    fixed = sum(w + 2 for w in widths[:first])   # as _pad lays them out
    chunks: list[list[int]] = [[]]
    used = fixed
    for i in range(first, len(header)):
        if chunks[-1] and used + widths[i] + 1 > WIDTH:
            chunks.append([])
            used = fixed
        chunks[-1].append(i)
        used += widths[i] + 1
    out: list[str] = []
    for n, chunk in enumerate(chunks):
        cols = [*range(first), *chunk]
        out += textwrap.wrap(title if n == 0 else f"{title} (continued)", WIDTH)
        for line in (0, 1):
            out.append("".join(_pad(heads[i][line], widths[i], i < first) for i in cols).rstrip())
        out += ["".join(_pad(r[i], widths[i], i < first) for i in cols).rstrip() for r in body]
        out.append("")
    return out


def _pad(text: str, width: int, left: bool) -> str:
    """The policy column left-aligned with two spaces after it, figures right-aligned."""
    return f"{text:<{width}}  " if left else f"{text:>{width}} "


def reasons(cmp: Comparison) -> list[str]:
    return sorted({r for row in cmp.rows for r in row.figures["evicted_by_reason"]})


# the few figures a glance needs (the demo's closing comparison): what each policy trained,
# threw away or never generated, and how stale what it trained was
BRIEF = (("trained_trajectories", "trained trajs"), ("wasted_trajectories", "wasted trajs"),
         ("saved_trajectories", "saved trajs"), ("staleness_mean", "stale mean"),
         ("staleness_max", "stale max"), ("over_bound_rows", "over bound"))


def brief(cmp: Comparison) -> list[str]:
    """The comparison in one table of `BRIEF` figures, with the '>=' floor note where one
    applies (the notes themselves are for the full command)."""
    body = [[label(cmp, i), *(cell(r, k) for k, _ in BRIEF)] for i, r in enumerate(cmp.rows)]
    out = _tables(f"what-if over the first {cmp.calls} sample calls (wasted: generated, never "
                  "trained; saved: admit would not have dispatched it)",
                  ["policy", *(h for _, h in BRIEF)], body, 1)
    if any(r.figures["future_rows"] for r in cmp.rows):
        out += textwrap.wrap("'>=': a floor (the replay trained rows from the future)", WIDTH)
    return out


def lines(cmp: Comparison) -> list[str]:
    """The comparison as text: a legend, the sections' tables, the approximations."""
    took = sum(r.took_s for r in cmp.rows)
    out = textwrap.wrap(f"replayed {len(cmp.rows) - 1} polic{'y' if len(cmp.rows) == 2 else 'ies'}"
                        f" x {cmp.calls} sample calls in {took:.1f} s; settings not named are "
                        "the recorded ones:", WIDTH)
    out += textwrap.wrap("recorded: " + ", ".join(f"{k}={_text(v)}" for k, v in
                                                   cmp.rows[0].settings.items()),
                         WIDTH, initial_indent="  ", subsequent_indent="    ")
    out.append("")
    for title, columns in SECTIONS:
        cols = list(columns)
        if title.startswith("trained"):
            cols += [(f"evicted {r}", f"evicted {r}") for r in reasons(cmp)]
        body = [[label(cmp, i), *(cell(r, k) for k, _ in cols)] for i, r in enumerate(cmp.rows)]
        out += _tables(title, ["policy", *(h for _, h in cols)], body, 1)
    if any(r.datasets for r in cmp.rows):
        body = []
        for n, r in enumerate(cmp.rows):
            body += [[label(cmp, n) if i == 0 else "", *(fmt(d[k], k) for k, _ in
                                                           DATASET_COLUMNS)]
                     for i, d in enumerate(r.datasets)]
        out += _tables("datasets: share of the trained and generated trajectories, starvation "
                       "(steps with groups in flight, none trained)",
                       ["policy", *(h for _, h in DATASET_COLUMNS)], body, 1)
    if any(r.figures["future_rows"] for r in cmp.rows):
        out += textwrap.wrap("'>=': a floor (rows from the future counted at staleness 0; see "
                             "the notes)", WIDTH) + [""]
    noted = [(i, r) for i, r in enumerate(cmp.rows) if r.notes]
    if noted:
        out.append("what the replay approximates, per policy:")
    for i, r in noted:
        out.append(f"  {f'#{i} ' if label(cmp, i) != r.label else ''}{r.label}:")
        for note in r.notes:
            out += textwrap.wrap(note, WIDTH, initial_indent="    - ",
                                 subsequent_indent="      ")
    return out


def _text(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def write(cmp: Comparison, out: Path) -> list[Path]:
    """The table as Parquet: `compare.parquet` (one row per policy, its settings as JSON, an
    `evicted_<reason>` column per reason, its approximation notes) and `datasets.parquet` (one
    row per policy, partition and dataset)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for r in cmp.rows:
        figs = {k: v for k, v in r.figures.items() if k != "evicted_by_reason"}
        rows.append({"policy": r.label, "settings": json.dumps(r.settings, sort_keys=True),
                     "identical_batches": r.identical, "sample_calls": cmp.calls,
                     "replay_s": r.took_s, **figs,
                     **{f"evicted_{k}": r.figures["evicted_by_reason"].get(k, 0)
                        for k in reasons(cmp)},
                     "notes": r.notes})
    table = pa.Table.from_pylist(rows)
    datasets = pa.Table.from_pylist(
        [{"policy": r.label, **d} for r in cmp.rows for d in r.datasets],
        schema=pa.schema([("policy", pa.string()), ("partition", pa.string()),
                          ("dataset", pa.string()), ("generated_trajectories", pa.int64()),
                          ("trained_trajectories", pa.int64()), ("generated_share", pa.float64()),
                          ("trained_share", pa.float64()), ("starved_stretches", pa.int64()),
                          ("longest_starved", pa.int64())]))
    paths = [out / "compare.parquet", out / "datasets.parquet"]
    pq.write_table(table, paths[0])
    pq.write_table(datasets, paths[1])
    return paths
