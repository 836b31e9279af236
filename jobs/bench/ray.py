"""Benchmark: the buffer behind a Ray actor vs in-process, and actor throughput under 4 producers.

Three figures from one run, on a local Ray cluster (``num_cpus=4``):

1. per-call latency of `put` (16 trajectories: 4 groups x 4 sessions, realistic payloads) in
   process and through the actor (client-side conform + Arrow IPC + object store + actor thread);
2. per-call latency of `sample` (batch of 64 groups, 256 trajectories) both ways, groups already
   finished so no call waits;
3. actor `sample` throughput while 4 remote producer tasks stream groups in (register, put,
   finish): batches/s and trajectories/s seen by the trainer from its first to its last batch.

Both paths keep a lake on disk (a temporary directory), as a real run would.
"""
from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from jobs.bench.out import result_path

PER_GROUP, GROUPS_PER_PUT, BATCH = 4, 4, 64
PROMPT, RESPONSE = (64, 512), (128, 1024)


def _table(uids: list[str], rng: np.random.Generator):
    from jobs.synthetic import trajectories
    rewards = rng.integers(0, 2, size=len(uids) * PER_GROUP).astype(np.float64)
    return trajectories("train", uids, PER_GROUP, version=0, rewards=rewards,
                        prompt_len=PROMPT, response_len=RESPONSE, rng=rng)


def _settle(buf: Any, uids: list[str]) -> None:
    buf.update_status(partition="train", uids=uids, status="running")
    buf.update_status(partition="train", uids=uids, status="finished")


