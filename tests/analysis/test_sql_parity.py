"""One declaration, two engines, on real runs: a simulated buffer writes a real lake, and around
every sample call the lake (DuckDB over the `candidates` view) and the live buffer (its candidate
table, the rules compiled with polars) must say the same thing:

- the lake's `candidates` view equals `ReplayBuffer.candidates(partition)` row for row;
- every rule file of `sql/rules/`, run by DuckDB over the lake, finds the groups the compiled rule
  finds over the live table, for every parameter value the run could bind;
- the groups the first poll of a sample call evicted, per reason, are those the enabled rule
  files find over the lake right before the call (so the live index, which only looks at what
  changed, misses nothing and invents nothing).
"""
from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from pipeline import ReplayBuffer
from pipeline.analysis.views import connect
from pipeline.decide import evaluate, rules
from schemas import CANDIDATES
from sql.loader import load, run
from tests.support.sql_runs import simulate_async, simulate_sync_dapo

THRESHOLD = 2
# What each simulated run switches on (the rules its configuration enables, with their params
# other than `step`) and the metric its zero-variance filter compares.
SCENARIOS: dict[str, dict[str, Any]] = {
    "async": {"metric": "reward",
              "enabled": {"stale": {"threshold": THRESHOLD, "tightest": THRESHOLD},
                          "zero_variance": {}, "failure": {"evict_all": True}}},
    "async_overlong": {"metric": "reward",
                       "enabled": {"stale": {"threshold": THRESHOLD, "tightest": THRESHOLD},
                                   "zero_variance": {}, "failure": {"evict_all": True},
                                   "overlong": {"max_response_length": 3}}},
    "sync": {"metric": "acc", "enabled": {"zero_variance": {}}},
}
# Values tried for every rule parameter besides `step` (engine parity runs every combination);
# a parameter not named here is tried with the values of its declared type, so a new rule needs
# no line here.
PARAM_VALUES: dict[str, list[Any]] = {
    "threshold": [1, THRESHOLD, 4],
    "tightest": [1],          # the stale horizon's bound: at most every threshold tried
    "evict_all": [True, False],
    "max_response_length": [1, 2, 4],    # its declared smallest value, 1, and above
}
TYPE_VALUES: dict[str, list[Any]] = {"BIGINT": [0, 2, 4], "INTEGER": [0, 2, 4],
                                     "DOUBLE": [0.0, 0.5, 2.0], "BOOLEAN": [True, False]}


def _rows(table: pa.Table, columns: list[str]) -> list[tuple]:
    return [tuple(r[c] for c in columns) for r in table.select(columns).to_pylist()]


def _bindings(rule: rules.Rule, step: int) -> Iterator[dict[str, Any]]:
    names = [p.name for p in rule.knobs]
    # a type's values below a parameter's declared minimum are not values it takes
    tried = {p.name: PARAM_VALUES.get(p.name, [v for v in TYPE_VALUES.get(p.type, [])
                                               if p.problem(v) is None] or None)
             for p in rule.knobs}
    unknown = [p for p in names if tried[p] is None]
    assert not unknown, f"rule {rule.name}: give test values for {unknown} in PARAM_VALUES"
    for values in itertools.product(*(tried[p] for p in names)):
        params = dict(zip(names, values))
        if "step" in rule.params:
            params["step"] = step
        yield params


def _live_hits(rule: rules.Rule, live: pa.Table, params: dict[str, Any]) -> list[tuple]:
    rows = [tuple(r.values()) for r in live.to_pylist()]
    use = rules.RuleUse(rule.name)     # no per-dataset bounds: none given
    frame = evaluate.rule_frame(rows, (use,), params)
    at = [live.column_names.index(c) for c in ("partition", "uid", "global_steps")]
    return [tuple(r[i] for i in at)
            for r, hit in zip(rows, evaluate.fired(rule, frame, len(rows))) if hit]


