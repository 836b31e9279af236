"""The demo's trainer loop: sample from the buffer, GRPO step on the tensors, release, publish.

One step g, in the order an asynchronous RL trainer runs it:

1. ``buf.sample(g, ...)`` -- the async preset evicts stale, zero-variance and failed groups,
   asks the rollout side to replace them (`refill_fn`) and hands out the oldest whole groups;
2. dispatch a batch's worth of new prompts, so generation runs on while the trainer trains
   (with `--strategy admit`, only as many as `buf.dispatch_capacity` allows, the rest later);
3. ``batch.to_torch("padded")`` -> GRPO loss (per-token ratios against the rollout log-probs)
   -> one Adam step;
4. ``buf.release(batch)`` -- the trajectories leave memory (they stay in the lake);
5. publish the new weights as version g; the workers pick them up before their next token.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from jobs.demo.policy import Policy, group_advantages, grpo_loss
from jobs.demo.rollout import Rollout, WeightStore

EVICTION_KEYS = {"stale": "training/off_policy/evicted_samples",
                 "zero_variance": "training/filter_groups/evicted_samples",
                 "failure": "training/rollout_failure/evicted_samples"}
STALENESS_KEY = "training/off_policy/trajectory_staleness/mean"
SPAN_KEY = "training/off_policy/trajectory_spans/mean"


class Trainer:
    """Adam on the GRPO loss of one batch per step."""

    def __init__(self, policy: Policy, lr: float, clip: float):
        self.policy, self.clip = policy, clip
        self.optimizer = torch.optim.Adam(policy.parameters(), lr=lr)

    def step(self, batch) -> dict[str, float]:
        tensors = batch.to_torch(layout="padded")
        group = batch.table.column("uid").to_numpy(zero_copy_only=False)
        advantages = group_advantages(np.asarray(group), tensors["rewards"])
        loss, stats = grpo_loss(self.policy, tensors, advantages, self.clip)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        stats["train/batch_reward_mean"] = float(tensors["rewards"].mean())
        return stats


@dataclass
class StepInfo:
    """What one step shows on the progress line and sends to the tracker."""

    step: int
    metrics: dict[str, float]
    reward_counts: dict[float, int]
    rollout_reward: float | None
    evicted: dict[str, int] = field(default_factory=dict)     # running totals per reason


def run_steps(*, steps: int, batch_size: int, ahead: int, buf, rollout: Rollout,
              weights: WeightStore, trainer: Trainer, timeout: float,
              on_step: Callable[[StepInfo], None]) -> list[StepInfo]:
    """Train for `steps` steps; `on_step` sees each step as soon as it is done."""
    totals = dict.fromkeys(EVICTION_KEYS, 0)
    history: list[StepInfo] = []
    last_reward: float | None = None
    rollout.step = 1
    rollout.top_up(ahead * batch_size)
    for g in range(1, steps + 1):
        rollout.check()
        rollout.step = g                       # refills and dispatches from now on are step g
        rollout.top_up(0)                      # paced: what earlier top-ups could not dispatch
        batch = buf.sample(g, "train", batch_size, timeout=timeout)
        rollout.top_up(batch.num_groups)       # keep `ahead` batches in the pipeline
        stats = trainer.step(batch)
        buf.release(batch)
        weights.publish(trainer.policy, g)
        produced = rollout.drain_stats()
        if produced.trajectories:
            last_reward = produced.reward_sum / produced.trajectories
        metrics = {**batch.metrics, **stats}
        if last_reward is not None:
            metrics["rollout/reward_mean"] = last_reward
        metrics["rollout/mid_response_swaps"] = float(produced.mid_response_swaps)
        for reason, key in EVICTION_KEYS.items():
            totals[reason] += int(batch.metrics.get(key, 0))
        info = StepInfo(g, metrics, dict(batch.filtered_reward_counts), last_reward,
                        dict(totals))
        history.append(info)
        on_step(info)
    return history
