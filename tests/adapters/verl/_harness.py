"""Differential harness: the same scenario against verl 0.9.1's real buffers and ours, over one real
TransferQueue, and a comparison of everything observable.

A scenario is a function ``scenario(ctx)``; it is run twice on an emptied TransferQueue, once with
``ctx.impl == "verl"`` (verl's `ReplayBuffer` / `ReplayBufferAsync`) and once with ``"ours"``
(pipeline.adapters.verl.dropin). ``ctx.rollout`` writes keys the way verl's trainer and agent loop do;
``ctx.buffer(kind, ...)`` builds the implementation's class with a recording ``refill_fn``;
``ctx.sample`` / ``ctx.count`` / ``ctx.wait`` call it and record an Outcome (keys, metrics, error,
refill calls since the last record, and every key + tag left in TransferQueue).
`assert_same` then compares the two runs outcome by outcome.
"""
from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

PART = "train"


def traj_record(uid: str, session: int, g: int, reward: float, *, acc: Any = None,
                vmin: int | None = None, vmax: int | None = None, index: int = 0,
                rlen: int = 4, tag_versions: bool = True, extra_versions: bool = True,
                rm_scores: bool = True, length_tag: bool = True) -> tuple[str, dict, dict]:
    """One trajectory as verl's agent loop writes it: (key, fields, tag). ``acc`` None: the
    named metric is absent from reward_extra_info; ``length_tag=False``: the tag leaves out
    `response_len` (another writer than verl's agent loop)."""
    import torch
    vmin = max(g - 1, 0) if vmin is None else vmin
    vmax = max(g - 1, 0) if vmax is None else vmax
    rm = torch.zeros(rlen, dtype=torch.float32)
    rm[-1] = reward
    extra: dict[str, Any] = {"reward_extra_info": {} if acc is None else {"acc": acc}}
    if extra_versions:
        extra.update(global_steps=vmax, min_global_steps=vmin, max_global_steps=vmax)
    fields = {"prompts": torch.arange(3, dtype=torch.int64),
              "responses": torch.arange(rlen, dtype=torch.int64) + 100,
              "response_mask": torch.ones(rlen, dtype=torch.int64),
              "rollout_log_probs": torch.full((rlen,), -0.5, dtype=torch.float32),
              "extra_fields": extra, "uid": uid, "session_id": session, "global_steps": g}
    if rm_scores:
        fields["rm_scores"] = rm
    tag = {"status": "success", "prompt_len": 3, "response_len": rlen, "seq_len": 3 + rlen,
           "global_steps": g}
    if tag_versions:
        tag.update(min_global_steps=vmin, max_global_steps=vmax)
    if not length_tag:
        del tag["response_len"]
    return f"{uid}_{session}_{index}", fields, tag


@dataclass
class G:
    """A prompt group to write: dispatched at ``gs``, one trajectory per reward."""

    uid: str
    gs: int
    status: str = "finished"
    rewards: Sequence[float] = (0.0, 1.0)
    acc: Sequence[Any] | None = None
    vmin: int | None = None
    vmax: int | None = None
    outputs: int = 1                 # trajectory keys per session (multi-output agent loops)
    kw: dict = field(default_factory=dict)


