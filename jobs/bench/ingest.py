"""Benchmark: ingest throughput (trajectories/s and MB/s), in memory and with the lake on disk.

Each `put` is a batch of 16 trajectories (4 groups x 4 sessions) with realistic payloads, as a
rollout worker sends them. Groups are registered before the timed loop; a second figure times the
whole lifecycle (register + put + finish) per batch. The lake is measured with and without fsync.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from jobs.bench.out import result_path

GROUPS_PER_PUT, PER_GROUP = 4, 4


def _batches(n_puts: int, prompt: tuple[int, int], response: tuple[int, int], seed: int):
    from jobs.synthetic import trajectories
    rng = np.random.default_rng(seed)
    out = []
    for b in range(n_puts):
        uids = [f"u{b}_{i}" for i in range(GROUPS_PER_PUT)]
        rewards = rng.integers(0, 2, size=GROUPS_PER_PUT * PER_GROUP).astype(np.float64)
        out.append((uids, trajectories("train", uids, PER_GROUP, version=0, rewards=rewards,
                                       prompt_len=prompt, response_len=response, rng=rng)))
    return out


def _run(batches, lake: Path | None, fsync: bool, lifecycle: bool) -> dict:
    from pipeline import ReplayBuffer
    buf = ReplayBuffer.sync(lake=lake, fsync=fsync)
    if not lifecycle:
        buf.register(partition="train", uids=[u for uids, _ in batches for u in uids],
                     global_steps=1)
    t = time.perf_counter()
    for uids, table in batches:
        if lifecycle:
            buf.register(partition="train", uids=uids, global_steps=1)
        buf.put(table)
        if lifecycle:
            buf.update_status(partition="train", uids=uids, status="finished")
    elapsed = time.perf_counter() - t
    buf.close()
    n = sum(t.num_rows for _, t in batches)
    mb = sum(t.nbytes for _, t in batches) / 1e6
    return {"trajectories_per_s": n / elapsed, "mb_per_s": mb / elapsed,
            "us_per_put": elapsed / len(batches) * 1e6}


def main(puts: int = typer.Option(2000, help="16-trajectory batches per configuration"),
         prompt: str = typer.Option("64:512", help="prompt length range, tokens"),
         response: str = typer.Option("128:1024", help="response length range, tokens"),
         out: Path = typer.Option(Path("runs/bench/ingest.json"),
                                  help="where to write results (a directory: ingest.json in it)"),
         seed: int = 0) -> None:
    """Ingest throughput in memory, with the lake, and with the lake + fsync.

    Examples:
        replaylake dev bench ingest
        replaylake dev bench ingest --puts 200 --out runs/bench/ingest_small.json
    """
    out = result_path(out, "ingest.json")
    from jobs.synthetic import length_range
    console = Console()
    p, r = length_range(prompt), length_range(response)
    batches = _batches(puts, p, r, seed)
    avg_kb = sum(t.nbytes for _, t in batches) / len(batches) / 1e3
    results = {}
    for name, use_lake, fsync, lifecycle in (
        ("memory, put only", False, False, False),
        ("memory, register+put+finish", False, False, True),
        ("lake, put only", True, False, False),
        ("lake, register+put+finish", True, False, True),
        ("lake + fsync, put only", True, True, False),
    ):
        tmp = Path(tempfile.mkdtemp(prefix="replaylake-bench-"))
        try:
            with console.status(f"{name} ..."):
                results[name] = _run(batches, tmp / "lake" if use_lake else None, fsync, lifecycle)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    table = Table(title=f"ingest: {puts} puts of {GROUPS_PER_PUT * PER_GROUP} trajectories "
                        f"({avg_kb:.0f} KB each)")
    for col in ("configuration", "trajectories/s", "MB/s", "µs per put"):
        table.add_column(col, justify="right")
    for name, res in results.items():
        table.add_row(name, f"{res['trajectories_per_s']:,.0f}", f"{res['mb_per_s']:,.1f}",
                      f"{res['us_per_put']:,.0f}")
    console.print(table)
    out.write_text(json.dumps({"puts": puts, "kb_per_put": avg_kb, "results": results}, indent=2))
    console.print(f"written to {out}")


if __name__ == "__main__":
    from jobs.cli import run
    run(main)       # through the one handler of user errors
