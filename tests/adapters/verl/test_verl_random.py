"""Randomized differential test: seeded random streams of prompt groups (dispatch steps, statuses,
rewards, session and output counts, failures, in-flight groups settling later, refills, trainer
clears) through verl 0.9.1's real buffer and ours, over one real TransferQueue; every step must
give the same batch, metrics, refill calls, depth-query answers and TransferQueue contents.

Dispatch steps never tie (verl breaks ties by set hash order): a sample step `g` is a multiple of
STEP and every group gets a dispatch step of its own below it. Groups that replaylake treats
differently on purpose (finished without trajectories, non-exact zero variance) are not generated.
"""
from __future__ import annotations

import random

import pytest

from tests.adapters.verl._harness import G, assert_same, run_both

pytestmark = pytest.mark.verl

STEP = 100        # global steps between two sample calls
STEPS = 100       # sample steps per configuration

CONFIGS = {
    "async-drop-dapo-acc": dict(kind="async", threshold=3 * STEP, filter_groups_metric="acc"),
    "async-wait": dict(kind="async", threshold=3 * STEP, strategy="wait"),
    "sync-plain": dict(kind="sync"),
    "sync-failure-refill": dict(kind="sync", sync_refill_failed_groups=True, gen_batch_size=1),
    "sync-dapo-reward": dict(kind="sync", filter_groups_metric="reward", train_batch_size=4,
                             gen_batch_size=1, max_inflight_gen_batches=2,
                             sync_refill_failed_groups=True),
}


class Stream:
    """One run's generator state: the same seed gives the same writes as long as the buffer
    under test behaves the same (any divergence shows up in the outcome of that very step)."""

    def __init__(self, ctx, seed: int, cfg: dict):
        self.ctx, self.cfg = ctx, dict(cfg)
        self.rng = random.Random(seed)
        self.seed = seed
        self.used: set[int] = set()
        self.inflight: list[G] = []
        self.held: list[list[str]] = []           # batches the trainer has not cleared yet
        self.g = 0
        self.sync_dapo = cfg["kind"] == "sync" and cfg.get("filter_groups_metric")

    def step_of(self, rng: random.Random, lo: int, hi: int) -> int:
        """A dispatch step in [lo, hi] no other group has."""
        while True:
            gs = rng.randint(max(lo, 0), hi)
            if gs not in self.used:
                self.used.add(gs)
                return gs

    def group(self, rng: random.Random, uid: str, gs: int, inflight_ok: bool) -> G:
        n = rng.choice([1, 2, 2, 3, 4])
        roll = rng.random()
        status = "finished" if roll < 0.72 else "failure" if roll < 0.84 else "running"
        if status == "running" and not inflight_ok:
            status = "finished"
        p = rng.choice([0.1, 0.5, 0.9])
        rewards = [float(rng.random() < p) for _ in range(n)]
        if status == "failure":
            rewards = rewards[:rng.randint(0, n)]
        vmax = max(gs - 1 - rng.randint(0, 2), 0)
        kw = {"tag_versions": False} if rng.random() < 0.1 else {}
        return G(uid, gs, status, rewards=rewards, vmin=max(vmax - rng.randint(0, 3), 0),
                 vmax=vmax, outputs=2 if rng.random() < 0.1 else 1, kw=kw)

    def refill(self, ctx, n: int) -> None:
        """refill_fn: n groups dispatched now, settled at once (their outcome from their own rng)."""
        call = len(ctx.refill_log)
        rng = random.Random(f"{self.seed}/refill/{call}")
        grps = [self.group(rng, f"r{call}x{i}", self.step_of(rng, self.g - STEP + 1, self.g), False)
                for i in range(n)]
        ctx.rollout.groups(grps)

    def terminal_count(self) -> int:
        return sum(1 for t in self.ctx.rollout.listing().values()
                   if t.get("is_prompt") and t.get("status") in ("finished", "failure"))

    def run(self, steps: int) -> None:
        ctx, cfg, rng = self.ctx, self.cfg, self.rng
        kind = cfg.pop("kind")
        buf = ctx.buffer(kind, refill=self.refill, **cfg)
        threshold = cfg.get("threshold")
        for k in range(1, steps + 1):
            self.g = k * STEP
            # in-flight groups settle; the wait gate must open (span < T), sync DAPO drains all
            keep = []
            for grp in self.inflight:
                span = self.g - grp.gs + 1
                if (self.sync_dapo or rng.random() < 0.5
                        or (threshold is not None and span >= threshold)):
                    grp.status = "failure" if rng.random() < 0.15 else "finished"
                    ctx.rollout.finish(grp)
                else:
                    keep.append(grp)
            self.inflight = keep
            new = [self.group(rng, f"n{k}x{i}", self.step_of(rng, self.g - 2 * STEP, self.g - 1),
                              not self.sync_dapo) for i in range(rng.randint(0, 4))]
            ctx.rollout.groups([g for g in new if g.status != "running"])
            running = [g for g in new if g.status == "running"]
            ctx.rollout.prompts([g.uid for g in running], [g.gs for g in running], "running")
            self.inflight += running
            if self.held and rng.random() < 0.5:          # the trainer ends an older step
                keys = self.held.pop(0)
                if keys:
                    ctx.tq.kv_clear(keys=keys, partition_id="train")
            available = self.terminal_count()
            if kind == "async" and rng.random() < 0.3:
                ctx.count(buf, self.g)
            if available == 0:
                continue
            if kind == "async" and rng.random() < 0.15:
                ctx.wait(buf, self.g, rng.randint(1, available))
            size = min(available, 6) if rng.random() < 0.3 else rng.randint(1, min(3, available))
            out = ctx.sample(buf, self.g, size)
            if out.keys is not None:
                self.held.append(out.keys)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_random_streams_give_the_same_results_on_every_step(tq, name):
    seed = 1000 + list(CONFIGS).index(name)
    verl, ours = run_both(tq, lambda ctx: Stream(ctx, seed, CONFIGS[name]).run(STEPS))
    assert_same(verl, ours)
    samples = [o for o in verl if o.what.startswith("sample")]
    assert len(samples) >= STEPS * 0.6                  # the stream really exercised sample
    if name in ("async-drop-dapo-acc", "sync-dapo-reward"):
        assert sum(1 for o in samples if o.metrics) >= 10
