"""A scripted run whose prompt history is known by hand: a real ReplayBuffer writes a real lake,
with prompt ids, every eviction reason the async preset applies, a trained prompt and a restart
whose re-issue drops a partial trajectory.

Async, drop at threshold 2, DAPO filter on `reward`, batches of one group. Prompt by prompt:

- prompt 1 (too easy): groups u1 (lengths 2, 4) and u2 (3, 3) at step 1 and u7 (1, 1) at step 3,
  every response rewarded 1: all three evicted by the zero-variance filter (steps 1, 1, 3).
- prompt 2 (learnable): u3 at step 1 (rewards 0, 1; lengths 5, 1) trained at step 1; u5 at step
  2 gets a 7-token partial response, the process dies, the restart re-issues it at step 3 (the
  partial row dropped), and its new responses (rewards 1, 0; lengths 2, 2) are trained at step 3.
- prompt 3: u4 at step 1 fails without responses and is evicted as a failure at step 1.
- prompt 4: u6 at step 1 finishes late (rewards 0, 1; lengths 6, 6) and is evicted as stale at
  step 3 (group span 3 > 2).
- u8 (no prompt id) at step 3 is trained at step 4 and appears in no prompt's history.
"""
from __future__ import annotations

from pathlib import Path

from pipeline import ReplayBuffer
from tests.support.lake import traj


def _buffer(lake: Path) -> ReplayBuffer:
    return ReplayBuffer.async_(lake=lake, max_off_policy_threshold=2,
                               filter_groups_metric="reward", refill_fn=_no_refill,
                               poll_interval=0.01)


def _no_refill(k: int) -> None:
    """The script registers every group itself: a refill asks for nothing new."""


def _group(buf: ReplayBuffer, uid: str, gs: int, prompt_id: int | None,
           answers: list[tuple[float, int]] | None, *, status: str = "finished") -> None:
    """Register ``uid`` at ``gs``; then, unless ``answers`` is None (left pending), run it and
    put one response per (reward, length) and move it to ``status``."""
    buf.register(partition="train", uids=[uid], global_steps=gs, n=2, prompt_ids=[prompt_id])
    if answers is not None:
        _answer(buf, uid, gs, answers, status=status)


def _answer(buf: ReplayBuffer, uid: str, gs: int, answers: list[tuple[float, int]], *,
            status: str = "finished") -> None:
    buf.update_status(partition="train", uids=[uid], status="running")
    v = max(gs - 1, 0)
    if answers:
        buf.put([traj(uid, s, min_gs=v, max_gs=v, reward=r, response=list(range(n)))
                 for s, (r, n) in enumerate(answers)])
    if status != "running":
        buf.update_status(partition="train", uids=[uid], status=status)


def prompt_run(lake: Path) -> Path:
    """Write the scripted run (module doc) into ``lake``; returns it."""
    buf = _buffer(lake)
    with buf:
        _group(buf, "u1", 1, 1, [(1.0, 2), (1.0, 4)])
        _group(buf, "u2", 1, 1, [(1.0, 3), (1.0, 3)])
        _group(buf, "u3", 1, 2, [(0.0, 5), (1.0, 1)])
        _group(buf, "u4", 1, 3, [], status="failure")
        _group(buf, "u6", 1, 4, None)
        buf.release(buf.sample(1, "train", 1, timeout=10))          # u3; u1, u2, u4 evicted
        _answer(buf, "u6", 1, [(0.0, 6), (1.0, 6)])
        _group(buf, "u5", 2, 2, [(1.0, 7)], status="running")      # dies mid-generation
    buf = _buffer(lake)                                            # the restart
    with buf:
        assert buf.reissue(3) == {"train": ["u5"]}
        _answer(buf, "u5", 3, [(1.0, 2), (0.0, 2)])
        _group(buf, "u7", 3, 1, [(1.0, 1), (1.0, 1)])
        _group(buf, "u8", 3, None, [(0.0, 3), (1.0, 3)])
        buf.release(buf.sample(3, "train", 1, timeout=10))          # u5; u6 stale, u7 filtered
        buf.release(buf.sample(4, "train", 1, timeout=10))          # u8
    return lake
