"""The demo's rollout side: worker threads sample responses with the newest published weights and
write whole groups into the buffer, as an inference server fleet would.

Why threads and not processes: the policy is tiny and torch releases the GIL inside its kernels,
so two threads overlap generation with the trainer on two cores, and the weights can be "sent"
by reference. What stays real: every prompt is registered as `pending` before it is generated,
goes `running`, and ends `finished` or `failure`; workers check for new weights before every
token, so a response that straddles a weight update is written by two versions and says so in
its per-token `version_spans`; some sessions fail on purpose (an inference error, a timeout) and
take their group to `failure`, keeping the sessions that did finish.

A group's sessions are generated in ``waves`` (as a server with limited concurrency serves a
group's samples), each wave put as soon as it is done and each trajectory with the rollout
seconds it took (`generation_s`): a crash between waves leaves the group partly generated, and a
resumed run (`requeue`) generates only the sessions still missing.

One worker's generation is `Worker`, whoever runs it: a thread of `Rollout` here, or a Ray actor
in a process of its own (`replaylake demo --ray`, jobs/demo/on_ray.py), which `Rollout`'s
threads then only feed (``work``: one call per worker that generates a list of queued groups).
"""
from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, fields

import numpy as np
import torch

from jobs.demo.policy import (
    Policy,
    dataset_index,
    generate,
    prompt_ids,
    reward,
    sample_prompts,
    version_spans,
)


class WeightStore:
    """The newest trainer weights and their version (version g = weights after step g)."""

    def __init__(self, policy: Policy | None = None, *, version: int = 0,
                 state: dict[str, torch.Tensor] | None = None):
        """The weights of ``policy`` as version 0, or (another process's copy) ``state`` as
        ``version``."""
        self._lock = threading.Lock()
        self._listeners: list[Callable[[int, dict[str, torch.Tensor]], None]] = []
        if policy is not None:
            self.publish(policy, version)
        elif state is not None:
            self._state, self.version = state, version
        else:
            raise ValueError("WeightStore needs a policy or a state")

    def publish(self, policy: Policy, version: int) -> None:
        state = {k: v.detach().clone() for k, v in policy.state_dict().items()}
        with self._lock:
            self._state, self.version = state, version
        for listener in self._listeners:
            listener(version, state)

    def latest(self) -> tuple[int, dict[str, torch.Tensor]]:
        with self._lock:
            return self.version, self._state

    def receive(self, version: int, state: dict[str, torch.Tensor]) -> None:
        """Hold ``state`` as ``version`` unless a newer version is held already (weights sent
        to another process may arrive out of order)."""
        with self._lock:
            if version > self.version:
                self._state, self.version = state, version

    def publish_to(self, listener: Callable[[int, dict[str, torch.Tensor]], None]) -> None:
        """Also hand every version published from now on to ``listener(version, state)``."""
        self._listeners.append(listener)


@dataclass
class RolloutStats:
    """Rewards of every trajectory generated since the trainer last drained them."""

    reward_sum: float = 0.0
    trajectories: int = 0
    failed_sessions: int = 0
    mid_response_swaps: int = 0


