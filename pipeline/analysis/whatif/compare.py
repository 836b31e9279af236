"""Several policies in one what-if: replay a recorded lake once per setting and gather, per
policy, the figures that choose between them (`replaylake whatif --compare`).

A policy is written as the buffer's keywords, ``KEY=VALUE`` items joined by commas
(``threshold=1``, ``strategy=wait,threshold=4``, ``rules={"overlong": null}``,
``rule=overlong.max_response_length=12``): any keyword the recorded preset takes, with the
short names of the single-policy flags (`ALIASES`). A value is read as JSON, else as a string;
``none`` is None (``filter_metric=none``: no filter; ``threshold=none``: no bound). Every policy
is checked before the first replay starts.

Each row's figures are named queries over that row's own lake (the recorded lake for the
recorded row, the replay's lake for the others): `whatif_figures` (trained rows, staleness,
the certificate audit), `whatif_waste` (groups and trajectories trained, wasted, saved,
evictions per reason), `whatif_distributions` (trained vs generated length and reward, the
Kolmogorov-Smirnov statistic) and `whatif_datasets` (per-dataset shares and starvation).

`admit` cannot be replayed (it paces dispatches, and a replay feeds the recorded ones). Its row
replays `drop` at the same bound (the `stale` rule is admit's safety net, so the batches it can
train are the same) and counts the groups `drop` evicted as stale as never dispatched: saved
generation, not waste. A live `admit` run dispatches later and fewer groups, so its arrivals
(and hence its staleness) differ from the recorded ones; its approximation note says so.
"""
from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.analysis.whatif.headline import approximations
from pipeline.analysis.whatif.outcome import Outcome
from pipeline.analysis.whatif.record import Record
from pipeline.analysis.whatif.rerun import (
    chosen_settings,
    new_lake,
    recorded,
    recorded_settings,
    replay,
)
from pipeline.errors import ConfigError

# the single-policy flags' names for the buffer's keywords
ALIASES = {"threshold": "max_off_policy_threshold", "strategy": "max_off_policy_strategy",
           "filter_metric": "filter_groups_metric"}
# keywords the replay sets itself
REPLAY_OWNS = ("refill_fn", "poll_interval")
SAVED_REASON = "stale"      # what `admit` would not have dispatched


@dataclass(frozen=True)
class Policy:
    """One compared setting: the text as given and the keywords it sets."""

    label: str
    settings: dict[str, Any]


@dataclass
class Row:
    """One row of the comparison: a policy (or the recorded run) and its figures."""

    label: str
    settings: dict[str, Any]
    figures: dict[str, Any]
    distributions: list[dict[str, Any]]
    datasets: list[dict[str, Any]]
    staleness_by_step: list[dict[str, Any]]
    identical: int
    notes: list[str] = field(default_factory=list)
    took_s: float = 0.0
    lake: Path | None = None


@dataclass
class Comparison:
    lake: Path
    calls: int
    rows: list[Row]


def parse_policy(text: str, keys: list[str]) -> Policy:
    """One ``--compare`` item as buffer keywords; ``keys`` are the keywords the preset takes."""
    from pipeline.config import rules_from_options
    from pipeline.config.keywords import did_you_mean
    settings: dict[str, Any] = {}
    rule_items: list[str] = []
    for item in _items(text):
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq or not key or not raw.strip():
            raise ConfigError(f"--compare {text!r}: write each setting as KEY=VALUE (e.g. "
                              "threshold=1, strategy=wait, rule=overlong=off), several joined "
                              "by commas")
        if key == "rule":
            rule_items.append(raw.strip())
            continue
        name = ALIASES.get(key, key)
        if name in REPLAY_OWNS or name not in keys:
            known = [*ALIASES, "rule", *(k for k in keys if k not in REPLAY_OWNS)]
            raise ConfigError(f"--compare {text!r}: {key!r} is no setting a replay takes"
                              f"{did_you_mean(key, known)} (settings: {', '.join(known)})")
        if name in settings:
            raise ConfigError(f"--compare {text!r}: {key!r} is given twice")
        settings[name] = _value(raw.strip())
    if rule_items:
        if "rules" in settings:
            raise ConfigError(f"--compare {text!r}: give rules=MAPPING or rule=RULE.PARAM=VALUE "
                              "items, not both")
        settings["rules"] = rules_from_options(rule_items)
    return Policy(label=text, settings=settings)


def _items(text: str) -> list[str]:
    """``text`` split at the commas outside brackets and quotes (a JSON value keeps its own)."""
    out, depth, quoted, start = [], 0, False, 0
    for i, ch in enumerate(text):
        if ch == '"' and (i == 0 or text[i - 1] != "\\"):
            quoted = not quoted
        elif not quoted and ch in "[{":
            depth += 1
        elif not quoted and ch in "]}":
            depth -= 1
        elif not quoted and depth == 0 and ch == ",":
            out.append(text[start:i])
            start = i + 1
    return [x for x in (*out, text[start:]) if x.strip()]