def _put_latency(buf: Any, calls: int, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    batches = [[f"put{c}_{i}" for i in range(GROUPS_PER_PUT)] for c in range(calls)]
    tables = [_table(uids, rng) for uids in batches]
    buf.register(partition="train", uids=[u for b in batches for u in b], global_steps=1)
    out = []
    for table in tables:
        t = time.perf_counter()
        buf.put(table)
        out.append(time.perf_counter() - t)
    _settle(buf, [u for b in batches for u in b])
    return out


def _sample_latency(buf: Any, calls: int, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    for c in range(calls):
        uids = [f"s{c}_{i}" for i in range(BATCH)]
        buf.register(partition="train", uids=uids, global_steps=1)
        buf.put(_table(uids, rng))
        _settle(buf, uids)
    out = []
    for _ in range(calls):
        t = time.perf_counter()
        batch = buf.sample(1, "train", BATCH)
        out.append(time.perf_counter() - t)
        buf.release(batch)
    return out


def produce(client: Any, producer: int, groups: int, seed: int) -> int:
    """A remote rollout worker: 4 groups per round, registered, put (16 rows), finished."""
    rng = np.random.default_rng(seed + producer)
    sent = 0
    for r in range(0, groups, GROUPS_PER_PUT):
        uids = [f"w{producer}_{r + i}" for i in range(GROUPS_PER_PUT)]
        client.register(partition="train", uids=uids, global_steps=1, n=PER_GROUP)
        client.update_status(partition="train", uids=uids, status="running")
        sent += client.put(_table(uids, rng))
        client.update_status(partition="train", uids=uids, status="finished")
    return sent


def _throughput(ray: Any, client: Any, producers: int, batches: int, seed: int) -> dict:
    per = batches * BATCH // producers
    task = ray.remote(num_cpus=1)(produce)
    refs = [task.remote(client, p, per, seed) for p in range(producers)]
    first = client.sample(1, "train", BATCH, timeout=600)
    t = time.perf_counter()
    rows = first.table.num_rows
    client.release(first)
    for _ in range(batches - 1):
        b = client.sample(1, "train", BATCH, timeout=600)
        rows += b.table.num_rows
        client.release(b)
    elapsed = time.perf_counter() - t
    ray.get(refs)
    return {"producers": producers, "batches": batches, "seconds": elapsed,
            "batches_per_s": (batches - 1) / elapsed,
            "trajectories_per_s": (rows - first.table.num_rows) / elapsed}


def _stats(seconds: list[float]) -> dict:
    ms = [s * 1e3 for s in seconds]
    return {"calls": len(ms), "median_ms": statistics.median(ms),
            "p90_ms": float(np.percentile(ms, 90)), "mean_ms": statistics.fmean(ms)}


def run(put_calls: int = 200, sample_calls: int = 20, batches: int = 40, producers: int = 4,
        seed: int = 0) -> dict:
    """All three measurements; returns the result dict (also what the JSON holds)."""
    import ray

    from pipeline import ReplayBuffer
    from pipeline.adapters.ray import RayReplayBuffer

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    tmp = Path(tempfile.mkdtemp(prefix="replaylake-bench-ray-"))
    res: dict[str, Any] = {"put_trajectories": GROUPS_PER_PUT * PER_GROUP, "batch_groups": BATCH,
                           "trajectories_per_group": PER_GROUP}
    try:
        kw = {"max_off_policy_threshold": None, "poll_interval": 0.05}
        for name, make in (
            ("in_process", lambda d: ReplayBuffer.async_(lake=d, **kw)),
            ("ray_actor", lambda d: RayReplayBuffer.start(lake=d, name=f"bench-{d.name}", **kw)),
        ):
            buf = make(tmp / f"{name}-lat")
            res[name] = {"put": _stats(_put_latency(buf, put_calls, seed)),
                         "sample": _stats(_sample_latency(buf, sample_calls, seed))}
            buf.kill() if name == "ray_actor" else buf.close()
        client = RayReplayBuffer.start(lake=tmp / "tput", name="bench-tput", **kw)
        res["ray_actor_throughput"] = _throughput(ray, client, producers, batches, seed)
        client.kill()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if started:
            ray.shutdown()
    for op in ("put", "sample"):
        res[f"{op}_overhead_ms"] = (res["ray_actor"][op]["median_ms"]
                                    - res["in_process"][op]["median_ms"])
    return res


def main(put_calls: int = typer.Option(200, help="timed put calls per path"),
         sample_calls: int = typer.Option(20, help="timed sample calls per path"),
         batches: int = typer.Option(40, help="batches the trainer samples in the throughput run"),
         producers: int = typer.Option(4, help="remote producer tasks in the throughput run"),
         out: Path = typer.Option(Path("runs/bench/ray.json"),
                                  help="where to write results (a directory: ray.json in it)"),
         seed: int = 0) -> None:
    """Ray actor vs in-process: per-call put/sample latency, and sample throughput.

    Examples:
        replaylake dev bench ray
        replaylake dev bench ray --put-calls 50 --sample-calls 5
    """
    out = result_path(out, "ray.json")
    console = Console()
    with console.status("benchmarking (starts a local Ray cluster) ..."):
        res = run(put_calls, sample_calls, batches, producers, seed)
    table = Table(title=f"Ray actor vs in-process (put: {res['put_trajectories']} trajectories, "
                        f"sample: {BATCH} groups x {PER_GROUP})")
    for col in ("call", "in-process median ms", "actor median ms", "overhead ms",
                "actor p90 ms"):
        table.add_column(col, justify="right")
    for op in ("put", "sample"):
        a, b = res["in_process"][op], res["ray_actor"][op]
        table.add_row(op, f"{a['median_ms']:.2f}", f"{b['median_ms']:.2f}",
                      f"{res[f'{op}_overhead_ms']:+.2f}", f"{b['p90_ms']:.2f}")
    console.print(table)
    t = res["ray_actor_throughput"]
    console.print(f"actor sample throughput with {t['producers']} remote producers: "
                  f"{t['batches_per_s']:.1f} batches/s, {t['trajectories_per_s']:,.0f} "
                  f"trajectories/s ({t['batches']} batches of {BATCH} groups)")
    out.write_text(json.dumps(res, indent=2))
    console.print(f"written to {out}")


if __name__ == "__main__":
    from jobs.cli import run
    run(main)       # through the one handler of user errors
