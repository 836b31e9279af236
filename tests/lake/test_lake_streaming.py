"""Reading a open segment holds one write in memory at a time, never the whole segment: a
metadata query's memory must not grow with the lake. Damage is still found, at the same offset."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipeline.lake.damage import check
from pipeline.lake.files import sum_path
from pipeline.lake.read import LakeDamageError
from pipeline.lake.verify import batches, verify
from pipeline.lake.writer import LakeWriter, segment_files
from schemas import LAKE_TABLES
from tests.support.lake_damage import flip_bytes, write_ends

ROOT = Path(__file__).resolve().parents[2]
WRITES = 40
TOKENS = 250_000          # 1 MB of int32 token ids per write: a 40 MB segment


def payload_rows(first_seq: int) -> pa.Table:
    schema = LAKE_TABLES["trajectories"]
    ids = pa.array([np.arange(TOKENS, dtype=np.int32)], pa.list_(pa.int32()))
    cols = {f.name: pa.nulls(1, f.type) for f in schema}
    cols.update({"partition": pa.array(["train"]), "uid": pa.array([f"g{first_seq}"]),
                 "session_id": pa.array([0]), "min_global_steps": pa.array([0]),
                 "max_global_steps": pa.array([0]), "reward": pa.array([1.0]),
                 "prompt_ids": pa.array([[1, 2]], pa.list_(pa.int32())), "response_ids": ids,
                 "seq": pa.array([first_seq])})
    return pa.table({f.name: cols[f.name].cast(f.type) for f in schema}, schema=schema)


@pytest.fixture(scope="module")
def big_segment(tmp_path_factory):
    lake = tmp_path_factory.mktemp("big") / "lake"
    writer = LakeWriter(lake)
    for i in range(WRITES):
        writer.append("trajectories", payload_rows(i))
    writer.close()
    [seg] = segment_files(lake, "trajectories")
    return lake, seg


# The measurement runs in a fresh interpreter: tracemalloc counts every thread's allocations,
# and a test process that ran other tests first may still have threads of theirs allocating
# (seen once under xdist as a peak twice the segment's size).
_MEASURE = """
import json, sys, tracemalloc
from pathlib import Path
import pyarrow as pa
from pipeline.lake.verify import batches, verify
seg = Path(sys.argv[2])
seen = []
tracemalloc.start()
if sys.argv[1] == "verify":
    verify(seg)
else:
    for batch, _ in batches(seg):
        seen.append(batch.column("seq")[0].as_py())   # keep only a scalar of each batch
peak = tracemalloc.get_traced_memory()[1]
tracemalloc.stop()
print(json.dumps({"peak": peak, "seen": seen, "arrow_now": pa.total_allocated_bytes()}))
"""


def measured(what: str, seg: Path) -> dict:
    """Peak Python-allocated bytes (file reads included) of ``verify`` or of iterating
    ``batches`` over ``seg``, in a child process that does nothing else."""
    out = subprocess.run([sys.executable, "-c", _MEASURE, what, str(seg)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_verifying_a_segment_holds_one_write_not_the_whole_segment(big_segment):
    _, seg = big_segment
    size = seg.stat().st_size
    assert size > 35e6
    peak = measured("verify", seg)["peak"]
    assert peak < size / 8, f"verify held {peak} bytes of a {size}-byte segment"


def test_reading_a_segments_batches_holds_one_write_at_a_time(big_segment):
    _, seg = big_segment
    size = seg.stat().st_size
    got = measured("batches", seg)
    assert got["seen"] == list(range(WRITES))
    assert got["peak"] < size / 8, f"reading held {got['peak']} bytes of a {size}-byte segment"
    assert got["arrow_now"] < size / 8


def test_damage_in_the_middle_of_a_streamed_segment_names_the_write_that_holds_it(tmp_path):
    lake = tmp_path / "lake"
    writer = LakeWriter(lake)
    for i in range(6):
        writer.append("trajectories", payload_rows(i).slice(0, 1))
    writer.close()
    [seg] = segment_files(lake, "trajectories")
    ends = write_ends(seg)
    flip_bytes(seg, ends[2] + 1000, 8)
    with pytest.raises(LakeDamageError) as err:
        list(batches(seg))
    assert (err.value.path, err.value.offset) == (seg, ends[2])
    [finding] = check(lake).damaged
    assert (finding.path, finding.offset) == (seg, ends[2])


def test_verify_reports_the_acknowledged_size_and_a_torn_tail(tmp_path):
    lake = tmp_path / "lake"
    writer = LakeWriter(lake)
    try:
        writer.append("trajectories", payload_rows(0).slice(0, 1))
        [seg] = segment_files(lake, "trajectories")
        size = seg.stat().st_size
        with open(seg, "ab") as f:
            f.write(b"\1" * 100)          # a write that never got its checksum record
        v = verify(seg)
        assert (v.size, v.torn, v.ends[-1], v.closed) == (size, 100, size, False)
    finally:
        writer.close()


def test_a_checksum_file_without_its_stream_and_without_records_is_an_empty_stream(tmp_path):
    # a crash between creating the checksum file and the stream leaves exactly this
    path = tmp_path / "trajectories-000000000000-abc0001.arrow"
    sum_path(path).write_bytes(b"")
    v = verify(path)
    assert (v.size, v.ends, v.torn, v.closed) == (0, [], 0, False)
    assert list(batches(path)) == []
