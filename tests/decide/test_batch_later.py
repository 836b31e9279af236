"""A buffer without a lake makes a batch's table and off-policy metrics when they are first read
(`Batch.later`): the same table and metrics a buffer over a lake makes at once, whenever they are
read (after the batch's release, after later puts), pickled too; a row from a future weight
version is still warned about at the selection."""
from __future__ import annotations

import logging
import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipeline import ReplayBuffer
from pipeline.decide.batch import Batch
from pipeline.state.payload import TrajectoryRows
from schemas import BATCH_PROVENANCE, TRAJECTORIES
from tests.support.lake import add_group, traj

_BUILT = ("table", "off_policy_metrics", "metric_weights")


def _fill(buf: ReplayBuffer) -> None:
    add_group(buf, "a", 3, [1.0, 0.0])
    add_group(buf, "b", 4, [0.5, 0.5, 0.25])
    buf.register(partition="train", uids=["c"], global_steps=4)
    buf.put([traj("c", 0, min_gs=1, max_gs=3, reward=1.0, response=(5, 6, 7)),
             traj("c", 1, min_gs=2, max_gs=2, reward=0.0, is_padding=True)])
    buf.update_status(partition="train", uids=["c"], status="finished")
    add_group(buf, "d", 5, [1.0])             # not chosen: its rows arrive after the batch's


def _rows(batch: Batch) -> dict:
    """The batch's table, but the time each row was taken in (each buffer's own clock)."""
    assert batch.table.schema.names[-len(BATCH_PROVENANCE) - 1] == "ts"
    return batch.table.drop_columns(["ts"]).to_pydict()


def _later_puts(buf: ReplayBuffer) -> None:
    add_group(buf, "e", 5, [0.0, 1.0])


@pytest.fixture
def pair(tmp_path: Path):
    memory = ReplayBuffer.async_(max_off_policy_threshold=8)
    lake = ReplayBuffer.async_(max_off_policy_threshold=8, lake=tmp_path / "lake")
    yield memory, lake
    memory.close()
    lake.close()


def test_without_a_lake_the_table_and_metrics_are_made_at_first_read_and_equal_the_lakes(pair):
    memory, lake = pair
    for b in pair:
        _fill(b)
    later, now = memory.sample(6, "train", 3), lake.sample(6, "train", 3)
    assert not set(_BUILT) & vars(later).keys()      # nothing made yet
    assert set(_BUILT) <= vars(now).keys()           # a lake's batch is made whole
    assert (len(later), later.num_groups, later.uids) == (len(now), 3, ["a", "b", "c"])
    assert later.eviction_metrics == now.eviction_metrics
    assert not set(_BUILT) & vars(later).keys()      # len and the uids made nothing either
    # read after its release (its rows left memory) and after more puts: the rows it chose
    memory.release(later)
    lake.release(now)
    for b in pair:
        _later_puts(b)
    assert _rows(later) == _rows(now)
    assert later.metrics == now.metrics and later.metric_weights == now.metric_weights
    assert later.table["uid"].to_pylist() == ["a", "a", "b", "b", "b", "c", "c"]
    assert later.table["staleness"].to_pylist() == [3, 3, 2, 2, 2, 2, 3]
    assert "_build" not in vars(later)               # made once


def test_reading_any_one_of_them_first_makes_all_three(pair):
    memory, _ = pair
    _fill(memory)
    batch = memory.sample(6, "train", 2)
    weights = batch.metric_weights
    assert set(_BUILT) <= vars(batch).keys()
    assert weights and batch.off_policy_metrics and batch.table.num_rows == len(batch) == 5


def test_a_batch_not_yet_made_pickles_made(pair):
    memory, lake = pair
    for b in pair:
        _fill(b)
    later, now = memory.sample(6, "train", 3), lake.sample(6, "train", 3)
    back = pickle.loads(pickle.dumps(later))
    assert "_build" not in vars(back)
    assert _rows(back) == _rows(now) and back.metrics == now.metrics
    assert back == later


def test_a_row_from_the_future_is_warned_about_at_the_selection_without_a_lake(pair, caplog):
    memory, _ = pair
    add_group(memory, "past", 3, [1.0, 0.0])
    add_group(memory, "ahead", 3, [1.0], min_gs=4, max_gs=5)
    with caplog.at_level(logging.WARNING, logger="replaylake"):
        batch = memory.sample(5, "train", 2)
    (message,) = [r.getMessage() for r in caplog.records if "from the future" in r.getMessage()]
    assert "['ahead']" in message and "staleness down to -1" in message
    assert set(_BUILT) <= vars(batch).keys()        # made at once, to tell it
    assert batch.table["staleness"].to_pylist() == [2, 2, -1]


def test_a_batch_without_a_future_row_warns_nothing_when_read(pair, caplog):
    memory, _ = pair
    add_group(memory, "a", 3, [1.0, 0.0])
    with caplog.at_level(logging.WARNING, logger="replaylake"):
        batch = memory.sample(5, "train", 1)
        assert batch.table["staleness"].to_pylist() == [2, 2]
    assert not [r for r in caplog.records if "from the future" in r.getMessage()]


def test_batch_later_names_what_it_does_not_hold():
    batch = Batch.later(lambda: (None, {}, {}), 0, batch_id=0, step=1, partition="train",
                        uids=[])
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        batch.nothing                                  # noqa: B018


def test_a_gather_planned_before_its_rows_are_dropped_still_copies_them():
    rows = TrajectoryRows()
    chunks = []
    for start in (0, 4):
        data = {f.name: pa.nulls(4, f.type) for f in TRAJECTORIES}
        data["seq"] = pa.array(range(start, start + 4), pa.int64())
        chunks.append(pa.table(data, schema=TRAJECTORIES))
        rows.append(chunks[-1])
    plan = rows.plan(np.array([1, 2, 5, 7]))   # a run of one chunk, scattered rows of the other
    assert plan.num_rows == 4
    rows.drop(range(0, 8))                     # both chunks let go
    assert plan.table()["seq"].to_pylist() == [1, 2, 5, 7]
    assert rows.take(np.array([], dtype=np.int64)).num_rows == 0
