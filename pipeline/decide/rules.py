"""The eviction rules and checks: each is one declaration in `sql/rules/`, registered here by name.

A rule file is a query over the `candidates` relation (one row per terminal group with its
aggregates, schema `schemas.CANDIDATES`) whose predicate decides eviction. Its header says:

- ``reason``: the eviction reason written in the decision log (``check`` instead: a predicate
  that must find nothing, e.g. a trajectory lacking the filter metric);
- ``params``: what the buffer's configuration binds, each with its type (``$step`` is always
  the call's step; every other parameter is a knob the configuration sets by name, checked
  against this declaration: ``rules={"overlong": {"max_response_length": 12}}``);
- ``horizon``: the dispatch step below which *time* can make the rule fire on a group it kept
  before (an expression over the params), or ``none``: the rule reads only the group's own,
  immutable aggregates, so a group is judged once, when it turns terminal;
- ``metric``: the key (after the `training/` or `validation/` prefix) counting groups evicted for
  this reason; ``spread``: a key whose `/mean|max|min` summarise their group spans; ``value``: a
  column recorded with each eviction and tallied into the filtered reward counts;
- ``credit``: the refill credit one eviction earns in sync DAPO (the largest of a group's reasons);
- ``lookup``: ``<relation> on <column>``: the rule left-joins a small relation of settings given
  as rows (schemas.LOOKUPS, e.g. the per-dataset `stale_bounds`) on one candidate column, and its
  predicate reads that relation's other columns (null where no row matches). The configuration
  hands the rows with the rule (`RuleUse.tables`); DuckDB runs the join as written, the live
  buffer joins the same rows onto the poll's frame before the predicate (`add_lookups`).

Adding a rule is a new file here plus its case in `sql/cases/`: the registry finds the file, its
parameters and metric keys, and a configuration switches it on by name (see
`pipeline.config.rule_knobs`); no code names it. Rules never run on validation partitions (see
`pipeline.config.partitions`).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from pipeline.decide import compile as declared
from pipeline.decide import vectors
from schemas import CANDIDATES, LOOKUPS
from sql import loader
from sql.loader import SqlError

STEP = "step"   # bound by every call to its step, never by a configuration


@dataclass(frozen=True)
class Rule:
    """One declared rule or check (see the module docstring for the header fields)."""

    name: str
    kind: str                    # "reason" (evicts) | "check" (must find nothing)
    params: tuple[str, ...]
    knobs: tuple[loader.Param, ...]   # the declared params a configuration sets (all but step)
    horizon_text: str | None
    metric: str | None
    spread: str | None
    value: str | None
    credit: int
    predicate: str = field(repr=False, compare=False)    # the text between `where (` and `)`
    lookup: tuple[str, str] | None = None   # (relation, candidate column) it joins, if any

    @property
    def expr(self) -> vectors.Compiled:
        """The predicate compiled for numpy (at its first use: compiling reads the text with
        DuckDB's parser, which importing the buffer does not load)."""
        return vectors.compile_cached(self.predicate)

    def horizon(self, params: Mapping[str, Any]) -> int | None:
        """The dispatch step below which time can newly make this rule fire (None: never)."""
        if self.horizon_text is None:
            return None
        return int(declared.evaluate_bound(self.horizon_text, params))


def _rule(q: loader.Query) -> Rule:
    x = q.extra
    if ("reason" in x) == ("check" in x):
        raise SqlError(f"{q.path}: a rule declares exactly one of `reason` or `check`")
    name = x.get("reason") or x["check"]
    if name != q.name:
        raise SqlError(f"{q.path}: reason/check {name!r} must equal the query name {q.name!r}")
    horizon = x.get("horizon", "none").strip()
    horizon = None if horizon.lower() == "none" else horizon
    params = tuple(p.name for p in q.params)
    if horizon is not None:
        undeclared = loader.placeholders(horizon) - set(params)
        if undeclared:
            raise SqlError(f"{q.path}: horizon uses undeclared params {sorted(undeclared)}")
        declared.to_polars(horizon)   # a horizon that does not compile fails at load, not later
    return Rule(
        lookup=_lookup(q),
        name=name, kind="reason" if "reason" in x else "check", params=params,
        knobs=tuple(p for p in q.params if p.name != STEP),
        horizon_text=horizon, metric=x.get("metric"), spread=x.get("spread"),
        value=x.get("value"), credit=int(x.get("credit", "0")),
        predicate=declared.predicate(q))


def _lookup(q: loader.Query) -> tuple[str, str] | None:
    text = q.extra.get("lookup")
    if text is None:
        return None
    relation, on, column = (text.split() + ["", "", ""])[:3]
    if on != "on" or relation not in LOOKUPS or column not in CANDIDATES.names \
            or relation not in q.tables or len(text.split()) != 3:
        raise SqlError(f"{q.path}: lookup {text!r}: write `<relation> on <candidate column>`, "
                       f"the relation one of {', '.join(LOOKUPS)} and named in `reads`")
    return relation, column


@cache
def registry() -> dict[str, Rule]:
    """Every rule and check of `sql/rules/`, by name (parsed and compiled once per process)."""
    return {q.name: _rule(q) for q in loader.in_folder("rules")}


def reasons() -> dict[str, Rule]:
    """The eviction rules (not the checks), by reason, in a stable order."""
    return {k: r for k, r in sorted(registry().items()) if r.kind == "reason"}


def get(name: str) -> Rule:
    rules = registry()
    if name not in rules:
        raise SqlError(f"unknown rule {name!r}; rules: {', '.join(sorted(rules))}")
    return rules[name]


@dataclass(frozen=True)
class RuleUse:
    """A rule switched on by a configuration, with the parameters it binds (all but `step`)."""

    name: str
    params: tuple[tuple[str, Any], ...] = ()
    tables: tuple[tuple[str, tuple[tuple, ...]], ...] = ()   # lookup relation -> its rows

    @property
    def rule(self) -> Rule:
        return get(self.name)

    def lookup_rows(self) -> tuple[tuple, ...]:
        """The rows of the relation the rule joins (none given: no row matches)."""
        lookup = self.rule.lookup
        return () if lookup is None else dict(self.tables).get(lookup[0], ())

    def bind(self, step: int) -> dict[str, Any]:
        """The rule's parameters for one call at ``step``: exactly those it declares."""
        values = dict(self.params, **{STEP: step})
        return {p: values[p] for p in self.rule.params}


def add_lookups(frame: dict[str, vectors.Col], uses: tuple[RuleUse, ...], n: int) -> None:
    """Add to ``frame`` (candidate columns, ``n`` rows) the columns each rule's lookup relation
    adds: its rows left-joined on the declared column, as the rule's SQL joins them (NULL where
    none match; a NULL key matches nothing). The relation's key is unique (a configuration's
    mapping), so the join is a dict lookup per row."""
    for u in uses:
        if u.rule.lookup is None:
            continue
        relation, column = u.rule.lookup
        schema = LOOKUPS[relation]
        at = schema.names.index(column)
        index = {r[at]: r for r in u.lookup_rows()}
        keys = frame[column].tolist() if index else [None] * n
        for i, f in enumerate(schema):
            if f.name != column:    # no row given: a column of NULLs
                frame[f.name] = vectors.from_list(
                    [index[k][i] if k in index else None for k in keys], f.type)
