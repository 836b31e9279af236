"""Shared helper of the SQL tests: a deterministic buffer run writing a real lake (the case-file
helpers are in tests/support/sql_cases.py).

`simulate` drives a real ReplayBuffer (single thread: `refill_fn` rolls the new prompts out at
once) so that its lake holds every decision kind: stale, zero-variance and failure evictions,
refills, selections, releases, sync-DAPO surplus discards, and a restart with a re-issue that
drops partial trajectories.
"""
from __future__ import annotations

import atexit
import random
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline import ReplayBuffer

# Called around every sample call of a simulated run: (buffer, step, partition, "before"|"after")
Checkpoint = Callable[[ReplayBuffer, int, str, str], None]


@dataclass
class Run:
    """What a simulated run handed out, to compare against what the lake says."""

    lake: Path
    batches: list[Any] = field(default_factory=list)   # pipeline.Batch objects, in order
    threshold: int | None = None
    buffer: Any = None                                  # the (closed) ReplayBuffer


def _length(uid: str, session: int) -> int:
    """1 to 5 tokens; a group's mean length is 2.5 to 3.5 depending on its uid number."""
    return 1 + (session + int(uid[1:])) % 5


def _spans(lo: int, hi: int, n_tokens: int) -> list[dict]:
    """Per-token versions as odd sessions report them: the first half of the tokens from the
    oldest version, the rest from the newest (a zero-token run when the response has one)."""
    if lo == hi:
        return [{"version": lo, "n_tokens": n_tokens}]
    return [{"version": lo, "n_tokens": n_tokens // 2},
            {"version": hi, "n_tokens": n_tokens - n_tokens // 2}]


class Rollout:
    """Plays the rollout side: registers prompts and settles them (rewards from a seeded rng)."""

    def __init__(self, seed: int, n: int = 4):
        self.rng = random.Random(seed)
        self.n = n
        self.next_uid = 0
        self.buf: ReplayBuffer | None = None
        self.step = 0
        self.partition = "train"

    def uids(self, k: int) -> list[str]:
        out = [f"g{self.next_uid + i:04d}" for i in range(k)]
        self.next_uid += k
        return out

    def dispatch(self, k: int, *, settle: bool = True) -> list[str]:
        uids = self.uids(k)
        self.buf.register(partition=self.partition, uids=uids, global_steps=self.step, n=self.n)
        self.buf.update_status(partition=self.partition, uids=uids, status="running")
        if settle:
            for u in uids:
                self.settle(u)
        return uids

    def settle(self, uid: str, partition: str | None = None) -> None:
        """Trajectories then a terminal status: mostly mixed rewards, some all-equal, a few
        failures (with and without trajectories)."""
        part = partition or self.partition
        r = self.rng.random()
        if r < 0.08:
            self.buf.update_status(partition=part, uids=[uid], status="failure")
            return
        kind = self.rng.choice(["mixed", "mixed", "mixed", "zeros", "ones"])
        rewards = {"mixed": [float(i % 2) for i in range(self.n)],
                   "zeros": [0.0] * self.n, "ones": [1.0] * self.n}[kind]
        lo = max(self.step - 1 - self.rng.randint(0, 2), 0)
        hi = max(self.step - 1, lo)
        rows = [{"partition": part, "uid": uid, "session_id": s, "index": 0,
                 "min_global_steps": lo, "max_global_steps": hi, "reward": rewards[s],
                 "reward_info": [("acc", rewards[s])],
                 "prompt_ids": [1, 2, 3], "response_ids": list(range(_length(uid, s))),
                 "response_mask": None, "rollout_log_probs": None,
                 "version_spans": _spans(lo, hi, _length(uid, s)) if s % 2 else None,
                 "is_padding": False} for s in range(self.n)]
        self.buf.put(rows)
        self.buf.update_status(partition=part, uids=[uid],
                               status="failure" if r < 0.12 else "finished")

    def refill(self, k: int) -> None:
        self.dispatch(k)


def _no_checkpoint(buf: ReplayBuffer, step: int, partition: str, when: str) -> None:
    return None


def simulate_async(lake: Path, *, steps: int = 8, batch: int = 3, threshold: int = 2,
                   seed: int = 0, surplus: int = 0, max_response_length: int | None = None,
                   checkpoint: Checkpoint = _no_checkpoint) -> Run:
    """async, drop(threshold), DAPO filter on `reward`; some groups finish late (stale).
    ``surplus`` more groups than a batch takes are dispatched every step, so finished groups
    pile up and age past the threshold while waiting (stale evictions of kept groups).
    ``max_response_length`` switches on the overlong rule (responses are 1 to 5 tokens long).
    ``checkpoint(buf, step, partition, "before" | "after")`` runs around every sample call."""
    ro = Rollout(seed)
    buf = ReplayBuffer.async_(lake=lake, max_off_policy_threshold=threshold,
                              filter_groups_metric="reward", refill_fn=ro.refill,
                              max_response_length=max_response_length, poll_interval=0.01)
    ro.buf = buf
    run = Run(lake, threshold=threshold, buffer=buf)
    late: list[tuple[int, str]] = []
    with buf:
        for g in range(1, steps + 1):
            ro.step = g
            ro.dispatch(batch + surplus)
            late += [(g + 3, u) for u in ro.dispatch(1, settle=False)]
            for _, u in [x for x in late if x[0] == g]:
                ro.settle(u)
            late = [x for x in late if x[0] != g]
            checkpoint(buf, g, "train", "before")
            b = buf.sample(g, "train", batch, timeout=10)
            checkpoint(buf, g, "train", "after")
            run.batches.append(b)
            buf.release(b)
            if g % 3 == 0:   # a validation partition: never evicts
                ro.partition = "val"
                ro.dispatch(2)
                checkpoint(buf, g, "val", "before")
                run.batches.append(buf.sample(g, "val", 2, timeout=10))
                checkpoint(buf, g, "val", "after")
                ro.partition = "train"
    return run


def simulate_sync_dapo(lake: Path, *, steps: int = 4, batch: int = 2, seed: int = 1,
                       checkpoint: Checkpoint = _no_checkpoint) -> Run:
    """sync DAPO (credit, drain, surplus discard), then a restart that re-issues an in-flight
    group: its partial trajectory stays in the lake but no longer belongs to the group.
    ``checkpoint`` runs around every sample call, as in `simulate_async`."""
    ro = Rollout(seed)
    cfg = dict(filter_groups_metric="acc", refill_fn=ro.refill, train_batch_size=batch,
               gen_batch_size=1, max_inflight_gen_batches=2, poll_interval=0.01)
    buf = ReplayBuffer.sync(lake=lake, **cfg)
    ro.buf = buf
    run = Run(lake)
    with buf:
        for g in range(1, steps + 1):
            ro.step = g
            ro.dispatch(batch + 1)
            checkpoint(buf, g, "train", "before")
            b = buf.sample(g, "train", batch, timeout=10)
            checkpoint(buf, g, "train", "after")
            run.batches.append(b)
            buf.release(b)
        ro.step = steps + 1
        (u,) = ro.dispatch(1, settle=False)
        buf.put([{"partition": "train", "uid": u, "session_id": 0, "index": 0,
                  "min_global_steps": steps, "max_global_steps": steps, "reward": 1.0,
                  "reward_info": [("acc", 1.0)], "prompt_ids": [1], "response_ids": [2],
                  "response_mask": None, "rollout_log_probs": None, "version_spans": None,
                  "is_padding": False}])
    buf = ReplayBuffer.sync(lake=lake, **cfg)   # restart on the same lake
    ro.buf = buf
    with buf:
        ro.step = steps + 2
        assert buf.reissue(steps + 2) == {"train": [u]}
        buf.update_status(partition="train", uids=[u], status="running")
        ro.settle(u)
        checkpoint(buf, steps + 2, "train", "before")
        b = buf.sample(steps + 2, "train", 1, timeout=10)
        checkpoint(buf, steps + 2, "train", "after")
        run.batches.append(b)
    run.buffer = buf
    return run


def one(con: Any, query: str, params: dict | None = None) -> tuple:
    """The first row of a query over a lake connection (DuckDB 2 relations have no fetchone)."""
    return con.sql(query, params=params).fetchall()[0]


_RUNS: dict[str, Run] = {}


def shared_run(kind: str) -> Run:
    """One simulated run per kind (`async` | `sync`) per test process, in a temporary directory
    removed at exit: the SQL test modules share them (a run takes about a second here)."""
    if kind not in _RUNS:
        root = Path(tempfile.mkdtemp(prefix=f"replaylake-sql-{kind}-"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        sim = {"async": simulate_async, "sync": simulate_sync_dapo}[kind]
        _RUNS[kind] = sim(root / "lake")
    return _RUNS[kind]
