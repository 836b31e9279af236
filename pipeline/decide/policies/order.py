"""The selection order as a value: which candidates a `sample` takes first.

Oldest first (dispatch step, then terminal seq) is the default and verl's order. A declared order
ranks the candidates by a key over a group's aggregates instead, then by terminal seq and uid
(so ties never depend on hash order). The key reads only the group's own aggregates, which are
fixed once it is terminal: each group is keyed once, when its aggregates are computed, and the
candidate index keeps a heap of `(key, term_seq, uid)` beside its dispatch-order heap, so a
`sample` still costs O(change + k log k), never a sort of the buffer.

Each order is one file, `sql/policies/select_<name>.sql`: DuckDB runs it over a lake's
candidates, and the live buffer compiles its `order_key` item (step `keyed`) and reads its window
order, so both engines rank by the same text.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from pipeline.decide import compile as declared
from pipeline.decide import vectors
from pipeline.errors import ConfigError
from sql import loader
from sql.loader import SqlError

DEFAULT = "oldest"
# every accepted `selection_order`, with what it ranks first (the error message lists them)
ORDERS = {
    "oldest": "the oldest dispatch step (verl's order)",
    "spread_first": "the widest spread of the group's metric (most learning signal)",
    "oldest_version": "the oldest weight version of the group's trajectories (nearest to stale)",
}
KEY, KEY_STEP = "order_key", "keyed"
# what a declared order's window must rank by: the key, then the tie-breaks
RANKING = (KEY, "term_seq", "uid")
# the aggregate a rule-free buffer computes so that a metric-reading key has values (the reward
# sum, as the lake's `group_trajectories` reads it under its default filter metric)
DEFAULT_METRIC = "reward"


def query(name: str) -> str:
    """The selection file of order ``name``."""
    return f"select_{name}"


def check(value: object) -> str:
    """``value`` when it names an order, else a ConfigError naming the field and the choices."""
    if not isinstance(value, str) or value not in ORDERS:
        choices = "; ".join(f"{k!r} ({v})" for k, v in ORDERS.items())
        raise ConfigError(f"selection_order={value!r} is not an order; use one of {choices}")
    return value


@dataclass(frozen=True)
class SelectionOrder:
    """A declared (non-default) order: ``name`` in ORDERS, other than the default."""

    name: str

    def __post_init__(self) -> None:
        if check(self.name) == DEFAULT:
            raise ConfigError("selection_order='oldest' is the candidate index's own order; "
                              "it needs no SelectionOrder (use None)")
        _compiled(self.name)     # a broken declaration fails at construction, not at a poll

    @property
    def key(self) -> vectors.Compiled:
        """The declared key, compiled for numpy: an expression over candidate columns
        (`reads`)."""
        return _compiled(self.name)

    @property
    def reads(self) -> tuple[str, ...]:
        """The candidate columns the key reads."""
        return _reads(self.name)

    @property
    def reads_metric(self) -> bool:
        """Whether the key reads the aggregated metric (`metric_*` columns)."""
        return any(c.startswith("metric_") for c in self.reads)

    def metric(self, filter_metric: str | None) -> str | None:
        """The metric the group aggregates read under this order: the filter metric, or the
        reward sum (`DEFAULT_METRIC`) when none is set and the key reads the metric."""
        if filter_metric is None and self.reads_metric:
            return DEFAULT_METRIC
        return filter_metric


def check_ranking(q: loader.Query) -> None:
    """Refuse a selection file whose window does not rank by `RANKING`: the candidate index's
    heap entry is that tuple, so any other ranking would make the engines disagree."""
    ranking = declared.window_order(q)
    if ranking != RANKING:
        raise SqlError(f"{q.path}: a declared order ranks by {', '.join(RANKING)} (the candidate "
                       f"index's heap entry), not {', '.join(ranking)}")


@cache
def _compiled(name: str) -> vectors.Compiled:
    q = loader.load(query(name))
    check_ranking(q)
    items = declared.select_items(q, KEY_STEP)
    if KEY not in items:
        raise SqlError(f"{q.path}: step {KEY_STEP!r} needs an `<expression> as {KEY}` item")
    return vectors.compile_cached(items[KEY])


@cache
def _reads(name: str) -> tuple[str, ...]:
    return tuple(sorted(_compiled(name).reads))


def selection_order(value: object) -> SelectionOrder | None:
    """The order value of a `selection_order` setting (None: the default, oldest first)."""
    return None if check(value) == DEFAULT else SelectionOrder(value)
