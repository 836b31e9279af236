"""`replaylake dev bench all`: every benchmark in one process, each figure beside its reference.

One run measures ingest (small puts in memory and on the lake, the register+put+finish lifecycle,
large puts against `dd` to the same directory), `to_torch` against memcpy, the decision path
against the naive reference buffer, the verl adapter against verl 0.9.1 through TransferQueue
(each on one of its own), live memory against the Arrow payload, and put / sample through the Ray actor
against the in-process buffer, with the actor's sample throughput per count of producer processes
and where it saturates (jobs/bench/ray.py). References are measured in the same run, so a busy
machine slows both sides alike. Results go to one JSON file and one markdown table
(jobs/bench/table.py renders it; `replaylake dev bench table` regenerates the docs' table from a JSON).

``--quick`` shrinks every size to a smoke test (seconds): the figures then only show that every
path runs, not how fast it is.
"""
from __future__ import annotations

import json
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import typer
from rich.console import Console

from jobs.bench.out import figure, result_path
from pipeline.errors import ConfigError


@dataclass(frozen=True)
class Sizes:
    """How big each benchmark runs (full figures vs the CI smoke test)."""

    small_puts: int
    large_puts: int
    large_rows: int
    large_tokens: int
    large_rounds: int
    torch_batches: tuple[int, ...]
    torch_prompt: tuple[int, int]
    torch_response: tuple[int, int]
    torch_repeats: int
    decide_sizes: tuple[int, ...]
    decide_repeats: int
    verl_sizes: tuple[int, ...]
    verl_batch: int
    verl_repeats: int
    memory_sizes: tuple[int, ...]
    verl_step_s: float      # the trainer step between calls of the background-mirror phase
    verl_lag_s: float       # that phase's mirror_max_lag
    ray_put_calls: int = 200
    ray_sample_calls: int = 20
    ray_batches: int = 40   # batches the trainer samples per producer count
    ray_producers: tuple[int, ...] = (1, 2, 4, 8)


FULL = Sizes(2000, 8, 256, 16384, 3, (256, 1024), (128, 1024), (1024, 4096), 7,
             (10_000, 100_000, 1_000_000), 15, (100, 10_000), 64, 15, (100_000, 1_000_000),
             1.0, 1.0)
QUICK = Sizes(40, 2, 16, 1024, 1, (16,), (4, 32), (8, 64), 2, (2_000,), 3, (40,), 8, 1, (2_000,),
              0.2, 0.2, ray_put_calls=5, ray_sample_calls=2, ray_batches=2, ray_producers=(1, 2))



def _memcpy_mb_s(nbytes: int, repeats: int = 5) -> float:
    src = np.ones(nbytes, np.uint8)
    best = min(_timed(src.copy) for _ in range(repeats))
    return nbytes / best / 1e6


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def dd_mb_s(directory: Path, nbytes: int) -> float:
    """Write throughput of `dd` (1 MiB blocks from /dev/zero, no sync) into ``directory``."""
    target = directory / "dd.bin"
    count = max(1, nbytes // (1 << 20))
    t = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={count}"],
                   check=True, capture_output=True)
    elapsed = time.perf_counter() - t
    target.unlink()
    return count * (1 << 20) / elapsed / 1e6


