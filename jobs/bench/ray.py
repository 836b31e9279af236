"""Benchmark: the buffer behind a Ray actor vs in-process, and actor throughput as producers grow.

Three measurements from one run, on a local Ray cluster (``num_cpus=4``) or the one already
connected:

1. per-call latency of `put` (16 trajectories: 4 groups x 4 sessions, realistic payloads) in
   process and through the actor (client-side conform + Arrow IPC + object store + actor thread);
2. per-call latency of `sample` (batch of 64 groups, 256 trajectories) both ways, groups already
   finished so no call waits;
3. actor `sample` throughput while 1, 2, 4 and 8 producer processes (Ray actors, one process
   each) stream groups in (register, put, finish): batches/s and trajectories/s seen by the
   trainer from its first to its last batch, a fresh actor and lake per count; and the point
   where the single actor saturates: the smallest count that no larger count beats by 10 % or
   more in trajectories/s (`saturation`). On a machine with fewer cores than processes, the cores
   saturate too; the figure then says where this host stops, and the docs say so.

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
PRODUCERS = (1, 2, 4, 8)   # producer processes of the throughput sweep
MIN_GROWTH = 0.10          # more producers adding less than this share of throughput: saturated


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
        _ = batch.table        # in process without a lake it is made at first read; the client
        out.append(time.perf_counter() - t)    # receives it made
        buf.release(batch)
    return out


class Producer:
    """A remote rollout worker in a process of its own (the body of a Ray actor): 4 groups per
    round, registered, put (16 rows) and finished. Its tables are made before the clock starts
    and only get new uids per round, so what it costs while timed is the client's calls."""

    def __init__(self, producer: int, seed: int, distinct: int = 4) -> None:
        rng = np.random.default_rng(seed + producer)
        self.producer = producer
        self.tables = [_table([f"t{i}"] * GROUPS_PER_PUT, rng) for i in range(distinct)]

    def ready(self) -> int:
        import os
        return os.getpid()

    def run(self, client: Any, groups: int) -> int:
        import pyarrow as pa
        sent = 0
        for r in range(0, groups, GROUPS_PER_PUT):
            uids = [f"w{self.producer}_{r + i}" for i in range(GROUPS_PER_PUT)]
            table = self.tables[(r // GROUPS_PER_PUT) % len(self.tables)]
            table = table.set_column(table.schema.get_field_index("uid"), "uid",
                                     pa.array(np.repeat(uids, PER_GROUP).tolist()))
            client.register(partition="train", uids=uids, global_steps=1, n=PER_GROUP)
            client.update_status(partition="train", uids=uids, status="running")
            sent += client.put(table)
            client.update_status(partition="train", uids=uids, status="finished")
        return sent


def check_producers(counts: tuple[int, ...], batches: int) -> None:
    """Each count must split the run's groups into whole rounds of GROUPS_PER_PUT per producer."""
    from pipeline.errors import ConfigError
    total = batches * BATCH
    bad = [p for p in counts if p < 1 or total % (p * GROUPS_PER_PUT)]
    if not counts or bad or batches < 2:
        raise ConfigError(
            f"--producers {','.join(map(str, counts)) or '(none)'} with --batches {batches}: "
            f"need --batches >= 2 and producer counts >= 1 that divide the run's {total} groups "
            f"into rounds of {GROUPS_PER_PUT} per producer (e.g. 1,2,4,8); bad: {bad}")


def _throughput(ray: Any, client: Any, producers: int, batches: int, seed: int) -> dict:
    per = batches * BATCH // producers
    actor = ray.remote(num_cpus=0)(Producer)
    workers = [actor.remote(p, seed) for p in range(producers)]
    pids = ray.get([w.ready.remote() for w in workers])      # every process up and its data made
    refs = [w.run.remote(client, per) for w in workers]
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
    for w in workers:
        ray.kill(w)
    return {"producers": producers, "processes": len(set(pids)), "batches": batches,
            "seconds": elapsed, "batches_per_s": (batches - 1) / elapsed,
            "trajectories_per_s": (rows - first.table.num_rows) / elapsed}


def saturation(rows: list[dict], min_growth: float = MIN_GROWTH) -> dict:
    """Where the single actor saturates: the smallest producer count N (of those measured) that
    no larger count beats by ``min_growth`` (0.10: 10 %) or more in trajectories/s; ``producers``
    None when even the second-largest count is beaten so (not saturated within the counts
    measured). Comparing N with every larger count, not only the next, keeps one slow
    measurement (a dip at 2 on a busy host) from calling saturation while 8 still gains.
    ``growth``: each step's relative gain over the count before it, keyed by the count it reaches."""
    rows = sorted(rows, key=lambda r: r["producers"])
    tput = [r["trajectories_per_s"] for r in rows]
    growth = {r["producers"]: t / p - 1 for p, r, t in zip(tput, rows[1:], tput[1:])}
    at = next((r["producers"] for k, r in enumerate(rows[:-1])
               if max(tput[k + 1:]) - tput[k] < min_growth * tput[k]), None)
    peak = max(rows, key=lambda r: r["trajectories_per_s"])
    return {"producers": at, "min_growth": min_growth, "growth": growth,
            "peak_producers": peak["producers"],
            "peak_trajectories_per_s": peak["trajectories_per_s"]}


def _stats(seconds: list[float]) -> dict:
    ms = [s * 1e3 for s in seconds]
    return {"calls": len(ms), "median_ms": statistics.median(ms),
            "p90_ms": float(np.percentile(ms, 90)), "mean_ms": statistics.fmean(ms)}


def run(put_calls: int = 200, sample_calls: int = 20, batches: int = 40,
        producers: tuple[int, ...] = PRODUCERS, seed: int = 0) -> dict:
    """All the measurements; returns the result dict (also what the JSON holds)."""
    import ray

    from pipeline import ReplayBuffer
    from pipeline.adapters.ray import RayReplayBuffer

    producers = tuple(sorted(set(producers)))
    check_producers(producers, batches)
    t0 = time.perf_counter()
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
        sweep = []
        for p in producers:        # a fresh actor and lake per count: no count inherits a backlog
            client = RayReplayBuffer.start(lake=tmp / f"tput-{p}", name=f"bench-tput-{tmp.name}-{p}",
                                           **kw)
            try:
                sweep.append(_throughput(ray, client, p, batches, seed))
            finally:
                client.kill()
        res["ray_actor_throughput"] = sweep
        res["saturation"] = saturation(sweep)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if started:
            ray.shutdown()
    for op in ("put", "sample"):
        res[f"{op}_overhead_ms"] = (res["ray_actor"][op]["median_ms"]
                                    - res["in_process"][op]["median_ms"])
    res["seconds"] = time.perf_counter() - t0
    return res


def processes(n: int) -> str:
    """``n`` producer process(es), for the figures' names."""
    return f"{n} producer process{'' if n == 1 else 'es'}"


def saturation_line(sat: dict) -> str:
    """The saturation point in one sentence."""
    pct = f"{sat['min_growth']:.0%}"
    steps = ", ".join(f"to {p}: {g:+.0%}" for p, g in sat["growth"].items())
    if not sat["growth"]:           # one count measured: nothing to compare it with
        return (f"saturation not judged: one producer count measured "
                f"({sat['peak_trajectories_per_s']:,.0f} trajectories/s with "
                f"{processes(sat['peak_producers'])}); give --producers two counts or more")
    if sat["producers"] is None:
        return (f"the single actor did not saturate within the counts measured (a larger count "
                f"still added >= {pct}; {steps})")
    return (f"the single actor saturates at {processes(sat['producers'])}: no larger "
            f"count adds >= {pct} throughput ({steps}); peak "
            f"{sat['peak_trajectories_per_s']:,.0f} trajectories/s with {sat['peak_producers']}")


def main(put_calls: int = typer.Option(200, help="timed put calls per path"),
         sample_calls: int = typer.Option(20, help="timed sample calls per path"),
         batches: int = typer.Option(40, help="batches the trainer samples per producer count"),
         producers: str = typer.Option(",".join(map(str, PRODUCERS)),
                                       help="producer processes (Ray actors) of the throughput "
                                            "sweep, comma-separated"),
         out: Path = typer.Option(Path("runs/bench/ray.json"),
                                  help="where to write results (a directory: ray.json in it)"),
         seed: int = 0) -> None:
    """Ray actor vs in-process: per-call put/sample latency, and sample throughput by producer count.

    The sweep runs 1, 2, 4 and 8 producer processes (one Ray actor each, a fresh buffer actor
    and lake per count) and names the count where the single actor saturates: the first that no
    larger count beats by 10 % or more in trajectories/s. Starts a local Ray (num_cpus=4) unless one
    is connected; about 1-2 minutes at the default sizes.

    Examples:
        replaylake dev bench ray
        replaylake dev bench ray --put-calls 50 --sample-calls 5 --producers 1,2
    """
    counts = _counts(producers)
    out = result_path(out, "ray.json")
    console = Console()
    with console.status("benchmarking (starts a local Ray cluster) ..."):
        res = run(put_calls, sample_calls, batches, counts, seed)
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
    sweep = Table(title=f"actor sample throughput ({batches} batches of {BATCH} groups per count)")
    for col in ("producer processes", "batches/s", "trajectories/s", "x 1 producer"):
        sweep.add_column(col, justify="right")
    base = res["ray_actor_throughput"][0]["trajectories_per_s"]
    for t in res["ray_actor_throughput"]:
        sweep.add_row(str(t["producers"]), f"{t['batches_per_s']:.1f}",
                      f"{t['trajectories_per_s']:,.0f}", f"{t['trajectories_per_s'] / base:.2f}")
    console.print(sweep)
    console.print(saturation_line(res["saturation"]))
    console.print(f"wall time {res['seconds']:.0f} s")
    out.write_text(json.dumps(res, indent=2))
    console.print(f"written to {out}")


def _counts(text: str) -> tuple[int, ...]:
    from pipeline.errors import ConfigError
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"--producers {text!r}: give comma-separated whole numbers, "
                          "e.g. 1,2,4,8") from None


if __name__ == "__main__":
    from jobs.cli import run
    run(main)       # through the one handler of user errors