def _value(raw: str) -> Any:
    if raw.lower() == "none":
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def parse_policies(lake: Path, texts: list[str]) -> list[Policy]:
    """Every ``--compare`` item parsed and checked against the recorded settings (no replay
    runs yet): an unknown keyword or a bad value names the item."""
    import inspect

    from pipeline.config import async_config, sync_config
    base = recorded_settings(lake)
    make = async_config if base["preset"] == "async" else sync_config
    keys = list(inspect.signature(make).parameters)
    policies = [parse_policy(t, keys) for t in texts]
    for p in policies:
        try:
            chosen_settings(lake, _replayed(base, p.settings)[0])
        except ConfigError as e:
            raise ConfigError(f"--compare {p.label!r}: {e}") from None
    return policies


def _replayed(base: dict[str, Any], settings: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The settings a replay runs for ``settings``, and whether they stand in for `admit`."""
    strategy = settings.get("max_off_policy_strategy", base["max_off_policy_strategy"])
    if strategy != "admit":
        return settings, False
    return {**settings, "max_off_policy_strategy": "drop"}, True


def compare(lake: str | Path, texts: list[str], out: str | Path | None = None,
            progress: Callable[[str], None] = lambda label: None,
            max_calls: int | None = None) -> Comparison:
    """The recorded run and one replay per ``--compare`` item, with each row's figures. The
    replays' lakes go under ``out/replays`` (a temporary directory when ``out`` is None).

    ``max_calls``: compare over the first that many recorded sample calls only (see `replay`);
    the recorded row is then a replay of the recorded settings over the same window (it
    reproduces the recorded batches), so every row covers the same calls."""
    lake = Path(lake)
    policies = parse_policies(lake, texts)
    base = recorded_settings(lake)
    rec = recorded(lake)
    root = Path(out) / "replays" if out is not None else Path(tempfile.mkdtemp(prefix="whatif-"))
    for i in range(len(policies) + 1):       # every replay's lake, checked before the first runs
        new_lake(root / f"p{i}" / "lake", lake)
    with Record(lake) as record:             # and a record no replay can follow, refused once
        record.check()
    recorded_lake = lake
    if max_calls is not None:
        rec.batches = rec.batches[:max_calls]
        recorded_lake = replay(lake, root / "p0", max_calls=max_calls).lake
    rows = [_row("recorded", _shown(base), recorded_lake, base["filter_groups_metric"], False,
                 identical=len(rec.batches))]
    for i, p in enumerate(policies, 1):
        progress(p.label)
        settings, admit = _replayed(base, p.settings)
        start = time.perf_counter()
        result = replay(lake, root / f"p{i}", max_calls=max_calls, **settings)
        took = time.perf_counter() - start
        chosen = {**base, **settings}
        same = sum(a == b for a, b in zip(rec.batches, result.batches))
        row = _row(p.label, p.settings, result.lake, chosen["filter_groups_metric"], admit,
                   identical=same)
        row.took_s = took
        row.notes = _notes(row, result, len(rec.batches), chosen, admit,
                           rows[0].figures["evicted"])
        rows.append(row)
    return Comparison(lake=lake, calls=len(rec.batches), rows=rows)


def _shown(base: dict[str, Any]) -> dict[str, Any]:
    """The recorded settings as the legend shows them (no empty rules mapping)."""
    return {k: v for k, v in base.items() if k != "rules" or v}


def _row(label: str, settings: dict[str, Any], lake: Path, metric: str | None, admit: bool,
         identical: int) -> Row:
    from pipeline.analysis import connect
    from sql import loader
    con = connect(lake, filter_metric=metric)
    saved = SAVED_REASON if admit else ""
    figs = loader.run(con, "whatif_figures").to_pylist()[0]
    waste = loader.run(con, "whatif_waste", saved_reason=saved).to_pylist()[0]
    figs.update(waste, evicted_by_reason=dict(waste["evicted_by_reason"]))
    dist = loader.run(con, "whatif_distributions", saved_reason=saved).to_pylist()
    for measure in ("response_len", "reward"):
        figs[f"ks_{measure}"] = next((r["ks"] for r in dist if r["measure"] == measure), None)
    return Row(label=label, settings=settings, figures=figs, distributions=dist,
               datasets=loader.run(con, "whatif_datasets", saved_reason=saved).to_pylist(),
               staleness_by_step=loader.run(con, "staleness_by_step").to_pylist(),
               identical=identical, lake=lake)


def _notes(row: Row, result: Outcome, calls: int, chosen: dict[str, Any], admit: bool,
           recorded_evicted: int) -> list[str]:
    notes = approximations(row.figures, result, calls, row.identical, chosen, unfilled=True,
                           recorded_evicted=recorded_evicted)
    if not admit or chosen.get("preset") == "sync":     # (sync: the staleness note says it)
        return notes
    f = row.figures
    said = (f"admit: replayed as drop at the same bound (the stale rule is admit's safety net), "
            f"and the {f['saved_groups']:,} group(s) drop evicted as stale "
            f"({f['saved_trajectories']:,} trajectories, {f['saved_tokens']:,} response tokens) "
            "are counted as never dispatched: saved, not wasted. A live admit run dispatches "
            "fewer groups and later, so it would not wait for the same arrivals; a replay "
            "cannot re-time them")
    return [notes[0], said, *notes[1:]] if notes else [said]