class Rollout:
    """Writes TransferQueue keys as verl does: prompt tags, trajectory fields + tags, statuses."""

    def __init__(self, tq: Any, partition: str = PART):
        self.tq, self.partition = tq, partition

    def prompts(self, uids: Sequence[str], gs: int | Sequence[int], status: str = "pending",
                partition: str | None = None) -> None:
        gss = [gs] * len(uids) if isinstance(gs, int) else list(gs)
        if uids:
            self.tq.kv_batch_put(keys=list(uids), partition_id=partition or self.partition,
                                 tags=[{"is_prompt": True, "status": status, "global_steps": g}
                                       for g in gss])

    def status(self, uids: Sequence[str], status: str, partition: str | None = None) -> None:
        if uids:
            self.tq.kv_batch_put(keys=list(uids), partition_id=partition or self.partition,
                                 tags=[{"status": status} for _ in uids])

    def trajectories(self, groups: Sequence[G], partition: str | None = None) -> None:
        from verl.utils.tensordict_utils import list_of_dict_to_tensordict
        keys, fields, tags = [], [], []
        for grp in groups:
            for s, r in enumerate(grp.rewards):
                for x in range(grp.outputs):
                    acc = grp.acc[s] if grp.acc is not None else r
                    k, f, t = traj_record(grp.uid, s, grp.gs, r, acc=acc, vmin=grp.vmin,
                                          vmax=grp.vmax, index=x, **grp.kw)
                    keys.append(k)
                    fields.append(f)
                    tags.append(t)
        if keys:
            self.tq.kv_batch_put(keys=keys, partition_id=partition or self.partition,
                                 fields=list_of_dict_to_tensordict(fields), tags=tags)

    def groups(self, groups: Sequence[G], partition: str | None = None) -> None:
        """Register (running), write trajectories, then set the terminal statuses: three calls."""
        if not groups:
            return
        self.prompts([g.uid for g in groups], [g.gs for g in groups], "running", partition)
        self.trajectories(groups, partition)
        for st in ("finished", "failure"):
            self.status([g.uid for g in groups if g.status == st], st, partition)

    def finish(self, grp: G, partition: str | None = None) -> None:
        """An in-flight group settles: its trajectories, then its terminal status."""
        self.trajectories([grp], partition)
        self.status([grp.uid], grp.status, partition)

    def listing(self, partition: str | None = None) -> dict[str, dict]:
        p = partition or self.partition
        return self.tq.kv_list(partition_id=p).get(p, {})

    def clear_all(self) -> None:
        for pid, items in self.tq.kv_list().items():
            if items:
                self.tq.kv_clear(keys=list(items), partition_id=pid)


@dataclass
class Outcome:
    what: str
    keys: list[str] | None = None
    metrics: dict | None = None
    error: str | None = None
    value: Any = None
    refills: list[int] = field(default_factory=list)
    left: dict[str, Any] = field(default_factory=dict)


def _state(listing: dict[str, dict]) -> dict[str, Any]:
    """What TransferQueue holds: prompt keys with (status, global_steps), trajectory keys."""
    return {k: ((t.get("status"), t.get("global_steps")) if t.get("is_prompt") else "traj")
            for k, t in listing.items()}


