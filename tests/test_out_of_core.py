"""Out-of-core SQL: a query over the lake materialises only the columns it names (the token
payload stays on disk unless asked for), on live segments and on compacted Parquet alike, and
queries during a compaction give the same answers as before it."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pipeline import ReplayBuffer
from pipeline.analysis import connect
from pipeline.compact import compact
from tests.support.lake import ROOT, python_env, write_script

TOKENS = 20_000          # per response: 80 KB of int32 ids, 80 KB of float32 logprobs
GROUPS = 30


def payload_lake(lake: Path) -> int:
    """A lake whose trajectories are mostly token payload; the payload's size in bytes."""
    size = 0
    with ReplayBuffer.sync(lake=lake) as buf:
        for i in range(GROUPS):
            uid = f"g{i}"
            buf.register(partition="train", uids=[uid], global_steps=0, n=2)
            buf.update_status(partition="train", uids=[uid], status="running")
            rows = [{"partition": "train", "uid": uid, "session_id": s, "min_global_steps": 0,
                     "max_global_steps": 0, "reward": float(s), "prompt_ids": [1, 2, 3],
                     "response_ids": list(range(TOKENS)), "rollout_log_probs": [0.5] * TOKENS}
                    for s in range(2)]
            size += 2 * TOKENS * 8
            buf.put(rows)
            buf.update_status(partition="train", uids=[uid], status="finished")
        for g in range(1, 4):
            buf.release(buf.sample(g, "train", 5, timeout=5))
    return size


PEAK = """
    import json, sys
    import pyarrow as pa
    from pipeline.analysis import connect

    con = connect(sys.argv[1])
    pool = pa.default_memory_pool()
    before = pool.max_memory()
    rows = con.sql(sys.argv[2]).fetchall()
    print(json.dumps({"peak": pool.max_memory() - before, "rows": rows}))
"""


def query_peak(tmp_path: Path, lake: Path, sql: str) -> tuple[int, list]:
    """(bytes the Arrow memory pool's peak grew by while the query ran, its rows), measured
    in a fresh process so nothing earlier counts."""
    script = write_script(tmp_path, "peak.py", PEAK)
    out = subprocess.run([sys.executable, str(script), str(lake), sql], cwd=ROOT,
                         env=python_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    return got["peak"], got["rows"]


METADATA = "select count(*), sum(reward) from trajectories where session_id = 1"
PAYLOAD = "select sum(len(response_ids)) from trajectories"


@pytest.mark.parametrize("compacted", [False, True], ids=["live segments", "compacted"])
def test_a_metadata_query_does_not_materialise_the_token_payload(tmp_path, compacted):
    lake = tmp_path / "lake"
    payload = payload_lake(lake)
    if compacted:
        assert compact(lake).compacted
    meta_peak, meta_rows = query_peak(tmp_path, lake, METADATA)
    pay_peak, pay_rows = query_peak(tmp_path, lake, PAYLOAD)
    assert meta_rows == [[GROUPS, float(GROUPS)]]
    assert pay_rows == [[2 * GROUPS * TOKENS]]
    assert meta_peak < payload / 50              # the payload column was never read
    assert pay_peak > meta_peak * 10             # ... and it is what naming it costs


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
