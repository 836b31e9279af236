"""Benchmark: latency of one `sample` decision (eviction + selection, batch 64) vs a Python reference.

The reference re-implements verl 0.9.1's algorithm the straightforward way, in the same process:
a dict of every group's tags, re-listed and re-sorted in full on every call. Each timed call first
gets 16 freshly stale groups (added untimed) so both sides evict and select, as in a real run.

Two ways of calling `sample` are timed, alternating in one process on the same buffer:
- "after a count": `get_sampleable_count` runs first (timed apart, as the decision alone), so the
  new groups' aggregates are already computed when `sample` starts;
- "alone": nothing runs before `sample`, which pays for the new groups' aggregates itself (what a
  caller that never counts pays).
After each `sample` the buffer is topped up with as many in-window groups as it handed out (their
aggregates computed untimed), so every timed call sees the stated buffer size and 16 new groups.
The first rounds of each size warm the process up and are not counted (a training run calls
`sample` thousands of times; its first calls are not what it spends its time on).

Each size runs under the staleness policies asked (`POLICIES`): ``drop`` (verl's: the stale
groups are evicted), ``mask`` (they stay and are trained loss-masked: the batch takes the 16
stale groups, marked, and the top-up replaces only the others) and ``per-dataset`` (drop under
``{"math": 4, "code": 8, "*": 6}``, the groups' datasets cycling through math, code and web,
which the mapping does not name; the stale groups are dispatched one step past the loosest
bound, so every dataset evicts its share). The reference applies the same policy.
Each declared selection order asked (`--orders`, besides oldest-first) adds a row under
``drop``: the declared orders keep a second heap keyed by the group's aggregates, and their rows
show what that costs. The reference stays oldest-first (the naive way of any order is the same
full sort).
"""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from jobs.bench.out import result_path
from pipeline.errors import ConfigError

BATCH, PER_GROUP, THRESHOLD, STEP, STALE_PER_CALL = 64, 4, 4, 100, 16
WARMUP = 3       # rounds run before the timed ones, per size
BOUNDS = {"math": 4, "code": 8, "*": 6}     # the per-dataset policy's bounds
DATASETS = ("math", "code", "web")          # web: not in BOUNDS, held to the "*" default


@dataclass(frozen=True)
class Policy:
    """A staleness policy as the buffer takes it and as the reference applies it."""

    strategy: str
    threshold: int | dict[str, int]
    datasets: bool = False       # groups registered with a dataset (cycling through DATASETS)

    def bound(self, dataset: str | None) -> int:
        if isinstance(self.threshold, int):
            return self.threshold
        return self.threshold.get(dataset, self.threshold["*"]) if dataset else \
            self.threshold["*"]

    def loosest(self) -> int:
        t = self.threshold
        return t if isinstance(t, int) else max(t.values())


POLICIES = {"drop": Policy("drop", THRESHOLD), "mask": Policy("mask", THRESHOLD),
            "per-dataset": Policy("drop", BOUNDS, datasets=True)}


class ReferenceBuffer:
    """verl's decision, naively: full re-listing, list filters, a full sort per call; a stale
    group is evicted (``drop``) or kept and marked (``mask``), by its dataset's bound."""

    def __init__(self, policy: Policy = POLICIES["drop"]) -> None:
        self.groups: dict[str, dict] = {}
        self.policy = policy

    def sample(self, g: int, batch_size: int) -> list[str]:
        listing = list(self.groups.items())
        marked = set()
        for uid, meta in listing:
            if meta["status"] == "finished" and \
                    g - meta["global_steps"] + 1 > self.policy.bound(meta["dataset"]):
                if self.policy.strategy == "mask":
                    marked.add(uid)
                else:
                    del self.groups[uid]
        ready = [(meta["global_steps"], uid) for uid, meta in self.groups.items()
                 if meta["status"] in ("finished", "failure")]
        ready.sort(key=lambda x: x[0])
        chosen = [uid for _, uid in ready[:batch_size]]
        for uid in chosen:
            del self.groups[uid]
        self.marked = [u for u in chosen if u in marked]
        return chosen