class Ctx:
    """What a scenario sees; one per run."""

    def __init__(self, tq: Any, impl: str):
        self.tq, self.impl = tq, impl
        self.rollout = Rollout(tq)
        self.outcomes: list[Outcome] = []
        self._refills: list[int] = []
        self.refill_log: list[int] = []
        self.threads: list[threading.Thread] = []

    def buffer(self, kind: str, *, refill: Callable[[Ctx, int], None] | None = None,
               threshold: int | None = 8, strategy: str = "drop", poll_interval: float = 0.05,
               trainer_mode: str | None = None, **kw: Any) -> Any:
        """verl's or our `ReplayBuffer` (kind `sync`) / `ReplayBufferAsync` (`async`)."""
        if self.impl == "verl":
            from verl.trainer.ppo.v1 import replay_buffer as mod
        else:
            import pipeline.adapters.verl as mod
        cls = mod.ReplayBuffer if kind == "sync" else mod.ReplayBufferAsync

        def refill_fn(n: int) -> int:
            self._refills.append(n)
            self.refill_log.append(n)
            if refill is not None:
                refill(self, n)
            return n

        mode = trainer_mode or ("sync" if kind == "sync" else "colocate_async")
        return cls(trainer_mode=mode, trainer_config={}, max_off_policy_threshold=threshold,
                   max_off_policy_strategy=strategy, sampler_kwargs={},
                   poll_interval=poll_interval, refill_fn=refill_fn if refill is not False else None,
                   **kw)

    def _record(self, out: Outcome, partition: str, buf: Any) -> Outcome:
        out.refills, self._refills = self._refills, []
        if self.impl == "ours":     # its thread makes the call's clears right after it: wait
            buf.flush()             # for them (verl made them inside the call)
        out.left = _state(self.rollout.listing(partition))
        self.outcomes.append(out)
        return out

    def sample(self, buf: Any, g: int, batch_size: int, partition: str = PART) -> Outcome:
        out = Outcome(f"sample(g={g}, {partition}, B={batch_size})")
        try:
            with watchdog(buf):
                meta, metrics = buf.sample(global_steps=g, partition_id=partition,
                                           batch_size=batch_size)
        except Exception as exc:  # noqa: BLE001 - the error is part of the outcome
            out.error = _error_class(exc)
            out.value = str(exc)
        else:
            assert type(meta).__name__ == "KVBatchMeta" and meta.partition_id == partition
            assert len(meta.tags) == len(meta.keys)
            out.keys, out.metrics, out.value = list(meta.keys), dict(metrics), meta
        return self._record(out, partition, buf)

    def count(self, buf: Any, g: int, partition: str = PART) -> Outcome:
        return self._record(Outcome(f"count(g={g})", value=buf.get_sampleable_count(g, partition)),
                            partition, buf)

    def wait(self, buf: Any, g: int, target: int, partition: str = PART) -> Outcome:
        with watchdog(buf):
            uids, metrics = buf.wait_for_sampleable(g, partition, target)
        return self._record(Outcome(f"wait(g={g}, target={target})", value=set(uids),
                                    metrics=dict(metrics)), partition, buf)

    def later(self, delay: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` after ``delay`` seconds in a thread (a rollout that settles later)."""
        def run() -> None:
            time.sleep(delay)
            fn()
        t = threading.Thread(target=run, daemon=True)
        t.start()
        self.threads.append(t)

    def join(self) -> None:
        for t in self.threads:
            t.join(30)


class Hung(Exception):
    """A buffer call ran past the watchdog: the scenario is wrong (or the buffer loops)."""


class _Raising:
    def __getattr__(self, name: str) -> Any:
        raise Hung(f"buffer call still polling after {WATCHDOG_S}s")


WATCHDOG_S = 60.0


@contextmanager
def watchdog(buf: Any, seconds: float = WATCHDOG_S) -> Iterator[None]:
    """Make a `sample` / `wait_for_sampleable` that is still polling after ``seconds`` fail (its
    next poll raises Hung) instead of hanging the test session."""
    fired = threading.Event()

    def fire() -> None:
        fired.set()
        if hasattr(buf, "_mirrors"):            # ours: the next TransferQueue listing raises
            for m in buf._mirrors.values():
                m.tq = _Raising()
        else:                                   # verl's: the next metadata sync raises
            buf._sync_metadata_from_transfer_queue = _Raising().sync
    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        if fired.is_set():
            raise Hung(f"buffer call still polling after {seconds}s")


def _error_class(exc: Exception) -> str:
    for base in (RuntimeError, AssertionError, ValueError, KeyError, TypeError):
        if isinstance(exc, base):
            return base.__name__
    return type(exc).__name__


def run(tq: Any, impl: str, scenario: Callable[[Ctx], None]) -> Ctx:
    ctx = Ctx(tq, impl)
    ctx.rollout.clear_all()
    try:
        scenario(ctx)
    finally:
        ctx.join()
    ctx.rollout.clear_all()
    return ctx


def run_both(tq: Any, scenario: Callable[[Ctx], None]) -> tuple[list[Outcome], list[Outcome]]:
    """The scenario against verl's buffers, then ours; returns both outcome lists."""
    return run(tq, "verl", scenario).outcomes, run(tq, "ours", scenario).outcomes


def same_metrics(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, dict) or isinstance(y, dict):
            if x != y:
                return False
        elif not math.isclose(float(x), float(y), rel_tol=1e-9, abs_tol=1e-12):
            return False
    return True


def assert_same(verl: list[Outcome], ours: list[Outcome], *, order: bool = True) -> None:
    """Every outcome equal: batch keys (as sets; also as lists when ``order``), metrics (floats
    with tolerance), errors (by class), refill calls, depth-query values, keys left in TQ."""
    assert len(verl) == len(ours), (len(verl), len(ours))
    for i, (v, o) in enumerate(zip(verl, ours)):
        where = f"outcome {i} ({v.what})"
        assert v.error == o.error, f"{where}: error {v.error}: {v.value} vs {o.error}: {o.value}"
        if v.keys is not None:
            assert set(v.keys) == set(o.keys), f"{where}: keys {v.keys} vs {o.keys}"
            if order:
                assert v.keys == o.keys, f"{where}: key order {v.keys} vs {o.keys}"
        if v.metrics is not None:
            assert same_metrics(v.metrics, o.metrics), f"{where}: metrics {v.metrics} vs {o.metrics}"
        if v.keys is None and v.error is None:
            assert v.value == o.value, f"{where}: {v.value} vs {o.value}"
        assert v.refills == o.refills, f"{where}: refills {v.refills} vs {o.refills}"
        assert v.left == o.left, f"{where}: left in TQ {v.left} vs {o.left}"


def uids_of(keys: Sequence[str]) -> list[str]:
    """Group uids of trajectory keys, in first-seen order."""
    return list(dict.fromkeys(k.split("_")[0] for k in keys))