class Worker:
    """One rollout worker: generates queued groups with the newest weights of ``weights`` (one
    policy copy of its own, reloaded whenever the version changes, checked before every token)
    and writes them into ``buf`` (in-process, or the Ray actor's client)."""

    def __init__(self, buf, weights: WeightStore, *, seed: int, partition: str = "train",
                 failure_rate: float = 0.0, token_delay: float = 0.0, waves: int = 1,
                 probe: Callable[[str], None] | None = None):
        self.buf, self.weights, self.partition = buf, weights, partition
        self.failure_rate, self.token_delay, self.waves = failure_rate, token_delay, waves
        self.probe = probe
        self.policy = Policy()
        self.held = -1                       # the version self.policy holds
        self.rng = np.random.default_rng(seed)
        self.gen = torch.Generator().manual_seed(seed)

    def before_token(self) -> int:
        if self.probe is not None:
            self.probe("token")
        if self.token_delay:
            time.sleep(self.token_delay)        # a real server's decode time per token
        version, state = self.weights.latest()
        if version != self.held:
            self.policy.load_state_dict(state)
            self.held = version
        return version

    def generate(self, items: list[tuple[str, list[int], list[int]]]) -> RolloutStats:
        """Generate the queued groups ``(uid, prompt, session ids)``: running, each wave put as
        soon as it is done, then finished (or failure, for a group with a failed session)."""
        uids = [u for u, _, _ in items]
        self.buf.update_status(partition=self.partition, uids=uids, status="running")
        failed_groups, rewards, swaps, failures = set(), [], 0, 0
        waves = _waves(items, self.waves)
        for k, wave in enumerate(waves):
            started = time.perf_counter()
            tokens, logps, versions, lengths = generate(
                self.policy, [p for _, p, _ in wave], 1, before_token=self.before_token,
                generator=self.gen)
            seconds = (time.perf_counter() - started) / len(wave)   # its share of the call
            failed = self.rng.random(len(wave)) < self.failure_rate
            failures += int(failed.sum())
            rows: dict[str, list] = {c: [] for c in _COLUMNS}
            for i, (m, (uid, prompt, s)) in enumerate(zip(lengths.tolist(), wave)):
                if failed[i]:
                    failed_groups.add(uid)
                    continue
                response = tokens[i, :m].tolist()
                spans = version_spans(versions, m)
                swaps += len(spans) > 1
                rewards.append(reward(prompt, response))
                for col, value in zip(_COLUMNS, (
                        self.partition, uid, s, spans[0]["version"], spans[-1]["version"],
                        rewards[-1], prompt_ids(prompt), response, logps[i, :m].tolist(), spans,
                        seconds)):
                    rows[col].append(value)
            if rows["uid"]:
                self.buf.put(rows)
            if self.probe is not None and k + 1 < len(waves):
                self.probe("wave")             # put, and more sessions of these groups to come
        done = [u for u in uids if u not in failed_groups]
        if done:
            self.buf.update_status(partition=self.partition, uids=done, status="finished")
        if failed_groups:
            self.buf.update_status(partition=self.partition, uids=sorted(failed_groups),
                                   status="failure")
        return RolloutStats(sum(rewards), len(rewards), failures, swaps)


