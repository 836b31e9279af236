"""`replaylake demo --ray`: the same job with the buffer as a Ray actor and each rollout worker a
Ray actor in a process of its own; the trainer stays in the driver.

What changes against the threaded demo, and what does not:

- The buffer is `RayReplayBuffer` (the actor owns the `ReplayBuffer` and the lake). Its
  refills are pulled (``refill="pull"``): a driver thread takes the owed count and dispatches
  that many prompts, as the threaded demo's `refill_fn` does from inside `sample`.
- Each rollout actor runs the demo's one `Worker` (jobs/demo/rollout.py) over its own buffer
  client; the driver's `Rollout` threads only feed it the queued groups, one call per batch of
  them, and add up the `RolloutStats` it returns.
- Weights: every published version is put in Ray's object store once and sent to every actor,
  which holds the newest version it has been sent. The worker checks before every token, as
  in-process, so a response records the versions that really wrote it (``min_global_steps`` /
  ``max_global_steps``, ``version_spans``); a version reaches an actor a few milliseconds after
  the trainer published it, where a thread sees it at once.

Placement: on a cluster whose nodes carry the custom resources ``lake`` and ``rollout`` (see
docs/ray.md), the buffer actor is pinned to a ``lake`` node and each rollout actor asks for one
``rollout``; without them Ray places both where it likes. The rollout actors ask for no CPU, so
the demo runs on a small local Ray (``ray.init(num_cpus=4)``, started when no cluster is
connected).
"""
from __future__ import annotations

import os
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from jobs.demo.rollout import Rollout, RolloutStats, WeightStore, Worker

LAKE_RESOURCE, ROLLOUT_RESOURCE = "lake", "rollout"
REFILL_POLL_S = 0.01      # how often the driver asks the buffer actor for owed refills


def where() -> dict[str, Any]:
    """This process: its pid and its Ray node's id."""
    import ray
    return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id()}


class RolloutActor:
    """The body of a rollout worker's Ray actor: one `Worker` over the buffer actor's client and
    the weights the driver sends (wrapped with ``ray.remote`` by `RaySide`)."""

    def __init__(self, buf: Any, version: int, state: dict, *, seed: int, settings: dict,
                 torch_threads: int) -> None:
        import torch
        torch.set_num_threads(torch_threads)
        self.weights = WeightStore(version=version, state=state)
        self.worker = Worker(buf, self.weights, seed=seed, **settings)

    def generate(self, items: list) -> RolloutStats:
        return self.worker.generate(items)

    def set_weights(self, version: int, state: dict) -> None:
        self.weights.receive(version, state)

    def where(self) -> dict[str, Any]:
        return where()


def _start_ray() -> Any:
    """ray, connected: the running cluster (or RAY_ADDRESS's), else a local one."""
    import ray
    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            ray.init(include_dashboard=False, log_to_driver=False)
        else:       # small machines: actors that each ask for a CPU would otherwise wait
            ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    return ray


@dataclass
class RaySide:
    """The Ray pieces of one demo run: the buffer actor's client, the rollout actors, and the
    driver thread that serves the buffer's refills. `close` ends them all."""

    buf: Any
    ray: Any
    actors: list = field(default_factory=list)
    placement: dict[str, Any] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _pump: threading.Thread | None = None

    @classmethod
    def start(cls, lake: Any, buffer_kwargs: dict[str, Any]) -> RaySide:
        from pipeline.adapters.ray import RayReplayBuffer

        ray = _start_ray()
        have = ray.cluster_resources()
        buf = RayReplayBuffer.start(
            lake=lake, preset="async", name=f"replaylake-demo-{uuid.uuid4().hex[:8]}",
            refill="pull", place_on=LAKE_RESOURCE if LAKE_RESOURCE in have else None,
            **buffer_kwargs)
        return cls(buf=buf, ray=ray)

    def work(self, rollout: Rollout, torch_threads: int) -> list:
        """Start one rollout actor per worker of ``rollout`` (its seeds and settings), holding
        the newest weights, send them every version published from now on, and return one
        function per actor for `Rollout.start`."""
        ray = self.ray
        opts: dict[str, Any] = {"num_cpus": 0, "max_concurrency": 2}   # generate + set_weights
        if ROLLOUT_RESOURCE in ray.cluster_resources():
            opts["resources"] = {ROLLOUT_RESOURCE: 1}
        remote = ray.remote(RolloutActor).options(**opts)
        version, state = rollout.weights.latest()
        self.actors = [remote.remote(self.buf, version, state, seed=seed,
                                     settings=rollout.worker_settings(),
                                     torch_threads=torch_threads)
                       for seed in rollout.worker_seeds()]

        def send(version: int, state: dict) -> None:
            ref = ray.put(state)         # once, however many actors read it
            for actor in self.actors:
                actor.set_weights.remote(version, ref)
        rollout.weights.publish_to(send)
        return [lambda items, a=a: ray.get(a.generate.remote(items)) for a in self.actors]

    def serve_refills(self, rollout: Rollout) -> None:
        """A driver thread: what the buffer actor owes in refills, dispatched (`Rollout.dispatch`,
        at the trainer's current step) as soon as it is owed; a failure reaches the trainer
        through `Rollout.check`."""
        def pump() -> None:
            try:
                while not self._stop.wait(REFILL_POLL_S):
                    owed = self.buf.take_refills()
                    if owed:
                        rollout.dispatch(owed)
            except BaseException as exc:
                rollout.error = exc
        self._pump = threading.Thread(target=pump, name="refills", daemon=True)
        self._pump.start()

    def locate(self) -> dict[str, Any]:
        """Where each piece runs: pid and Ray node id of the driver (the trainer), the buffer
        actor and each rollout actor."""
        info = self.buf.info()
        self.placement = {
            "driver": where(),
            "buffer": {"pid": info["pid"], "node_id": info["node_id"]},
            "rollout": self.ray.get([a.where.remote() for a in self.actors])}
        return self.placement

    def stop_refills(self) -> None:
        self._stop.set()
        if self._pump is not None:
            self._pump.join()

    def close(self) -> None:
        """End the rollout actors, then close the buffer (flushing the lake) and end its actor."""
        self.stop_refills()
        for actor in self.actors:
            self.ray.kill(actor)
        self.buf.kill()
