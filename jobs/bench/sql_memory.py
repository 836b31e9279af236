"""`replaylake dev bench sql-memory`: peak memory of SQL over a large lake, and compaction throughput.

    replaylake dev bench sql-memory --out bench/sql_memory --gb 3
    replaylake dev bench sql-memory --out bench/sql_memory --lake runs/exp1/lake   # an existing lake

Writes a lake of about ``--gb`` GB whose trajectories are mostly token payload (ids and log-probs
of ``--tokens`` tokens per response), over ``--sessions`` buffer sessions (each restart seals its
segments), with a batch sampled and released every few groups. Then, each in a fresh process
whose peak resident memory (VmHWM) is reported: a metadata query and a staleness aggregate,
first on the open segments, then after `compact` (timed: MB/s of Arrow data in). The figures go
to ``<out>/sql_memory.json``. ``--lake`` measures an existing lake instead of writing one (it is
compacted in place: compaction changes no answer). A benchmark, not a test: nothing here asserts
a time.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

QUERIES = {
    "metadata": "select count(*) from decisions where kind = 'select'",
    "staleness": "staleness_by_step",      # the named query (sql/analysis/), run as written
    "payload": "select sum(len(response_ids)) from trajectories",   # names the token payload
}

CHILD = """
import json, sys, time
from pipeline.analysis import connect
from sql import loader
sql = sys.argv[2] if " " in sys.argv[2] else loader.load(sys.argv[2]).text
t0 = time.perf_counter()
con = connect(sys.argv[1])
t1 = time.perf_counter()
rows = con.sql(sql).fetchall()
t2 = time.perf_counter()
# VmHWM, not ru_maxrss: a forked child's ru_maxrss starts at its parent's peak
hwm = [int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM")][0]
print(json.dumps({"rss_mb": hwm / 1024,
                  "connect_s": t1 - t0, "query_s": t2 - t1, "rows": len(rows)}))
"""


def _payload_table(uid: str, step: int, n: int, tokens: int):
    import numpy as np
    import pyarrow as pa

    ids = pa.ListArray.from_arrays(np.arange(0, (n + 1) * tokens, tokens, dtype=np.int32),
                                   pa.array(np.arange(n * tokens, dtype=np.int32) % 50000))
    probs = pa.ListArray.from_arrays(np.arange(0, (n + 1) * tokens, tokens, dtype=np.int32),
                                     pa.array(np.full(n * tokens, -0.5, dtype=np.float32)))
    # a pyarrow Table, not a dict of columns: ingest converts a dict's values through Python
    return pa.table({"partition": ["train"] * n, "uid": [uid] * n, "session_id": list(range(n)),
                     "min_global_steps": [max(step - 2, 0)] * n,
                     "max_global_steps": [max(step - 1, 0)] * n,
                     "reward": [float(i % 2) for i in range(n)], "prompt_ids": [[1, 2, 3]] * n,
                     "response_ids": ids, "rollout_log_probs": probs})


def write_lake(lake: Path, gb: float, tokens: int, sessions: int, n: int = 4) -> int:
    """A lake of about ``gb`` GB of payload; the number of groups written."""
    from pipeline import ReplayBuffer

    per_group = n * tokens * 8
    groups = max(int(gb * 1e9 / per_group), sessions)
    per_session = groups // sessions
    step, made = 1, 0
    for _ in range(sessions):
        with ReplayBuffer.sync(lake=lake) as buf:
            for _ in range(per_session):
                uid = f"g{made:07d}"
                buf.register(partition="train", uids=[uid], global_steps=step - 1, n=n)
                buf.update_status(partition="train", uids=[uid], status="running")
                buf.put(_payload_table(uid, step, n, tokens))
                buf.update_status(partition="train", uids=[uid], status="finished")
                made += 1
                if made % 4 == 0:
                    buf.release(buf.sample(step, "train", 4, timeout=30))
                    step += 1
    return made


def _measure(lake: Path, sql: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(lake), sql], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])   # after DuckDB's progress bar


def _size(lake: Path) -> int:
    return sum(p.stat().st_size for p in lake.rglob("*") if p.is_file())


def main(
    out: Annotated[Path, typer.Option(help="directory for the lake and sql_memory.json")],
    gb: Annotated[float, typer.Option(help="payload to write, in GB")] = 3.0,
    tokens: Annotated[int, typer.Option(help="tokens per response")] = 24000,
    sessions: Annotated[int, typer.Option(help="buffer sessions (restarts seal segments)")] = 8,
    lake: Annotated[Path | None, typer.Option(help="measure this existing lake instead of "
                                                   "writing one (compacted in place)")] = None,
) -> None:
    """Peak memory of a metadata query and a staleness aggregate on a large lake, live and
    compacted, and the compaction throughput.

    Examples:
        replaylake dev bench sql-memory --out runs/bench/sql_memory --gb 3
    """
    from pipeline.lake import compact, require_lake

    out.mkdir(parents=True, exist_ok=True)
    if lake is not None:
        require_lake(lake)
        res: dict = {"lake": str(lake), "lake_bytes_live": _size(lake)}
    else:
        lake = out / "lake"
        if lake.exists():
            raise typer.BadParameter(f"{lake} exists; give a fresh --out")
        t0 = time.perf_counter()
        groups = write_lake(lake, gb, tokens, sessions)
        res = {"groups": groups, "tokens": tokens, "sessions": sessions,
               "write_s": time.perf_counter() - t0, "lake_bytes_live": _size(lake)}
    res["segments_live"] = sum(1 for _ in lake.rglob("*.arrow"))
    typer.echo(f"lake: {res['lake_bytes_live'] / 1e9:.2f} GB, {res['segments_live']} streams")
    for name, sql in QUERIES.items():
        res[f"live_{name}"] = _measure(lake, sql)
        typer.echo(f"live      {name:>9}: {res[f'live_{name}']}")
    t0 = time.perf_counter()
    rep = compact(lake)
    took = time.perf_counter() - t0
    res["compact"] = {"segments": len(rep.compacted), "bytes_in": rep.bytes_in,
                      "bytes_out": rep.bytes_out, "seconds": took,
                      "mb_per_s": rep.bytes_in / 1e6 / took, "lake_bytes": _size(lake)}
    typer.echo(f"compact: {res['compact']}")
    for name, sql in QUERIES.items():
        res[f"compacted_{name}"] = _measure(lake, sql)
        typer.echo(f"compacted {name:>9}: {res[f'compacted_{name}']}")
    (out / "sql_memory.json").write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    from jobs.cli import run
    run(main)       # through the one handler of user errors
