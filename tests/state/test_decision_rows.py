"""Decision rows are made by one constructor: kinds are checked, a refill is one row without a
uid, and a group decision has one row per group with its shared columns filled in."""
from __future__ import annotations

import pytest

from pipeline.errors import InvariantError
from pipeline.state import KINDS, decision_rows


def test_an_unknown_kind_is_refused_naming_the_kinds() -> None:
    with pytest.raises(InvariantError, match="unknown decision kind 'evicted'.*refill_failed"):
        decision_rows("evicted", partition="train", step=1, uids=["a"])


def test_a_refill_is_one_row_without_a_uid_and_its_replaces_are_that_rows_list() -> None:
    rows = decision_rows("refill", partition="train", step=3, call_id=2, poll=1,
                         reason="ReplaceEvicted", count=4, replaces=["a", "b"])
    assert rows.arrow().to_pylist() == [{
        "partition": "train", "step": 3, "call_id": 2, "poll": 1, "kind": "refill", "uid": None,
        "reason": "ReplaceEvicted", "group_span": None, "value": None, "batch_id": None,
        "count": 4, "replaces": ["a", "b"], "bound": None, "strategy": None,
        "request": None}]


def test_a_group_decision_needs_uids_and_a_refill_names_none() -> None:
    with pytest.raises(InvariantError, match="needs uids"):
        decision_rows("select", partition="train", step=1)
    with pytest.raises(InvariantError, match="names no uids"):
        decision_rows("refill", partition="train", step=1, uids=["a"], count=1)


def test_a_group_decision_shares_scalars_and_spreads_lists_over_its_rows() -> None:
    rows = decision_rows("evict", partition="train", step=[5, 6], uids=["a", "b"],
                         reason="stale", group_span=[3, 4]).arrow().to_pylist()
    assert [(r["uid"], r["step"], r["reason"], r["group_span"], r["call_id"], r["poll"],
             r["count"]) for r in rows] == [("a", 5, "stale", 3, -1, 0, 1),
                                            ("b", 6, "stale", 4, -1, 0, 1)]


def test_a_selection_carries_the_bound_in_force_on_every_row() -> None:
    rows = decision_rows("select", partition="train", step=4, uids=["a", "b"], batch_id=0,
                         group_span=[2, 3], bound=3, strategy="drop").arrow().to_pylist()
    assert [(r["uid"], r["bound"], r["strategy"]) for r in rows] == [("a", 3, "drop"),
                                                                     ("b", 3, "drop")]
    assert set(KINDS) == {"evict", "select", "discard", "refill", "refill_failed",
                          "refill_deferred", "release"}
