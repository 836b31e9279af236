"""The demo run (`make run`): simulated async rollout workers feed a lake-backed buffer, a trainer
samples with staleness eviction and DAPO filtering, then SQL over the lake explains what happened.

Reads top to bottom: config, the simulated rollout side (workers generate with whatever weight
version is current, sometimes across a weight update), the trainer loop, the SQL report.
"""
from __future__ import annotations

import queue
import random
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table


@dataclass(frozen=True)
class DemoConfig:
    lake: Path
    steps: int = 30
    batch_size: int = 8          # groups per training step
    sessions: int = 4            # responses per prompt
    threshold: int = 3           # max_off_policy_threshold (async, drop)
    workers: int = 3
    failure_rate: float = 0.05
    seed: int = 0


class Rollout:
    """Stands in for vLLM workers: a queue of prompts, threads that generate and report them."""

    def __init__(self, cfg: DemoConfig, buf):
        self.cfg, self.buf = cfg, buf
        self.version = 0                      # weights the workers currently serve
        self.work: queue.Queue = queue.Queue()
        self.stop = threading.Event()
        self.rng = random.Random(cfg.seed)
        self._n = 0
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._worker, daemon=True)
                        for _ in range(cfg.workers)]

    def dispatch(self, n: int, step: int) -> None:
        """Register n prompts at dispatch step `step` (so they count as in flight), queue them."""
        with self._lock:
            uids = [f"p{self._n + i:06d}" for i in range(n)]
            self._n += n
        self.buf.register(partition="train", uids=uids, global_steps=step, n=self.cfg.sessions)
        for u in uids:
            self.work.put((u, step))

    def _worker(self) -> None:
        while not self.stop.is_set():
            try:
                uid, step = self.work.get(timeout=0.1)
            except queue.Empty:
                continue
            self.buf.update_status(partition="train", uids=[uid], status="running")
            difficulty = self.rng.random()
            rows = []
            for s in range(self.cfg.sessions):
                time.sleep(self.rng.uniform(0.0, 0.004))
                lo = self.version
                time.sleep(self.rng.uniform(0.0, 0.002))   # a weight update may land mid-response
                hi = self.version
                skill = min(0.95, 0.1 + 0.03 * hi)
                n_resp = self.rng.randint(4, 24)
                rows.append({
                    "partition": "train", "uid": uid, "session_id": s,
                    "min_global_steps": lo, "max_global_steps": hi,
                    "reward": float(self.rng.random() < skill * (1.5 - difficulty)),
                    "prompt_ids": [self.rng.randint(3, 999) for _ in range(8)],
                    "response_ids": [self.rng.randint(3, 999) for _ in range(n_resp)],
                    "version_spans": [{"version": lo, "n_tokens": n_resp // 2},
                                      {"version": hi, "n_tokens": n_resp - n_resp // 2}]
                    if hi != lo else [{"version": lo, "n_tokens": n_resp}],
                })
            failed = self.rng.random() < self.cfg.failure_rate
            if failed:
                rows = rows[: self.rng.randint(0, 1)]
            if rows:
                self.buf.put(rows)
            self.buf.update_status(partition="train", uids=[uid],
                                   status="failure" if failed else "finished")


def main(lake: Path = typer.Option(Path("runs/demo/lake"), help="lake directory (recreated)"),
         steps: int = typer.Option(30, help="training steps"),
         batch_size: int = typer.Option(8, help="groups per step"),
         seed: int = 0) -> None:
    """Run a simulated async GRPO/DAPO loop on a fresh lake, then query the lake with SQL."""
    from pipeline import ReplayBuffer, StepAggregator
    from pipeline.analysis import connect
    from sql import loader

    cfg = DemoConfig(lake=lake, steps=steps, batch_size=batch_size, seed=seed)
    console = Console()
    shutil.rmtree(cfg.lake, ignore_errors=True)
    holder: dict = {}
    buf = ReplayBuffer.async_(
        lake=cfg.lake, max_off_policy_threshold=cfg.threshold, filter_groups_metric="reward",
        refill_fn=lambda n: holder["rollout"].dispatch(n, holder["step"]), poll_interval=0.05)
    rollout = holder["rollout"] = Rollout(cfg, buf)
    holder["step"] = 1
    rollout.dispatch(2 * cfg.batch_size, 1)          # generation runs ahead of training
    for t in rollout.threads:
        t.start()
    totals = StepAggregator()
    rows = []
    with Progress(TextColumn("[bold]training"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task("steps", total=cfg.steps, info="")
        for g in range(1, cfg.steps + 1):
            holder["step"] = g
            batch = buf.sample(g, "train", cfg.batch_size, timeout=120)
            totals.add(batch.eviction_metrics, batch.metric_weights, batch.filtered_reward_counts)
            m = batch.metrics
            rows.append((g, len(batch), m.get("training/off_policy/trajectory_staleness/mean", 0),
                         m.get("training/off_policy/evicted_samples", 0),
                         m.get("training/filter_groups/evicted_samples", 0)))
            buf.release(batch)                       # "trained": leaves memory, stays in the lake
            rollout.version = g                      # new weights after step g
            rollout.dispatch(cfg.batch_size, g + 1)
            bar.update(task, advance=1, info=f"staleness {rows[-1][2]:.2f}")
    rollout.stop.set()
    for t in rollout.threads:
        t.join()
    buf.close()

    table = Table(title="per step (last 10)")
    for c in ("step", "trajectories", "staleness mean", "stale evicted", "zero-variance evicted"):
        table.add_column(c, justify="right")
    for r in rows[-10:]:
        table.add_row(str(r[0]), str(r[1]), f"{r[2]:.2f}", str(r[3]), str(r[4]))
    console.print(table)
    con = connect(cfg.lake)
    for name in ("evictions_by_reason", "staleness_by_step"):
        res = loader.run(con, name)
        out = Table(title=f"sql/{name} ({res.num_rows} rows, first 6)")
        for c in res.column_names:
            out.add_column(c, justify="right")
        for row in res.slice(0, 6).to_pylist():
            out.add_row(*[f"{v:.2f}" if isinstance(v, float) else str(v) for v in row.values()])
        console.print(out)
    summary = con.sql("select kind, count(*) as n from decisions group by kind order by kind")
    console.print("[bold]decision log over the lake:[/]", dict(summary.fetchall()))
    console.print(f"totals over the run: {totals.result()}")
    console.print(f"lake written to {cfg.lake}; query it with: replaylake sql --lake {cfg.lake} "
                  "\"select * from groups limit 5\"")