class Checker:
    """The checkpoint a simulated run calls around each sample call; it records what it saw."""

    def __init__(self, lake: Path, scenario: dict[str, Any]):
        self.lake = lake
        self.metric = scenario["metric"]
        self.enabled = scenario["enabled"]
        self.expected: dict[tuple[str, int], set[tuple[str, str]]] = {}
        self.compared = {"candidates": 0, "rule hits": 0}

    def __call__(self, buf: ReplayBuffer, step: int, partition: str, when: str) -> None:
        con = connect(self.lake, filter_metric=self.metric)
        # computed once: the rule files below then read this table (a temp relation shadows the
        # view of the same name) instead of rebuilding the view for every query
        con.sql("create temp table candidates as select * from main.candidates")
        lake = con.sql("select * from candidates where partition = $p",
                       params={"p": partition}).to_arrow_table()
        live = buf.candidates(partition)
        assert [(f.name, f.type) for f in live.schema] == [(f.name, f.type) for f in CANDIDATES]
        assert _rows(lake, CANDIDATES.names) == _rows(live, CANDIDATES.names), \
            f"step {step} {partition} {when}: the lake's candidates differ from the live table"
        self.compared["candidates"] += live.num_rows
        for rule in rules.registry().values():
            for params in _bindings(rule, step):
                got = [r for r in _rows(run(con, rule.name, **params),
                                        ["partition", "uid", "global_steps"])
                       if r[0] == partition]
                assert got == _live_hits(rule, live, params), \
                    f"rule {rule.name}{params} at step {step} ({when}): the engines differ"
                self.compared["rule hits"] += len(got)
        if when == "before":
            # rules never run on a validation partition: its sample calls evict nothing
            enabled = {} if partition == "val" else self.enabled
            found = set()
            for name, extra in enabled.items():
                values = {**extra, "step": step}
                params = {p.name: values[p.name] for p in load(name).params}
                found |= {(uid, name) for part, uid, _ in _rows(
                    run(con, name, **params), ["partition", "uid", "global_steps"])
                    if part == partition}
            self.expected[(partition, step)] = found


def _first_poll_evictions(lake: Path) -> dict[tuple[str, int], set[tuple[str, str]]]:
    con = connect(lake)
    out: dict[tuple[str, int], set[tuple[str, str]]] = {}
    for partition, step, uid, reason in con.sql(
            "select partition, step, uid, reason from decisions "
            "where kind = 'evict' and poll = 0").fetchall():
        out.setdefault((partition, step), set()).add((uid, reason))
    return out


@pytest.mark.parametrize(("kind", "seed", "surplus"), [
    ("async", 0, 0), ("async", 2, 2), ("async", 3, 3), ("async_overlong", 4, 2), ("sync", 1, 0),
    ("sync", 3, 0)])
def test_the_lake_and_the_live_buffer_agree_on_candidates_and_rules(
        kind: str, seed: int, surplus: int, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    check = Checker(lake, SCENARIOS[kind])
    if kind.startswith("async"):
        overlong = SCENARIOS[kind]["enabled"].get("overlong", {}).get("max_response_length")
        simulate_async(lake, threshold=THRESHOLD, seed=seed, surplus=surplus,
                       max_response_length=overlong, checkpoint=check)
    else:
        simulate_sync_dapo(lake, seed=seed, checkpoint=check)
    assert check.compared["candidates"] > 0 and check.compared["rule hits"] > 0

    evicted = _first_poll_evictions(lake)
    assert set(evicted) <= set(check.expected)
    for key, expected in check.expected.items():
        assert evicted.get(key, set()) == expected, f"first poll of the sample call at {key}"
    assert any(check.expected.values()), "the run never evicted anything: a weak scenario"


def test_the_rule_files_are_the_registered_rules() -> None:
    """Every file of sql/rules/ is a registered rule or check, so the tests above cover them all."""
    from sql.loader import in_folder
    assert sorted(q.name for q in in_folder("rules")) == sorted(rules.registry())
