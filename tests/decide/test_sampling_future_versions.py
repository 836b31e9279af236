"""Rows whose newest weight version is not older than the training step: `sample` flags them in
a warning and hands them out unchanged (negative staleness), and padding rows never count."""
from __future__ import annotations

import logging

from tests.support.lake import add_group, traj


def _future_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "from the future" in r.getMessage()]


def test_a_row_from_a_future_version_is_warned_about_and_kept_with_negative_staleness(
        buf, caplog):
    add_group(buf, "past", 3, [1.0, 0.0])
    add_group(buf, "ahead", 3, [1.0], min_gs=4, max_gs=5)
    with caplog.at_level(logging.WARNING, logger="replaylake"):
        batch = buf.sample(5, "train", 2)
    assert batch.uids == ["past", "ahead"]
    assert batch.table["staleness"].to_pylist() == [2, 2, -1]
    (message,) = _future_warnings(caplog)
    assert "1 trained row(s)" in message and "staleness down to -1" in message
    assert "['ahead']" in message


def test_a_batch_without_future_versions_warns_nothing(buf, caplog):
    add_group(buf, "a", 3, [1.0, 0.0])
    add_group(buf, "b", 4, [1.0])
    with caplog.at_level(logging.WARNING, logger="replaylake"):
        batch = buf.sample(5, "train", 2)
    assert batch.table["staleness"].to_pylist() == [2, 2, 1]
    assert _future_warnings(caplog) == []


def test_a_padding_row_from_a_future_version_is_not_warned_about(buf, caplog):
    buf.register(partition="train", uids=["padded"], global_steps=3)
    buf.put([traj("padded", 0, min_gs=2, max_gs=2, reward=1.0),
             traj("padded", 1, min_gs=6, max_gs=6, reward=0.0, is_padding=True)])
    buf.update_status(partition="train", uids=["padded"], status="running")
    buf.update_status(partition="train", uids=["padded"], status="finished")
    with caplog.at_level(logging.WARNING, logger="replaylake"):
        batch = buf.sample(5, "train", 1)
    assert batch.table["staleness"].to_pylist() == [2, -2]
    assert _future_warnings(caplog) == []
