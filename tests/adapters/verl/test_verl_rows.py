"""The trajectory rows the verl mirror builds for `put`: the columns every row shares are
remembered columns, a reward not read is null (not known), and a float column keeps each value
as written (0.0 and -0.0 compare equal, so no float column is remembered)."""
from __future__ import annotations

import math

from pipeline.adapters.verl.rows import _table


def _todo(n: int) -> list:
    return [(f"u{i}_0_0", (f"u{i}", 0, 0), 4) for i in range(n)]


def _tags(n: int, **extra) -> list[dict]:
    return [{"min_global_steps": 2, "max_global_steps": 3, **extra} for _ in range(n)]


def test_rewards_not_read_are_null_and_every_shared_column_holds_its_value():
    table = _table("train", _todo(3), _tags(3), [0, 1, 2], [None] * 3, [None] * 3, {}, None)
    assert table["reward"].null_count == 3        # not known: never a made-up 0.0
    assert table["is_padding"].to_pylist() == [False] * 3
    assert table["versions_inferred"].to_pylist() == [False] * 3
    assert table["partition"].to_pylist() == ["train"] * 3
    assert table["reward_info"].null_count == 3
    assert table["prompt_ids"].to_pylist() == [[], [], []]
    assert table["response_ids"].to_pylist() == [[], [], []]
    assert table["min_global_steps"].to_pylist() == [2] * 3


def test_a_negative_zero_reward_keeps_its_sign():
    table = _table("train", _todo(2), _tags(2), [0, 1], [-0.0, -0.0], [None] * 2, {}, None)
    assert [math.copysign(1.0, r) for r in table["reward"].to_pylist()] == [-1.0, -1.0]
    mixed = _table("train", _todo(2), _tags(2), [0, 1], [0.0, -0.0], [None] * 2, {}, None)
    assert [math.copysign(1.0, r) for r in mixed["reward"].to_pylist()] == [1.0, -1.0]


def test_padding_rows_are_marked_row_by_row():
    tags = _tags(3)
    tags[1]["is_padding"] = True
    table = _table("train", _todo(3), tags, [0, 1, 2], [None] * 3, [None] * 3, {}, None)
    assert table["is_padding"].to_pylist() == [False, True, False]