class Rollout:
    """Prompt dispatch (the buffer's `refill_fn` too) and the worker threads that serve it.

    ``capacity`` (a function of the dispatch step; None: unpaced) makes the trainer's own
    dispatches (`top_up`) admission-paced: at most what it answers, the rest carried to the
    next top-up. The buffer's refills (`dispatch` as refill_fn) are paced by the buffer."""

    def __init__(self, buf, weights: WeightStore, *, n: int, workers: int, failure_rate: float,
                 seed: int, token_delay: float = 0.0, partition: str = "train",
                 max_groups_per_call: int = 32, capacity: Callable[[int], int] | None = None,
                 waves: int = 1, uid_prefix: str = "p",
                 probe: Callable[[str], None] | None = None):
        self.buf, self.weights, self.n = buf, weights, n
        self.waves, self.uid_prefix = waves, uid_prefix
        self.probe = probe    # sees "token", and "wave" between two waves (the resume harness)
        self.capacity = capacity
        self.carried = 0                     # prompts a paced top-up could not dispatch yet
        self.partition, self.failure_rate = partition, failure_rate
        self.max_groups = max_groups_per_call
        self.token_delay = token_delay
        self.step = 1                        # dispatch step: the trainer's current step
        self._queue: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._rng = np.random.default_rng(seed)
        self._stats = RolloutStats()
        self.error: BaseException | None = None
        self.workers, self.seed = workers, seed
        self._threads: list[threading.Thread] = []

    def worker_seeds(self) -> list[int]:
        """Each worker's seed (of its sampling and its failures)."""
        return [self.seed + 1 + i for i in range(self.workers)]

    def worker_settings(self) -> dict:
        """A `Worker`'s keywords besides buffer, weights and seed (what a Ray rollout actor is
        given to build the same worker in its own process)."""
        return {"partition": self.partition, "failure_rate": self.failure_rate,
                "token_delay": self.token_delay, "waves": self.waves}

    # --- the trainer's side --------------------------------------------------------------------
    def dispatch(self, count: int) -> None:
        """Register `count` new prompts at the current step (so the buffer counts them in
        flight at once), each with its dataset index as the prompt id, then queue them for the
        workers, oldest first."""
        if count <= 0:
            return
        with self._lock:
            uids = [f"{self.uid_prefix}{next(self._ids):07d}" for _ in range(count)]
            prompts = sample_prompts(self._rng, count)
            step = self.step
        self.buf.register(partition=self.partition, uids=uids, global_steps=step, n=self.n,
                          prompt_ids=[dataset_index(p) for p in prompts])
        self.requeue([(u, p, list(range(self.n))) for u, p in zip(uids, prompts)])

    def requeue(self, items: list[tuple[str, list[int], list[int]]]) -> None:
        """Queue registered groups as ``(uid, prompt, session ids to generate)``: a resumed run
        hands back the sessions `ReplayBuffer.resume` reported missing."""
        for item in items:
            self._queue.put(item)

    def top_up(self, count: int) -> int:
        """Dispatch ``count`` prompts plus those carried; paced, only as many as the
        capacity at the current step allows (the rest is carried). Returns how many."""
        wanted = count + self.carried
        if self.capacity is not None:
            admitted = min(wanted, self.capacity(self.step))
            self.carried, wanted = wanted - admitted, admitted
        self.dispatch(wanted)
        return wanted

    def drain_stats(self) -> RolloutStats:
        with self._lock:
            out, self._stats = self._stats, RolloutStats()
        return out

    def start(self, work: list[Callable[[list], RolloutStats]] | None = None) -> None:
        """Start one thread per worker. ``work`` (default: a `Worker` in each thread): one
        function per worker that generates a list of queued groups and returns its
        `RolloutStats`; ``replaylake demo --ray`` passes calls to its Ray actors, so the threads
        only feed them."""
        if work is None:
            work = [None] * self.workers
        self._threads = [threading.Thread(target=self._serve, args=(seed, w),
                                          name=f"rollout-{i}", daemon=True)
                         for i, (seed, w) in enumerate(zip(self.worker_seeds(), work))]
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        """Stop taking work and wait for the calls in progress (the buffer must stay open
        until then); groups still queued stay `pending` in the lake."""
        self._stop.set()
        for t in self._threads:
            t.join()

    def check(self) -> None:
        """Re-raise a worker's crash in the trainer's thread."""
        if self.error is not None:
            raise RuntimeError(f"a rollout worker crashed: {self.error!r}") from self.error

    # --- a worker thread -----------------------------------------------------------------------
    def _take(self) -> list[tuple[str, list[int], list[int]]]:
        try:
            items = [self._queue.get(timeout=0.02)]
        except queue.Empty:
            return []
        while len(items) < self.max_groups:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return items

    def _serve(self, seed: int, work: Callable[[list], RolloutStats] | None) -> None:
        try:
            if work is None:
                work = Worker(self.buf, self.weights, seed=seed, probe=self.probe,
                              **self.worker_settings()).generate
            while not self._stop.is_set():
                items = self._take()
                if items:
                    produced = work(items)
                    with self._lock:
                        for f in fields(RolloutStats):
                            setattr(self._stats, f.name, getattr(self._stats, f.name)
                                    + getattr(produced, f.name))
        except BaseException as exc:            # surfaced to the trainer by check()
            self.error = exc


_COLUMNS = ("partition", "uid", "session_id", "min_global_steps", "max_global_steps", "reward",
            "prompt_ids", "response_ids", "rollout_log_probs", "version_spans", "generation_s")


def _waves(items, waves: int) -> list[list[tuple[str, list[int], int]]]:
    """The (uid, prompt, session id) of each wave: every group's sessions split into ``waves``
    runs of equal size (the last ones shorter), wave w holding each group's w-th run."""
    out = []
    for w in range(waves):
        wave = []
        for uid, prompt, sessions in items:
            size = -(-len(sessions) // waves)
            wave += [(uid, prompt, s) for s in sessions[w * size:(w + 1) * size]]
        if wave:
            out.append(wave)
    return out