def _fill(buf, ref: ReferenceBuffer, uids: list[str], gs_values: np.ndarray, rng) -> None:
    from jobs.synthetic import trajectories
    names = DATASETS if ref.policy.datasets else (None,)
    for gs in np.unique(gs_values):
        part = [u for u, s in zip(uids, gs_values) if s == gs]
        sets = [names[i % len(names)] for i in range(len(part))]
        buf.register(partition="train", uids=part, global_steps=int(gs),
                     dataset=sets if ref.policy.datasets else None)
        rewards = rng.integers(0, 2, size=len(part) * PER_GROUP).astype(np.float64)
        buf.put(trajectories("train", part, PER_GROUP, version=max(int(gs) - 1, 0), rewards=rewards,
                             prompt_len=(2, 4), response_len=(2, 8), rng=rng, with_logprobs=False))
        buf.update_status(partition="train", uids=part, status="finished")
        for u, d in zip(part, sets):
            ref.groups[u] = {"status": "finished", "global_steps": int(gs), "dataset": d}


def run_size(n_traj: int, repeats: int, rng, policy: str = "drop",
             order: str = "oldest") -> dict:
    from pipeline import ReplayBuffer
    pol = POLICIES[policy]
    stale_gs = STEP - pol.loosest() - 1     # group span loosest + 1: over every bound
    n_groups = n_traj // PER_GROUP
    buf = ReplayBuffer.async_(max_off_policy_threshold=pol.threshold,
                              max_off_policy_strategy=pol.strategy, selection_order=order)
    ref = ReferenceBuffer(pol)
    t0 = time.perf_counter()
    uids = [f"g{i}" for i in range(n_groups)]
    gs = rng.integers(STEP - THRESHOLD + 1, STEP + 1, size=n_groups)
    _fill(buf, ref, uids, gs, rng)
    build_s = time.perf_counter() - t0
    ours, alone, ours_decide, theirs, capacity, masked = [], [], [], [], [], []
    top = 0
    for r in range(WARMUP + repeats):
        for counted in ((True, False) if r % 2 == 0 else (False, True)):
            stale = [f"s{r}_{int(counted)}_{i}" for i in range(STALE_PER_CALL)]
            _fill(buf, ref, stale, np.full(STALE_PER_CALL, stale_gs), rng)
            if counted:
                t = time.perf_counter()
                buf.get_sampleable_count(STEP, "train")   # aggregates + every rule, evicting nothing
                ours_decide.append(time.perf_counter() - t)
                t = time.perf_counter()     # admission's read: every rule again + the capacity
                buf.dispatch_capacity(STEP, "train", batch_size=BATCH)
                capacity.append(time.perf_counter() - t)
            t = time.perf_counter()
            batch = buf.sample(STEP, "train", BATCH)
            # a buffer without a lake makes the batch's table and metrics at their first read:
            # timed here, as a trainer reads them (the verl adapter's trainer reads neither)
            _ = (batch.table, batch.metrics)
            (ours if counted else alone).append(time.perf_counter() - t)
            buf.release(batch)
            t = time.perf_counter()
            chosen = ref.sample(STEP, BATCH)
            theirs.append(time.perf_counter() - t)
            if len(chosen) != BATCH or batch.num_groups != BATCH:
                raise RuntimeError("benchmark lost groups: both sides must select a full batch")
            if len(batch.masked) != len(ref.marked):
                raise RuntimeError(f"benchmark: {len(batch.masked)} groups masked, the reference "
                                   f"marked {len(ref.marked)}")
            # top up (untimed) to the stated size; the next call then sees only its 16 new groups
            # (under mask the batch took the stale ones: those were never part of the size)
            masked.append(len(batch.masked))
            k = BATCH - len(batch.masked)
            refill = [f"t{top + i}" for i in range(k)]
            top += k
            _fill(buf, ref, refill, rng.integers(STEP - THRESHOLD + 1, STEP + 1, size=k), rng)
            buf.get_sampleable_count(STEP, "train")
    # the first rounds warm the process up (allocator, polars' caches): not counted
    ours, alone, ours_decide = ours[WARMUP:], alone[WARMUP:], ours_decide[WARMUP:]
    capacity = capacity[WARMUP:]
    theirs = theirs[2 * WARMUP:]
    med = statistics.median
    return {"policy": policy, "order": order, "trajectories": n_traj, "groups": n_groups,
            "build_s": round(build_s, 2), "masked_per_call": med(masked),
            "ours_decision_ms": med(ours_decide) * 1e3, "ours_sample_ms": med(ours) * 1e3,
            "ours_capacity_ms": med(capacity) * 1e3,
            "ours_sample_alone_ms": med(alone) * 1e3,
            "ours_sample_alone_min_ms": min(alone) * 1e3, "ours_sample_min_ms": min(ours) * 1e3,
            "reference_ms": med(theirs) * 1e3,
            "speedup_decision": med(theirs) / med(ours_decide),
            "speedup_sample": med(theirs) / med(ours),
            "speedup_sample_alone": med(theirs) / med(alone)}


