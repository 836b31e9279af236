"""Benchmark: live memory (RSS growth) of a buffer holding N trajectories vs their Arrow payload bytes.

The buffer keeps each producer's record batch as it arrived (no copy), so the payload should cost
about its own Arrow size; what comes on top is the columns the buffer adds to each stored row (seq,
ts, n_response_tokens: 24 bytes), per-group bookkeeping (a compact Python object per group, its
candidate row once terminal) and allocator slack. The figure is RSS growth over the Arrow bytes
handed to `put` (goal: <= 1.2x at 1M trajectories). After every group is sampled and
released, the same process's RSS should come back down (Arrow's pool is asked to hand unused
memory back to the OS; what stays is reported, not hidden).

RSS is read from /proc/self/statm (Linux); the source tables are built one put at a time and
dropped after it, so the only live copy is the buffer's.
"""
from __future__ import annotations

import gc
import json
import os
import time
from pathlib import Path

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from jobs.bench.out import result_path

PER_GROUP = 4
GROUPS_PER_PUT = 256
STEP = 1          # the training step; rollouts carry the weights before it (version 0)


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; 0 where it is not available)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def _settle(trim: bool = False) -> int:
    """RSS after a full collection and after Arrow's pool returned what it no longer uses;
    ``trim`` also asks glibc to hand its free heap pages back (numpy-backed Arrow buffers, as
    the synthetic producer builds them, live in malloc's heap, not in Arrow's pool)."""
    import pyarrow as pa
    gc.collect()
    pa.default_memory_pool().release_unused()
    if trim:
        _malloc_trim()
    return rss_bytes()


def _malloc_trim() -> None:
    import ctypes
    import ctypes.util
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass   # not glibc: nothing to ask


def measure(n_traj: int, prompt: tuple[int, int], response: tuple[int, int], seed: int = 0) -> dict:
    """Fill a buffer with ``n_traj`` trajectories, then sample and release every group."""
    import pyarrow as pa

    from jobs.synthetic import trajectories
    from pipeline import ReplayBuffer
    rng = np.random.default_rng(seed)
    n_groups = max(1, n_traj // PER_GROUP)
    base = _settle(trim=True)
    pool_base = pa.total_allocated_bytes()
    buf = ReplayBuffer.sync()
    payload = 0
    t = time.perf_counter()
    for start in range(0, n_groups, GROUPS_PER_PUT):
        uids = [f"g{i}" for i in range(start, min(start + GROUPS_PER_PUT, n_groups))]
        buf.register(partition="train", uids=uids, global_steps=STEP, n=PER_GROUP)
        rewards = rng.integers(0, 2, size=len(uids) * PER_GROUP).astype(np.float64)
        table = trajectories("train", uids, PER_GROUP, version=STEP - 1, rewards=rewards,
                             prompt_len=prompt, response_len=response, rng=rng)
        payload += table.nbytes
        buf.put(table)
        del table
        buf.update_status(partition="train", uids=uids, status="finished")
    fill_s = time.perf_counter() - t
    full = _settle(trim=True)
    pool_full = pa.total_allocated_bytes()
    t = time.perf_counter()
    while buf.get_sampleable_count(STEP, "train"):
        size = min(4096, buf.get_sampleable_count(STEP, "train"))
        buf.release(buf.sample(global_steps=STEP, partition_id="train", batch_size=size))
    drain_s = time.perf_counter() - t
    after_release = _settle()
    after_trim = _settle(trim=True)
    pool_released = pa.total_allocated_bytes()
    buf.close()
    del buf
    after_close = _settle(trim=True)
    growth = full - base
    return {"trajectories": n_groups * PER_GROUP, "groups": n_groups,
            "payload_bytes": payload, "rss_growth_bytes": growth,
            "rss_over_payload": growth / payload if payload else float("nan"),
            "arrow_pool_growth_bytes": pool_full - pool_base,
            "rss_after_release_bytes": after_release - base,
            "arrow_pool_after_release_bytes": pool_released - pool_base,
            "rss_after_release_trimmed_bytes": after_trim - base,
            "released_fraction": 1 - (after_trim - base) / growth if growth > 0 else 1.0,
            "rss_after_close_bytes": after_close - base,
            "fill_s": round(fill_s, 2), "drain_s": round(drain_s, 2)}


def main(sizes: str = typer.Option("100000,1000000", help="buffered trajectories, comma-separated"),
         prompt: str = typer.Option("16:64", help="prompt length range, tokens"),
         response: str = typer.Option("32:256", help="response length range, tokens"),
         out: Path = typer.Option(Path("runs/bench/memory.json"),
                                  help="where to write results (a directory: memory.json in it)"),
         seed: int = 0) -> None:
    """Live RSS growth vs Arrow payload bytes, and what comes back after release.

    Examples:
        replaylake dev bench memory
        replaylake dev bench memory --sizes 100000
    """
    out = result_path(out, "memory.json")
    from jobs.synthetic import length_range
    console = Console()
    results = []
    for n in [int(s) for s in sizes.split(",")]:
        with console.status(f"{n:,} trajectories ..."):
            results.append(measure(n, length_range(prompt), length_range(response), seed))
    table = Table(title="live memory: RSS growth vs the Arrow payload put")
    for col in ("trajectories", "payload MB", "RSS growth MB", "RSS/payload",
                "left after release MB (trimmed)", "fill s"):
        table.add_column(col, justify="right", no_wrap=col == "trajectories")
    for r in results:
        table.add_row(f"{r['trajectories']:,}", f"{r['payload_bytes'] / 1e6:,.0f}",
                      f"{r['rss_growth_bytes'] / 1e6:,.0f}", f"{r['rss_over_payload']:.2f}x",
                      f"{r['rss_after_release_bytes'] / 1e6:,.0f} "
                      f"({r['rss_after_release_trimmed_bytes'] / 1e6:,.0f})", f"{r['fill_s']:.1f}")
    console.print(table)
    out.write_text(json.dumps({"prompt": prompt, "response": response, "results": results},
                              indent=2) + "\n")
    console.print(f"written to {out}")


if __name__ == "__main__":
    from jobs.cli import run
    run(main)       # through the one handler of user errors
