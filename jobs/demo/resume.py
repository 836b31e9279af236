"""Resuming a demo run after a crash: the trainer's checkpoint, and what the buffer hands back.

Why a checkpoint per step: the lake keeps every acknowledged trajectory and decision, but the
policy lives in the trainer. `checkpoint` writes the weights and the optimizer after each step's
update and before its release (one file, replaced atomically), so a batch the lake marks as
released is always in the checkpoint, and a resumed run starts at the step after it.

`hand_back` puts the dead run's work back in order on the reopened buffer: the in-flight groups
go back to the rollout workers (with sibling reuse, `ReplayBuffer.resume`: only the sessions
still missing; without it, `reissue`: whole groups again), a batch sampled at a step the
checkpoint holds is released, and the batch sampled at the step it does not hold yet comes back
(`held_batch`) to be trained first.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from jobs.demo.policy import prompt_of

CHECKPOINT = "checkpoint.pt"


def checkpoint(run_dir: Path, trainer: Any, step: int) -> None:
    """Weights and optimizer after ``step``, replacing the last checkpoint atomically."""
    path = Path(run_dir) / CHECKPOINT
    tmp = path.with_name(f".{CHECKPOINT}.{os.getpid()}")
    torch.save({"step": step, "policy": trainer.policy.state_dict(),
                "optimizer": trainer.optimizer.state_dict()}, tmp)
    os.replace(tmp, path)


def restored_step(run_dir: Path) -> int:
    """The step the run's last checkpoint was taken after (0: none yet)."""
    path = Path(run_dir) / CHECKPOINT
    if not path.exists():
        return 0
    return int(torch.load(path, weights_only=True)["step"])


def restore(run_dir: Path, trainer: Any) -> int:
    """Load the last checkpoint into ``trainer``; the step it was taken after (0: none yet)."""
    path = Path(run_dir) / CHECKPOINT
    if not path.exists():
        return 0
    saved = torch.load(path, weights_only=True)
    trainer.policy.load_state_dict(saved["policy"])
    trainer.optimizer.load_state_dict(saved["optimizer"])
    return int(saved["step"])


@dataclass
class HandedBack:
    """What `hand_back` did: groups re-dispatched, sessions to generate again, sessions kept,
    batches released, and the batch to train first (None: none)."""

    groups: int
    sessions: int
    kept: int
    released: int
    held: Any

    def figures(self) -> dict[str, Any]:
        """What the run directory's ``resumed-<k>.json`` records of the restart."""
        return {"groups": self.groups, "sessions": self.sessions, "kept": self.kept,
                "released": self.released,
                "held_batch": None if self.held is None else self.held.batch_id}


def hand_back(buf: Any, rollout: Any, *, n: int, done: int, reuse: bool,
              partition: str = "train") -> HandedBack:
    """After a restart whose checkpoint holds steps ``1..done``: re-dispatch the in-flight
    groups at step ``done + 1`` (see the module doc) and sort out the held batches."""
    step = done + 1
    if reuse:
        back = buf.resume(step, partition).get(partition, [])
    else:
        back = [(u, None) for u in buf.reissue(step, partition).get(partition, [])]
    items, kept = [], 0
    for uid, missing in back:
        view = buf.lookup(partition, uid)
        sessions = list(range(n)) if missing is None else missing
        kept += n - len(sessions)
        items.append((uid, prompt_of(view.prompt_id), sessions))
    rollout.requeue(items)
    held, released = None, 0
    for batch_id in sorted(buf.held_batches(partition)):
        batch = buf.held_batch(batch_id)
        if batch.step <= done:                     # trained into the checkpoint already
            buf.release(batch_id)
            released += 1
        elif held is None:
            held = batch
        else:                                      # the trainer holds one batch at a time
            raise RuntimeError(f"the lake holds two batches sampled after the checkpoint of "
                               f"step {done} (batches {held.batch_id} and {batch_id}); this "
                               "run directory was not written by one demo trainer")
    return HandedBack(len(items), sum(len(s) for _, _, s in items), kept, released, held)