def ingest(s: Sizes, work: Path) -> list[dict[str, Any]]:
    from jobs.bench.ingest import _batches, _run
    batches = _batches(s.small_puts, (64, 512), (128, 1024), 0)
    per_put = sum(t.nbytes for _, t in batches) // len(batches)
    memcpy = _memcpy_mb_s(per_put * len(batches))
    out = []
    for name, lake, life, goal in (("put of 16 trajectories, in memory", False, False, 50_000),
                                   ("put of 16 trajectories, lake (no fsync)", True, False, 30_000),
                                   ("register + put + finish, in memory", False, True, 20_000)):
        d = Path(tempfile.mkdtemp(dir=work))
        _run(batches[: max(1, len(batches) // 10)], d / "warm" if lake else None, False, life)
        r = _run(batches, d / "lake" if lake else None, False, life)
        out.append(figure(name, r["trajectories_per_s"], "trajectories/s", "memcpy MB/s", memcpy,
                          r["mb_per_s"] / memcpy, "of memcpy's MB/s",
                          f">= {goal:,} trajectories/s", r["trajectories_per_s"] >= goal))
        shutil.rmtree(d, ignore_errors=True)
    out.append(_large_puts(s, work))
    return out


def _large_puts(s: Sizes, work: Path) -> dict[str, Any]:
    """Large puts on the lake against `dd` of as many bytes into the same directory.

    `large_rounds` rounds time the puts (each into a new lake) and `dd` in turns, each deleting
    what it wrote, and the figure is the median of each side; every round's figures are kept, the
    first (the process's first large writes) included."""
    from jobs.synthetic import trajectories
    rng = np.random.default_rng(1)
    per = 4
    tables = []
    for b in range(s.large_puts):
        uids = [f"L{b}_{i}" for i in range(s.large_rows // per)]
        tables.append((uids, trajectories("train", uids, per, version=0,
                                          rewards=rng.integers(0, 2, len(uids) * per) * 1.0,
                                          prompt_len=(256, 256),
                                          response_len=(s.large_tokens, s.large_tokens),
                                          rng=rng)))
    nbytes = sum(t.nbytes for _, t in tables)
    ours, dds = [], []
    for r in range(s.large_rounds):
        for side in (("dd", "ours") if r % 2 else ("ours", "dd")):
            d = Path(tempfile.mkdtemp(dir=work))
            if side == "dd":
                dds.append(dd_mb_s(d, nbytes))
            else:
                ours.append(nbytes / _put_all(tables, d / "lake") / 1e6)
            shutil.rmtree(d, ignore_errors=True)
    mb_s, dd = statistics.median(ours), statistics.median(dds)
    fig = figure(f"large puts ({s.large_rows} trajectories x {s.large_tokens} tokens, "
                 "log-probs), lake", mb_s, "MB/s", "dd MB/s", dd, mb_s / dd, "over dd",
                 ">= 400 MB/s", mb_s >= 400)
    fig.update(rounds_mb_s=ours, rounds_dd_mb_s=dds)
    return fig


def _put_all(tables: list, lake: Path) -> float:
    """Seconds to put every table into a new lake (registration untimed)."""
    from pipeline import ReplayBuffer
    buf = ReplayBuffer.sync(lake=lake)
    buf.register(partition="train", uids=[u for uids, _ in tables for u in uids], global_steps=1)
    t = time.perf_counter()
    for _, table in tables:
        buf.put(table)
    elapsed = time.perf_counter() - t
    buf.close()
    return elapsed


def torch_figures(s: Sizes) -> list[dict[str, Any]]:
    from jobs.bench.to_torch import measure, synthetic_batch
    goals = {"packed": 1.5, "padded": 1.3}
    out = []
    for b in s.torch_batches:
        table = synthetic_batch(b, s.torch_prompt, s.torch_response)
        for layout in ("padded", "packed"):
            r = measure(table, layout, s.torch_repeats)
            goal = goals[layout] if (layout == "packed" or b == 1024) else None
            out.append(figure(f"to_torch {layout}, B={b}", r["ours_ms"], "ms",
                              "memcpy of the data + memset of the padding, ms",
                              r["memcpy_ms"], r["ours_over_memcpy"], "x memcpy",
                              f"<= {goal}x memcpy" if goal else "",
                              r["ours_over_memcpy"] <= goal if goal else None))
            ratio = r["pooled_over_memcpy_warm"]
            out.append(figure(f"to_torch {layout}, B={b}, pooled", r["pooled_ms"], "ms",
                              "warm memcpy + memset ms", r["memcpy_warm_ms"], ratio, "x warm memcpy",
                              f"<= {goal}x warm memcpy" if goal else "",
                              ratio <= goal if goal else None))
    return out


SAMPLE_GOAL_MS = 2.0     # a whole `sample` (batch 64) at 10k buffered trajectories, oldest first


def decide_figures(s: Sizes) -> list[dict[str, Any]]:
    from jobs.bench.decide import run_size
    rng = np.random.default_rng(0)
    out, at_10k = [], {}
    for n in s.decide_sizes:
        r = run_size(n, s.decide_repeats, rng)
        # "after a count": get_sampleable_count ran first; "alone": sample pays the new groups'
        # aggregates itself. Goals: <= 2 ms at 10k (the whole poll fused into a few evaluations;
        # 5 ms was the first goal, and still is with a staleness policy or order on), <= 1.3x
        # the 10k time at 1M.
        for how, key, speed in (("after a count", "ours_sample_ms", "speedup_sample"),
                                ("alone", "ours_sample_alone_ms", "speedup_sample_alone")):
            ms = r[key]
            goal, meets = "", None
            if n == 10_000:
                at_10k[key] = ms
                goal, meets = f"<= {SAMPLE_GOAL_MS:g} ms", ms <= SAMPLE_GOAL_MS
            elif n == 1_000_000 and key in at_10k:
                goal = f"<= 1.3x its 10k time ({1.3 * at_10k[key]:.2f} ms)"
                meets = ms <= 1.3 * at_10k[key]
            out.append(figure(f"sample {how}, {n:,} buffered trajectories", ms, "ms",
                              "naive reference buffer ms", r["reference_ms"], r[speed],
                              "x the naive reference's speed", goal, meets))
        if n == 10_000:   # a declared order keeps its own heap: the same goal holds with it on
            d = run_size(n, s.decide_repeats, rng, order="spread_first")
            ms = d["ours_sample_alone_ms"]
            out.append(figure(f"sample alone, selection_order spread_first, {n:,} buffered "
                              "trajectories", ms, "ms", "naive reference buffer ms",
                              d["reference_ms"], d["speedup_sample_alone"],
                              "x the naive reference's speed", "<= 5 ms", ms <= 5.0))
    return out


def verl_figures(s: Sizes) -> list[dict[str, Any]]:
    from jobs.bench.verl import figures
    return figures(s.verl_sizes, s.verl_batch, s.verl_repeats, s.verl_step_s, s.verl_lag_s)


def memory_figures(s: Sizes) -> list[dict[str, Any]]:
    from jobs.bench.memory import measure
    out = []
    for n in s.memory_sizes:
        r = measure(n, (16, 64), (32, 256))
        mb = r["payload_bytes"] / 1e6
        out.append(figure(f"live memory, {n:,} trajectories", r["rss_growth_bytes"] / 1e6,
                          "MB RSS growth", "Arrow payload MB", mb, r["rss_over_payload"],
                          "x payload", "<= 1.2x payload", r["rss_over_payload"] <= 1.2))
        out.append(figure(f"after release, {n:,} trajectories",
                          r["rss_after_release_trimmed_bytes"] / 1e6, "MB RSS left",
                          "RSS growth MB", r["rss_growth_bytes"] / 1e6,
                          1 - r["released_fraction"], "of the growth left", "", None))
    return out


def ray_figures(s: Sizes) -> list[dict[str, Any]]:
    """Put and sample through the Ray actor against the in-process buffer (same run), sample
    throughput per count of producer processes against one producer's, and the saturation point
    (its ratio: the most any larger count adds over it, 0 when it is the largest measured)."""
    from jobs.bench.ray import BATCH, processes, run
    r = run(s.ray_put_calls, s.ray_sample_calls, s.ray_batches, s.ray_producers)
    out = []
    for op, what in (("put", f"put of {r['put_trajectories']} trajectories"),
                     ("sample", f"sample of {BATCH} groups")):
        ours, ref = r["ray_actor"][op]["median_ms"], r["in_process"][op]["median_ms"]
        out.append(figure(f"{what} through the Ray actor (median)", ours, "ms",
                          "in-process buffer ms", ref, ours / ref, "x in-process", "", None))
    sweep = r["ray_actor_throughput"]
    one = sweep[0]["trajectories_per_s"]
    for t in sweep:
        out.append(figure(f"actor sample throughput, {processes(t['producers'])}",
                          t["trajectories_per_s"], "trajectories/s",
                          f"{sweep[0]['producers']} producer's trajectories/s", one,
                          t["trajectories_per_s"] / one, f"x {sweep[0]['producers']} producer",
                          "", None))
    sat = r["saturation"]
    at = sat["producers"]
    last = sweep[-1]["producers"]
    at_row = next(t for t in sweep if t["producers"] == (at if at is not None else last))
    best_after = max((t["trajectories_per_s"] for t in sweep
                      if t["producers"] > at_row["producers"]), default=None)
    path = (f"single actor saturates at {processes(at)} (no larger count adds "
            f">= {sat['min_growth']:.0%})" if at is not None else
            f"single actor not saturated up to {processes(last)} (a larger count still adds "
            f">= {sat['min_growth']:.0%})")
    gain = 0.0 if best_after is None else best_after / at_row["trajectories_per_s"] - 1
    out.append(figure(path, at_row["producers"], "producers", "its trajectories/s",
                      at_row["trajectories_per_s"], gain,
                      "most any larger count adds" if best_after is not None else
                      "(no larger count measured)", "", None))
    return out


# the decision path runs before to_torch: that section allocates and frees gigabytes of tensors,
# and the first size timed right after it ran about twice as slow on both sides (ours and the
# naive reference) while the allocator grew its heap back
SECTIONS = (("ingest", ingest), ("decide", decide_figures), ("to_torch", torch_figures),
            ("verl", verl_figures), ("memory", memory_figures), ("ray", ray_figures))


def run(sizes: Sizes, only: set[str] | None = None) -> dict[str, Any]:
    """Every section (or ``only`` those), in this process; a section that fails is recorded
    with its error and the others still run."""
    work = Path(tempfile.mkdtemp(prefix="replaylake-bench-all-"))
    report: dict[str, Any] = {"quick": sizes is QUICK, "machine": platform.platform(),
                              "cpus": _cpus(), "sections": {}}
    try:
        for name, fn in SECTIONS:
            if only and name not in only:
                continue
            t = time.perf_counter()
            try:
                figs = fn(sizes, work) if name == "ingest" else fn(sizes)
                report["sections"][name] = {"figures": figs, "seconds": time.perf_counter() - t}
            except Exception as exc:   # noqa: BLE001 - a benchmark's failure is itself a result
                report["sections"][name] = {"error": f"{type(exc).__name__}: {exc}",
                                            "seconds": time.perf_counter() - t}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return report


def _cpus() -> int:
    import os
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def main(quick: bool = typer.Option(False, help="tiny sizes: a smoke test, not figures"),
         out: Path = typer.Option(Path("runs/bench/all.json"), help="JSON written here (a "
                                  "directory: all.json in it); the markdown table beside it "
                                  "(.md)"),
         only: str = typer.Option("", metavar="A,B", help="comma-separated sections, any of: "
                                  "ingest, decide, to_torch, verl, memory, ray (default: all)"),
         doc: list[Path] = typer.Option([], help="also regenerate this markdown file's table "
                                        "(and summary); repeat for several")
         ) -> None:
    """Every benchmark in one process; one JSON and one markdown table.

    Examples:
        replaylake dev bench all --quick
        replaylake dev bench all --doc docs/performance.md --doc README.md
    """
    chosen = {x.strip() for x in only.split(",") if x.strip()}
    unknown = sorted(chosen - {name for name, _ in SECTIONS})
    if unknown:     # refused before anything runs or is written
        raise ConfigError(f"--only {only}: no section {', '.join(unknown)}; the sections are "
                          f"{', '.join(name for name, _ in SECTIONS)}")
    out = result_path(out, "all.json")
    from jobs.bench.table import render, write_docs
    console = Console()
    with console.status("benchmarks ..."):
        report = run(QUICK if quick else FULL, chosen or None)
    out.write_text(json.dumps(report, indent=2) + "\n")
    md = render(report)
    out.with_suffix(".md").write_text(md)
    write_docs(doc, report)
    console.print(md)
    console.print(f"written to {out} and {out.with_suffix('.md')}")
    failed = [k for k, v in report["sections"].items() if "error" in v]
    if failed:
        raise typer.Exit(1)


if __name__ == "__main__":
    from jobs.cli import run
    run(main)       # through the one handler of user errors
