"""Literal-fixture helpers for policy scenarios: groups with given rewards, and a scripted refill."""
from __future__ import annotations

import threading
import time

from pipeline import ReplayBuffer


def rows(uid: str, rewards: list[float], *, partition: str = "train", version: int = 0,
         acc: list[float] | None = None) -> list[dict]:
    """One trajectory per reward, all produced by weight version ``version``."""
    out = []
    for s, r in enumerate(rewards):
        row = {"partition": partition, "uid": uid, "session_id": s, "min_global_steps": version,
               "max_global_steps": version, "reward": r, "prompt_ids": [1, 2],
               "response_ids": [3, 4, 5]}
        if acc is not None:
            row["reward_info"] = {"acc": acc[s]} if acc[s] is not None else {}
        out.append(row)
    return out


def group(buf: ReplayBuffer, uid: str, gs: int, rewards: list[float] | None = None, *,
          status: str = "finished", partition: str = "train", acc: list[float] | None = None,
          dataset: str | None = None) -> None:
    """Register a group dispatched at ``gs`` (of ``dataset``), add its trajectories, move it to
    ``status``."""
    buf.register(partition=partition, uids=[uid], global_steps=gs, dataset=dataset)
    if rewards:
        buf.put(rows(uid, rewards, partition=partition, version=max(gs - 1, 0), acc=acc))
    if status != "pending":
        buf.update_status(partition=partition, uids=[uid], status="running")
    if status in ("finished", "failure"):
        buf.update_status(partition=partition, uids=[uid], status=status)


class Refiller:
    """refill_fn for tests: records each call and registers the new groups at ``step``.

    ``finish`` decides what happens to each new group right away: rewards to finish it with
    (e.g. [0.0, 1.0] for a mixed group), or None to leave it pending (in flight)."""

    def __init__(self, step: int, finish=lambda i: [0.0, 1.0], partition: str = "train"):
        self.step, self.finish, self.partition = step, finish, partition
        self.calls: list[int] = []
        self.uids: list[str] = []
        self.buf: ReplayBuffer | None = None

    def __call__(self, n: int) -> None:
        self.calls.append(n)
        for _ in range(n):
            uid = f"refill{len(self.uids)}"
            self.uids.append(uid)
            rewards = self.finish(len(self.uids) - 1)
            group(self.buf, uid, self.step, rewards,
                  status="finished" if rewards is not None else "pending",
                  partition=self.partition)


def make(preset: str, refiller: Refiller | None = None, **kw) -> ReplayBuffer:
    kw.setdefault("poll_interval", 0.05)
    if refiller is not None:
        kw["refill_fn"] = refiller
    buf = ReplayBuffer.async_(**kw) if preset == "async" else ReplayBuffer.sync(**kw)
    if refiller is not None:
        refiller.buf = buf
    return buf


def wait_until(cond, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise TimeoutError("condition not reached")
        time.sleep(0.01)


class Background:
    """Run ``fn`` in a thread; ``result()`` joins and returns its value or raises its error."""

    def __init__(self, fn):
        self._out: dict = {}
        self._t = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._t.start()

    def _run(self, fn) -> None:
        try:
            self._out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in result()
            self._out["error"] = exc

    @property
    def done(self) -> bool:
        return not self._t.is_alive()

    def result(self, timeout: float = 10.0):
        self._t.join(timeout)
        if self._t.is_alive():
            raise TimeoutError("background call did not finish")
        if "error" in self._out:
            raise self._out["error"]
        return self._out["value"]
