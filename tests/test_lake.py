"""The lake writer under failure: a failed write is reported, hides nothing, and burns its seqs."""
from __future__ import annotations

import pyarrow as pa
import pytest

from pipeline import LakeError, ReplayBuffer
from pipeline.lake import LakeWriter, read_table, segment_files
from tests.conftest import traj


def test_a_failed_lake_write_raises_lake_error_and_later_writes_stay_readable(tmp_path):
    buf = ReplayBuffer.sync(lake=tmp_path / "lake")
    buf.register(partition="train", uids=["a", "b"], global_steps=1)
    buf.put([traj("a", 0)])
    writer: LakeWriter = buf._journal.lake
    real = writer._append

    def broken(table, rows):
        raise OSError(28, "No space left on device")

    writer._append = broken
    with pytest.raises(LakeError, match="No space left"):
        buf.put([traj("b", 0)])
    writer._append = real
    assert buf.counts("train")["pending"] == 2
    assert len(buf._parts["train"].groups["b"].rows) == 0      # nothing applied in memory
    buf.put([traj("b", 0)])                                     # the retry is accepted
    rows = read_table(tmp_path / "lake", "trajectories")
    assert rows["uid"].to_pylist() == ["a", "b"]
    seqs = rows["seq"].to_pylist()
    assert seqs[1] > seqs[0] + 1                                # the failed call's seq was burnt
    assert len(segment_files(tmp_path / "lake", "trajectories")) == 2   # a fresh file after it


def test_writers_in_turn_never_share_a_segment_file(tmp_path):
    from schemas import LAKE_TABLES
    t = pa.table({"partition": ["p"], "step": [1], "batch_id": [None], "name": ["m"], "value": [1.0],
                  "seq": [0], "ts": pa.array([0], pa.int64()).cast(pa.timestamp("us", tz="UTC"))},
                 schema=LAKE_TABLES["metrics"])
    for _ in range(2):
        writer = LakeWriter(tmp_path)
        writer.append("metrics", t)
        writer.close()
    assert len(segment_files(tmp_path, "metrics")) == 2
