"""`replaylake dev bench load`: sustained load with everything at once, then every audit.

Eight producer threads register groups, put their trajectories and settle them (some fail, some
have no reward variance); one trainer thread samples and releases batches as fast as it can;
an analyst thread runs SQL over the lake; a compaction thread compacts the segments that a first
phase of the run left sealed, and those the second phase rolls (every second) while it writes.
Afterwards every audit must be empty (conservation included). Reports sustained trajectories/s
and p50/p99 `sample` latency.
"""
from __future__ import annotations

import json
import random
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer

from jobs.bench.out import result_path

PART, GROUP, BATCH = "train", 4, 16


@dataclass
class LoadResult:
    seconds: float
    trajectories: int
    groups: int
    batches: int
    sample_ms: list[float] = field(default_factory=list)
    queries: int = 0
    compactions: int = 0
    compacted_files: int = 0
    audits: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict:
        ms = sorted(self.sample_ms)
        pct = (lambda q: ms[min(len(ms) - 1, int(q * len(ms)))]) if ms else (lambda q: 0.0)
        return {"seconds": round(self.seconds, 2), "trajectories": self.trajectories,
                "trajectories_per_s": round(self.trajectories / self.seconds, 1),
                "groups": self.groups, "batches": self.batches,
                "sample_p50_ms": round(statistics.median(ms), 2) if ms else None,
                "sample_p99_ms": round(pct(0.99), 2), "queries": self.queries,
                "compactions": self.compactions, "compacted_files": self.compacted_files,
                "audit_rows": self.audits}


class _Run:
    """One phase: producers, a trainer, an analyst and (optionally) compaction, for ``seconds``."""

    def __init__(self, lake: Path, producers: int, seed: int, res: LoadResult, first_uid: int):
        from pipeline import ReplayBuffer
        self.lake, self.res, self.stop = lake, res, threading.Event()
        self.step, self.next_uid, self.lock = 1, first_uid, threading.Lock()
        self.buf = ReplayBuffer.async_(lake=lake, max_off_policy_threshold=3,
                                       filter_groups_metric="reward", refill_fn=lambda n: None,
                                       poll_interval=0.05)
        self.rngs = [random.Random(seed * 100 + i) for i in range(producers)]

    def _uids(self, k: int) -> list[str]:
        with self.lock:
            first, self.next_uid = self.next_uid, self.next_uid + k
            return [f"g{i:07d}" for i in range(first, first + k)]

    def produce(self, rng: random.Random) -> None:
        while not self.stop.is_set():
            uids, gs = self._uids(4), self.step
            self.buf.register(partition=PART, uids=uids, global_steps=gs)
            rows, failed = [], []
            for u in uids:
                if rng.random() < 0.05:
                    failed.append(u)
                    continue
                flat = rng.random() < 0.3
                for s in range(GROUP):
                    rows.append({"partition": PART, "uid": u, "session_id": s,
                                 "min_global_steps": max(gs - 2, 0), "max_global_steps": max(gs - 1, 0),
                                 "reward": 1.0 if flat else float(s % 2),
                                 "prompt_ids": [1] * 16, "response_ids": [2] * rng.randint(8, 64)})
            if rows:
                self.buf.put(rows)
            done = [u for u in uids if u not in failed]
            if done:
                self.buf.update_status(partition=PART, uids=done, status="finished")
            if failed:
                self.buf.update_status(partition=PART, uids=failed, status="failure")
            with self.lock:
                self.res.trajectories += len(rows)
                self.res.groups += len(uids)

    def train(self) -> None:
        from pipeline import SampleTimeout
        while not self.stop.is_set():
            t = time.perf_counter()
            try:
                batch = self.buf.sample(self.step, PART, BATCH, timeout=1.0)
            except SampleTimeout:
                continue
            self.res.sample_ms.append((time.perf_counter() - t) * 1e3)
            self.buf.release(batch)
            self.res.batches += 1
            with self.lock:
                self.step += 1

    def analyse(self) -> None:
        from pipeline.analysis import connect
        while not self.stop.is_set():
            connect(self.lake).sql("select kind, count(*) from decisions group by kind").fetchall()
            self.res.queries += 1
            self.stop.wait(0.5)

    def compact(self) -> None:
        from pipeline.lake import compact
        while not self.stop.is_set():
            self.res.compacted_files += len(compact(self.lake).compacted)
            self.res.compactions += 1
            self.stop.wait(1.0)

    def run(self, seconds: float, with_compaction: bool) -> None:
        workers = [threading.Thread(target=self.produce, args=(r,)) for r in self.rngs]
        workers += [threading.Thread(target=self.train), threading.Thread(target=self.analyse)]
        if with_compaction:
            self.buf.lake.roll_seconds = 1.0     # the running buffer's segments get compacted too
            workers.append(threading.Thread(target=self.compact))
        for w in workers:
            w.start()
        time.sleep(seconds)
        self.stop.set()
        for w in workers:
            w.join(60)
        self.buf.close()


def run_load(lake: Path, *, seconds: float = 20.0, producers: int = 8, seed: int = 0) -> LoadResult:
    """Two phases on one lake (the second compacts what the first sealed), then every audit."""
    from jobs.audit import run_audits
    res = LoadResult(seconds=0.0, trajectories=0, groups=0, batches=0)
    start = time.perf_counter()
    first = _Run(lake, producers, seed, res, 0)
    first.run(seconds / 2, with_compaction=False)
    second = _Run(lake, producers, seed + 1, res, first.next_uid)
    second.step = first.step
    second.run(seconds / 2, with_compaction=True)
    res.seconds = time.perf_counter() - start
    res.audits = {a.name: len(a.rows) for a in run_audits(lake)}
    return res


def main(
    lake: Annotated[Path, typer.Option("--lake", help="a new lake directory for the run")] = Path(
        "runs/bench/load-lake"),
    seconds: Annotated[float, typer.Option(help="total run time")] = 30.0,
    producers: Annotated[int, typer.Option(help="producer threads")] = 8,
    out: Annotated[Path, typer.Option(help="where to write the JSON (a directory: load.json in it)")]
        = Path("runs/bench/load.json"),
) -> None:
    """Sustained load: 8 producers, a trainer, SQL and compaction at once; then every audit.

    Examples:
        replaylake dev bench load --seconds 60
    """
    out = result_path(out, "load.json")
    if lake.exists() and any(lake.iterdir()):
        typer.echo(f"error: {lake} is not empty; name a new directory with --lake", err=True)
        raise typer.Exit(2)
    res = run_load(lake, seconds=seconds, producers=producers).summary()
    out.write_text(json.dumps(res, indent=2) + "\n")
    for k, v in res.items():
        typer.echo(f"{k:>20}: {v}")
    if any(res["audit_rows"].values()):
        typer.echo("error: an audit found violations", err=True)
        raise typer.Exit(1)


if __name__ == "__main__":
    from jobs.cli import run
    run(main)       # through the one handler of user errors
