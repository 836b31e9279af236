"""`view`: the frozen snapshot `lookup` returns is made without the dataclass's __init__ (an adapter
looks up every new group of every poll); it must be exactly the instance __init__ would make."""
from __future__ import annotations

import dataclasses

import pytest

from pipeline.state.partition import Group, GroupView, view


def test_a_view_is_the_instance_the_dataclass_makes_with_every_field():
    g = Group("u1", 7, 4, prompt_id=12, dataset="math")
    g.add_run(0, 2, [(0, 0), (1, 0)])
    g.status, g.removed, g.batch_id = "finished", "sampled", 3
    got = view("u1", g, False)
    want = GroupView("u1", 7, 4, "finished", "sampled", 3, frozenset({(0, 0), (1, 0)}), 12, "math")
    assert got == want and repr(got) == repr(want) and hash(got.keys) == hash(want.keys)
    assert list(vars(got)) == [f.name for f in dataclasses.fields(GroupView)]
    assert got.sessions == frozenset({0, 1})
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.status = "pending"                 # type: ignore[misc]


def test_a_removed_or_unknown_uid_is_viewed_as_before():
    assert view("gone", None, True) == GroupView("gone", None, None, "removed", "retired", None,
                                                 frozenset())
    assert view("never", None, False) is None
