"""The demo's trainer loop: sample from the buffer, GRPO step on the tensors, publish, release.

One step g, in the order an asynchronous RL trainer runs it:

1. ``buf.sample(g, ...)`` -- the async preset evicts stale, zero-variance and failed groups,
   asks the rollout side to replace them (`refill_fn`) and hands out the oldest whole groups;
2. dispatch a batch's worth of new prompts, so generation runs on while the trainer trains
   (with `--strategy admit`, only as many as `buf.dispatch_capacity` allows, the rest later);
3. ``batch.to_torch("padded")`` -> GRPO loss (per-token ratios against the rollout log-probs;
   no KL term; over the tokens of ``loss_mask``, so under `--strategy mask` the rows marked
   stale count in their group's advantages but add nothing to the loss) -> one Adam step;
   with ``tis_cap`` the ratios are taken against the trainer's own log-probs instead and each
   token is weighted by its truncated importance weight (`tis_loss`);
4. publish the new weights as version g; the workers pick them up before their next token;
5. checkpoint (jobs/demo/resume.py), then ``buf.release(batch)`` -- the trajectories leave
   memory (they stay in the lake), and a released batch is always in the checkpoint.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from jobs.demo.policy import Policy, group_advantages, grpo_loss, trained_tokens
from jobs.demo.rollout import Rollout, WeightStore

EVICTION_KEYS = {"stale": "training/off_policy/evicted_samples",
                 "zero_variance": "training/filter_groups/evicted_samples",
                 "failure": "training/rollout_failure/evicted_samples"}
STALENESS_KEY = "training/off_policy/trajectory_staleness/mean"


TIS_KEYS = ("train/tis_weight_mean", "train/tis_truncated_fraction",
            "train/token_staleness_mean")
# what the off-policy correction did (plain GRPO loss): ratio mean and spread, clipped tokens
RATIO_KEYS = ("train/ratio_mean", "train/ratio_std", "train/clip_fraction")


def tis_loss(policy: Policy, tensors: dict[str, torch.Tensor], advantages: torch.Tensor,
             clip: float, cap: float) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip against the trainer's own log-probs (the weights before this step's update), each
    token weighted by its truncated importance weight ``min(pi_old / pi_rollout, cap)``, detached
    (truncated IS): the behaviour gap of an off-policy token is corrected without letting one
    token's huge ratio dominate the step. Token-mean over the trained tokens, as `grpo_loss`."""
    mask = trained_tokens(tensors)
    logp = policy.token_log_probs(tensors["input_ids"])
    old = logp.detach()
    ratio = torch.exp((logp - old) * mask)
    raw = torch.exp((old - tensors["rollout_log_probs"]) * mask)
    weight = raw.clamp(max=cap)
    adv = advantages.unsqueeze(1)
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
    tokens = mask.sum().clamp(min=1)
    loss = -(weight * surrogate * mask).sum() / tokens
    if not mask.any():       # every row masked: no token to take a mean over (see grpo_loss)
        return loss, {"train/loss": float(loss)}
    with torch.no_grad():
        stale = tensors["token_staleness"].to(torch.float32)
        stats = {"train/loss": float(loss),
                 "train/tis_weight_mean": float((weight * mask).sum() / tokens),
                 "train/tis_truncated_fraction": float(((raw > cap) * mask).sum() / tokens),
                 "train/token_staleness_mean": float((stale * mask).sum() / tokens)}
    return loss, stats


class Trainer:
    """Adam on the GRPO loss of one batch per step (``tis_cap``: with truncated importance
    weights, `tis_loss`)."""

    def __init__(self, policy: Policy, lr: float, clip: float, tis_cap: float | None = None):
        self.policy, self.clip, self.tis_cap = policy, clip, tis_cap
        self.optimizer = torch.optim.Adam(policy.parameters(), lr=lr)

    def step(self, batch) -> dict[str, float]:
        tis = self.tis_cap is not None
        tensors = batch.to_torch(layout="padded", token_versions=tis,
                                 require_log_probs_when_stale=tis)
        group = batch.table.column("uid").to_numpy(zero_copy_only=False)
        advantages = group_advantages(np.asarray(group), tensors["rewards"])
        if tis:
            loss, stats = tis_loss(self.policy, tensors, advantages, self.clip, self.tis_cap)
        else:
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
              on_step: Callable[[StepInfo], None], start: int = 1, held=None,
              first_top_up: int | None = None,
              checkpoint: Callable[[int], None] | None = None) -> list[StepInfo]:
    """Train steps `start`..`steps`; `on_step` sees each step as soon as it is done.

    A resumed run passes ``held``, the batch the dead process had sampled at step `start`
    but not checkpointed (trained first, instead of sampling another), and ``first_top_up``,
    the prompts to dispatch at once (default: `ahead` batches). ``checkpoint(g)`` runs after
    step g's update and before its release, so a batch the lake marks released is always in
    the checkpoint."""
    totals = dict.fromkeys(EVICTION_KEYS, 0)
    history: list[StepInfo] = []
    last_reward: float | None = None
    rollout.step = start
    rollout.top_up(ahead * batch_size if first_top_up is None else first_top_up)
    for g in range(start, steps + 1):
        rollout.check()
        rollout.step = g                       # refills and dispatches from now on are step g
        rollout.top_up(0)                      # paced: what earlier top-ups could not dispatch
        if held is not None and held.step == g:
            batch, held = held, None
        else:
            batch = buf.sample(g, "train", batch_size, timeout=timeout)
        rollout.top_up(batch.num_groups)       # keep `ahead` batches in the pipeline
        stats = trainer.step(batch)
        weights.publish(trainer.policy, g)
        if checkpoint is not None:
            checkpoint(g)
        buf.release(batch)
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


def tis_summary(history: list[StepInfo], cap: float) -> dict[str, float | None]:
    """The truncated-IS figures of a run: the cap and each `TIS_KEYS` metric's mean over steps."""
    return {"cap": float(cap), **_step_means(history, TIS_KEYS)}


def ratio_summary(history: list[StepInfo]) -> dict[str, float | None]:
    """The importance ratios of a run (plain GRPO loss): each `RATIO_KEYS` metric's mean over
    steps, and the largest step's spread (`ratio_std_max`)."""
    out = _step_means(history, RATIO_KEYS)
    spreads = [h.metrics["train/ratio_std"] for h in history if "train/ratio_std" in h.metrics]
    out["ratio_std_max"] = float(max(spreads)) if spreads else None
    return out


def _step_means(history: list[StepInfo], keys: tuple[str, ...]) -> dict[str, float | None]:
    """Each metric's mean over the steps that report it (a step that trained no token reports
    none); None when no step did (JSON has no NaN)."""
    out: dict[str, float | None] = {}
    for key in keys:
        values = [h.metrics[key] for h in history if key in h.metrics]
        out[key.split("/", 1)[1]] = float(np.mean(values)) if values else None
    return out