def _setting(r: dict) -> str:
    """A row's policy, or its declared order (the orders run under ``drop``)."""
    return r["policy"] if r["order"] == "oldest" else r["order"]


def tables(results: list[dict]) -> list[Table]:
    """The report as two tables that fit an 80-column terminal: milliseconds, then how many
    times faster than the naive reference."""
    ms = Table(title=f"sample, batch {BATCH}, {STALE_PER_CALL} stale evictions per call (ms)",
               caption="count: get_sampleable_count alone; capacity: dispatch_capacity after "
                       "it; after: sample after both; alone: sample with nothing before it; "
                       "naive: the reference")
    ratio = Table(title="times faster than the naive reference (same calls)")
    for col in ("buffered", "setting", "count", "capacity", "after", "alone", "naive"):
        ms.add_column(col, justify="right")
    for col in ("buffered", "setting", "count", "after", "alone"):
        ratio.add_column(col, justify="right")
    for r in results:
        head = (f"{r['trajectories']:,}", _setting(r))
        ms.add_row(*head, f"{r['ours_decision_ms']:.2f}", f"{r['ours_capacity_ms']:.2f}",
                   f"{r['ours_sample_ms']:.2f}", f"{r['ours_sample_alone_ms']:.2f}",
                   f"{r['reference_ms']:.2f}")
        ratio.add_row(*head, f"{r['speedup_decision']:.1f}x", f"{r['speedup_sample']:.1f}x",
                      f"{r['speedup_sample_alone']:.1f}x")
    return [ms, ratio]


def main(sizes: str = typer.Option("10000,40000,100000,1000000",
                                   help="buffered trajectories (4 per group), comma-separated"),
         repeats: int = typer.Option(15, help="timed sample calls per size and way of calling"),
         orders: str = typer.Option("oldest,spread_first", help="selection orders to time, "
                                    "comma-separated (oldest, spread_first, oldest_version)"),
         policies: str = typer.Option(",".join(POLICIES),
                                      help="staleness policies, comma-separated: "
                                           + ", ".join(POLICIES)),
         out: Path = typer.Option(Path("runs/bench/decide.json"),
                                  help="where to write results (a directory: decide.json in it)"),
         seed: int = 0) -> None:
    """Decision latency at several buffer sizes, ours vs the naive reference, same process.

    Examples:
        replaylake dev bench decide
        replaylake dev bench decide --sizes 10000,100000 --repeats 5
        replaylake dev bench decide --sizes 10000 --orders oldest,oldest_version
        replaylake dev bench decide --sizes 10000 --policies mask,per-dataset
    """
    out = result_path(out, "decide.json")
    names = [p.strip() for p in policies.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICIES]
    if unknown or not names:
        raise ConfigError(f"--policies {policies!r}: unknown {unknown}; give some of "
                          f"{', '.join(POLICIES)}, comma-separated")
    rng = np.random.default_rng(seed)
    console = Console()
    results = []
    for n in [int(s) for s in sizes.split(",")]:
        runs = [(name, "oldest") for name in names]
        runs += [("drop", o.strip()) for o in orders.split(",") if o.strip() not in ("", "oldest")]
        for name, order in runs:
            with console.status(f"building a buffer of {n:,} trajectories ({name}, {order}) ..."):
                results.append(run_size(n, repeats, rng, name, order))
    for table in tables(results):
        console.print(table)
    out.write_text(json.dumps({"batch": BATCH, "results": results}, indent=2))
    console.print(f"written to {out}")


if __name__ == "__main__":
    from jobs.cli import run
    run(main)       # through the one handler of user errors
