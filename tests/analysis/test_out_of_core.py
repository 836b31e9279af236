"""Out-of-core SQL: a query over the lake materialises only the columns it names (the token
payload stays on disk unless asked for), on open segments and on compacted Parquet alike, and
queries during a compaction give the same answers as before it."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pytest

from pipeline import ReplayBuffer
from pipeline.analysis.views import connect
from pipeline.lake import scan as lake_scan
from pipeline.lake.compaction import compact
from tests.support.lake import ROOT, python_env, write_script

TOKENS = 20_000          # per response: 80 KB of int32 ids, 80 KB of float32 logprobs
BIG_TOKENS = 200_000     # the memory test's: a 96 MB payload, far above a query's own overhead
GROUPS = 30


def payload_lake(lake: Path, tokens: int = TOKENS) -> int:
    """A lake whose trajectories are mostly token payload; the payload's size in bytes."""
    size = 0
    with ReplayBuffer.sync(lake=lake) as buf:
        for i in range(GROUPS):
            uid = f"g{i}"
            buf.register(partition="train", uids=[uid], global_steps=0, n=2)
            buf.update_status(partition="train", uids=[uid], status="running")
            rows = [{"partition": "train", "uid": uid, "session_id": s, "min_global_steps": 0,
                     "max_global_steps": 0, "reward": float(s), "prompt_ids": [1, 2, 3],
                     "response_ids": list(range(tokens)), "rollout_log_probs": [-0.5] * tokens}
                    for s in range(2)]
            size += 2 * tokens * 8
            buf.put(rows)
            buf.update_status(partition="train", uids=[uid], status="finished")
        for g in range(1, 4):
            buf.release(buf.sample(g, "train", 5, timeout=5))
    return size


# Peak resident memory (VmHWM), not the Arrow pool: open segments are scanned memory mapped,
# zero-copy, so what a query reads of them shows as the file's pages in the process, never as
# pool allocations. The peak is taken after connecting, so only the query's own growth counts.
PEAK = """
    import json, sys
    from pipeline.analysis.views import connect

    def peak() -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))

    con = connect(sys.argv[1])
    con.sql("select 1").fetchall()
    before = peak()
    rows = con.sql(sys.argv[2]).fetchall()
    print(json.dumps({"peak": peak() - before, "rows": rows}))
"""


def query_peak(tmp_path: Path, lake: Path, sql: str) -> tuple[int, list]:
    """(bytes the process's peak resident memory grew by while the query ran, its rows),
    measured in a fresh process so nothing earlier counts."""
    script = write_script(tmp_path, "peak.py", PEAK)
    out = subprocess.run([sys.executable, str(script), str(lake), sql], cwd=ROOT,
                         env=python_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    return got["peak"], got["rows"]


METADATA = "select count(*), sum(reward) from trajectories where session_id = 1"
PAYLOAD = "select sum(list_sum(response_ids)) from trajectories"    # reads every response id


@pytest.mark.parametrize("compacted", [False, True], ids=["open segments", "compacted"])
def test_a_metadata_query_does_not_materialise_the_token_payload(tmp_path, compacted):
    lake = tmp_path / "lake"
    payload = payload_lake(lake, BIG_TOKENS)
    if compacted:
        assert compact(lake).compacted
    meta_peak, meta_rows = query_peak(tmp_path, lake, METADATA)
    pay_peak, pay_rows = query_peak(tmp_path, lake, PAYLOAD)
    assert meta_rows == [[GROUPS, float(GROUPS)]]
    assert pay_rows == [[2 * GROUPS * BIG_TOKENS * (BIG_TOKENS - 1) // 2]]
    assert meta_peak < payload / 10              # the payload columns were never read
    # ... and reading the response ids (half the payload) is what naming them costs
    assert pay_peak > payload / 4


def test_queries_during_a_compaction_give_the_answers_they_gave_before(tmp_path):
    lake = tmp_path / "lake"
    payload_lake(lake)
    queries = ["select count(*), sum(seq) from trajectories",
               "select kind, count(*) from decisions group by kind order by kind",
               "select count(*) from trajectory_fates",
               "select * from batches order by batch_id"]
    want = [connect(lake).sql(q).fetchall() for q in queries]
    stop = threading.Event()
    answers: list[list] = []

    def ask() -> None:
        while not stop.is_set():
            con = connect(lake)
            answers.append([con.sql(q).fetchall() for q in queries])

    t = threading.Thread(target=ask)
    t.start()
    try:
        report = compact(lake)
    finally:
        stop.set()
        t.join(60)
    assert report.compacted
    answers.append([connect(lake).sql(q).fetchall() for q in queries])
    assert len(answers) >= 1
    assert all(a == want for a in answers)


# A query that stops before the end of its scan (a LIMIT, a reader dropped after one batch),
# many times over a scratch file of many record batches: over plain files pyarrow's IPC reader
# crashed the process here (segmentation fault, pyarrow 26.0.1), so the child must exit cleanly.
STOP_EARLY = """
    import sys
    from pipeline.lake import scan as lake_scan
    from pipeline.analysis.views import connect

    lake_scan.SCRATCH_BATCH_BYTES = 1    # keep the segment's 2,000 batches apart in the scratch file

    scan = lake_scan.scan_lake(sys.argv[1])
    events = scan.tables["group_events"]
    for _ in range(300):
        reader = events.scanner(columns=["uid"]).to_reader()
        reader.read_next_batch()
        del reader
    con = connect(sys.argv[1])
    got = {con.sql("select uid from group_events limit 1").fetchall()[0][0] for _ in range(300)}
    scan.close()
    print(len(got), con.sql("select count(*) from group_events").fetchall()[0][0])
"""


def test_queries_that_stop_early_do_not_crash_the_process(tmp_path):
    lake = tmp_path / "lake"
    with ReplayBuffer.sync(lake=lake) as buf:
        for i in range(2000):             # one call, one record batch of the open segment
            buf.register(partition="train", uids=[f"g{i}"], global_steps=0, n=2)
    script = write_script(tmp_path, "stop_early.py", STOP_EARLY)
    out = subprocess.run([sys.executable, str(script), str(lake)], cwd=ROOT, env=python_env(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    assert out.stdout.split() == ["1", "2000"]


@pytest.mark.parametrize("gather", [1, 3000, None], ids=["write by write", "some", "default"])
def test_scratch_files_gather_writes_into_few_batches_with_the_same_rows(tmp_path, monkeypatch,
                                                                         gather):
    lake = tmp_path / "lake"
    with ReplayBuffer.sync(lake=lake) as buf:
        for i in range(500):
            buf.register(partition="train", uids=[f"g{i:03d}"], global_steps=i % 7, n=2)
    if gather is not None:
        monkeypatch.setattr(lake_scan, "SCRATCH_BATCH_BYTES", gather)
    scan = lake_scan.scan_lake(lake)
    try:
        files = [f.buffer for f in scan.tables["group_events"].get_fragments()]
        batches = sum(pa.ipc.open_file(f).num_record_batches for f in files)
        got = scan.tables["group_events"].to_table(columns=["seq", "uid", "global_steps"])
    finally:
        scan.close()
    assert got.column("uid").to_pylist() == [f"g{i:03d}" for i in range(500)]
    assert got.column("global_steps").to_pylist() == [i % 7 for i in range(500)]
    assert got.column("seq").to_pylist() == sorted(got.column("seq").to_pylist())
    if gather == 1:
        assert batches == 500                    # one batch per write
    elif gather == 3000:
        assert len(files) < batches < 500        # a few writes per batch
    else:
        assert batches == len(files)             # the default 8 MiB: one batch per file here
