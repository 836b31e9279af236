"""The replay buffer as a named Ray actor, and the client producers and trainers call it through.

`RayReplayBuffer.start(...)` creates the actor (named, optionally detached) that owns one
`ReplayBuffer` and its lake; `RayReplayBuffer.connect(name)` finds it from any process of the
cluster. The client has the in-process buffer's method names and raises the same replaylake
exception types (rebuilt from the actor's error envelope, see `ray_actor`). The client pickles to
just its actor handle, so it can be passed to Ray tasks and actors (remote producers).

Payloads cross the object store as Arrow: `put` conforms rows to the trajectory schema *on the
caller's side* (so a malformed row is rejected before anything is shipped, with the same
IngestError as in-process) and sends one Arrow IPC buffer; `sample` (and `held_batch`) return the
batch table the same way.

ray is imported lazily (inside functions): importing this module needs no ray.
"""
from __future__ import annotations

import os
import time
from typing import Any

from pipeline.adapters.ray.actor import (
    BufferActor,
    batch_from_wire,
    rebuild_error,
    table_to_ipc,
)
from pipeline.decide import Batch
from pipeline.errors import BufferUnavailableError, ConfigError, IngestError
from schemas import TRAJECTORIES_INPUT, conform

DEFAULT_NAME = "replaylake"
DEFAULT_MAX_CONCURRENCY = 32
DEFAULT_RETRY_WAIT = 60.0    # seconds a call keeps being sent again while the actor is down
DEFAULT_MAX_RESTARTS = 3     # with a lake; without one a restart would come back empty
_RESOURCE_SLIVER = 0.001     # of `place_on`: pins the actor without using the resource up
# sent again when the actor died under them: idempotent, or made so by the actor (`retried`)
_RETRIED = frozenset({"put", "register", "update_status", "release", "sample",
                      "wait_for_sampleable", "get_sampleable_count", "dispatch_capacity",
                      "counts", "partitions", "held_batches", "held_batch", "info"})
_MARKED = frozenset({"register", "update_status", "release"})   # told that they are a retry
_TRAJECTORY_DEFAULTS = {"index": 0, "is_padding": False, "versions_inferred": False}


def _retry_wait(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ConfigError(f"retry_wait={value!r} must be a number of seconds >= 0")
    return float(value)


def _unwrap(envelope: tuple, name: str) -> Any:
    if envelope[0] == "ok":
        return envelope[1]
    _, cls, args, state = envelope
    exc = rebuild_error(cls, args, state)
    note = f"(raised inside the replaylake Ray actor {name!r})"
    if note not in getattr(exc, "__notes__", ()):
        exc.add_note(note)
    raise exc


class RayReplayBuffer:
    """Client of the buffer actor: `register`, `update_status`, `put`, `sample`, `release`, ...

    Every call blocks until the actor answers (like the in-process method); ``*_async`` variants
    are not offered because producers already run in their own Ray tasks/actors.

    When the actor's process dies under a call, the client sends the call again until the
    restarted actor answers, for at most ``retry_wait`` seconds (then `BufferUnavailableError`);
    see docs/ray.md, "When the actor dies", for which calls are retried and what that means."""

    def __init__(self, handle: Any, name: str = DEFAULT_NAME,
                 retry_wait: float = DEFAULT_RETRY_WAIT):
        self.handle = handle
        self.name = name
        self.retry_wait = _retry_wait(retry_wait)
        self.retries = 0            # calls this client sent again after the actor died

    # --- lifecycle -----------------------------------------------------------------------------
    @classmethod
    def start(cls, *, lake: str | os.PathLike | None, preset: str = "async",
              name: str = DEFAULT_NAME, namespace: str | None = None, detached: bool = False,
              max_concurrency: int = DEFAULT_MAX_CONCURRENCY, fsync: bool = False,
              refill: Any = None, place_on: str | None = None,
              max_restarts: int | None = None, retry_wait: float = DEFAULT_RETRY_WAIT,
              actor_options: dict[str, Any] | None = None,
              **buffer_kwargs: Any) -> RayReplayBuffer:
        """Create the named actor and wait until its buffer is open (lake restored).

        ``lake`` must be a path every node that runs the actor or reads the lake sees (a shared
        file system); the actor is its only writer. ``refill``: None, ``"pull"`` (owed refills
        are recorded; producers fetch them with `take_refills`) or ``(actor_handle, "method")``
        (the actor calls ``handle.method.remote(count)`` and waits). ``buffer_kwargs`` are the
        preset's keywords (max_off_policy_threshold, filter_groups_metric, poll_interval, ...).

        ``place_on``: a custom resource only the lake's node carries (``ray start
        --resources='{"lake": 1}'``); the actor, and every restart of it, is placed on a node
        that has it (it asks for a sliver, so the resource is not used up). ``max_restarts``: how
        often Ray restarts the actor after its process dies (default 3 with a lake, 0 without:
        a memory-only buffer would come back empty); the restart reopens the lake and restores.
        ``retry_wait``: how long this client keeps sending a call again while the actor is down.
        """
        import ray

        if max_concurrency < 2:
            raise ConfigError(f"max_concurrency={max_concurrency!r} must be >= 2: a blocked "
                              "`sample` needs other threads to serve the producers' `put`")
        if max_restarts is None:
            max_restarts = DEFAULT_MAX_RESTARTS if lake is not None else 0
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < -1:
            raise ConfigError(f"max_restarts={max_restarts!r} must be an int >= 0, or -1 for no "
                              "limit")
        opts: dict[str, Any] = {"name": name, "max_concurrency": max_concurrency, "num_cpus": 0,
                                "max_restarts": max_restarts}
        if place_on is not None:
            if not isinstance(place_on, str) or not place_on:
                raise ConfigError(f"place_on={place_on!r} must be the name of a custom resource "
                                  "the lake's node carries, e.g. 'lake'")
            opts["resources"] = {place_on: _RESOURCE_SLIVER}
        if namespace is not None:
            opts["namespace"] = namespace
        if detached:
            opts["lifetime"] = "detached"
        opts.update(actor_options or {})
        lake_path = None if lake is None else os.path.abspath(os.fspath(lake))
        setup = (preset, lake_path, fsync, refill, buffer_kwargs)
        handle = ray.remote(BufferActor).options(**opts).remote(setup)
        client = cls(handle, name, retry_wait)
        try:   # a refused config or a locked lake raises its replaylake error here
            client._call("open", *setup)
        except BaseException:
            ray.kill(handle)
            raise
        return client

    @classmethod
    def connect(cls, name: str = DEFAULT_NAME, namespace: str | None = None,
                retry_wait: float = DEFAULT_RETRY_WAIT) -> RayReplayBuffer:
        """The client of an already running actor (from any process connected to the cluster)."""
        import ray
        return cls(ray.get_actor(name, namespace=namespace), name, retry_wait)

    def _call(self, method: str, *args: Any) -> Any:
        return _unwrap(self._send(method, *args), self.name)

    def _send(self, method: str, *args: Any) -> Any:
        """``handle.method.remote(*args)``, sent again (marked as a retry where the actor needs
        to know) while the actor is down, for at most ``retry_wait`` seconds."""
        import ray
        deadline, pause, retry = time.monotonic() + self.retry_wait, 0.05, False
        while True:
            extra = (retry,) if method in _MARKED else ()
            try:
                return ray.get(getattr(self.handle, method).remote(*args, *extra))
            except ray.exceptions.RayActorError as exc:
                if method not in _RETRIED or time.monotonic() >= deadline:
                    raise BufferUnavailableError(
                        f"the replaylake Ray actor {self.name!r} died during {method}() and did "
                        f"not answer again within retry_wait={self.retry_wait:g}s "
                        f"({type(exc).__name__}); if it has no restarts left, start a new one "
                        "over the same lake (it restores it)" if method in _RETRIED else
                        f"the replaylake Ray actor {self.name!r} died during {method}(), which "
                        "is not sent again (not idempotent); once the actor is back, check "
                        "`counts` and call it again if it did not land") from exc
                retry = True
                self.retries += 1
                time.sleep(pause)
                pause = min(pause * 2, 1.0)

    # --- producers -----------------------------------------------------------------------------
    def register(self, data: Any = None, *, partition: str | None = None,
                 uids: list[str] | None = None, global_steps: int | None = None,
                 n: int | None = None, prompt_ids: list[int | None] | None = None,
                 dataset: str | list[str | None] | None = None) -> None:
        """`ReplayBuffer.register`: rows, or the shorthand (``prompt_ids`` one per uid,
        ``dataset`` one name for all or one per uid)."""
        kwargs = {"data": data} if data is not None else {
            "partition": partition, "uids": list(uids or []), "global_steps": global_steps, "n": n}
        if data is None:
            kwargs.update({k: v for k, v in (("prompt_ids", prompt_ids), ("dataset", dataset))
                           if v is not None})
        self._call("register", kwargs)

    def update_status(self, data: Any = None, *, partition: str | None = None,
                      uids: list[str] | None = None, status: str | None = None) -> None:
        kwargs = {"data": data} if data is not None else {
            "partition": partition, "uids": list(uids or []), "status": status}
        self._call("update_status", kwargs)

    def put(self, trajectories: Any) -> int:
        """Conform here, ship one Arrow IPC buffer, let the actor validate groups and store."""
        table, problems = conform(trajectories, TRAJECTORIES_INPUT, _TRAJECTORY_DEFAULTS)
        if problems:
            raise IngestError("trajectories", problems)
        return self._call("put", table_to_ipc(table))

    def reissue(self, global_steps: int, partition_id: str | None = None) -> dict[str, list[str]]:
        return self._call("reissue", global_steps, partition_id)

    def resume(self, global_steps: int, partition_id: str | None = None
               ) -> dict[str, list[tuple[str, list[int] | None]]]:
        """`ReplayBuffer.resume` in the actor: in-flight groups keep their completed sessions;
        per group, the session ids still to generate."""
        return self._call("resume", global_steps, partition_id)

    def take_refills(self) -> int:
        """With ``refill="pull"``: how many new prompts the buffer asked for since the last call
        (the count is handed out once); register that many to let a waiting `sample` go on."""
        import ray
        return ray.get(self.handle.take_refills.remote())

    # --- the consumer --------------------------------------------------------------------------
    def sample(self, global_steps: int, partition_id: str, batch_size: int,
               timeout: float | None = None) -> Batch:
        payload, meta = self._call("sample", global_steps, partition_id, batch_size, timeout)
        return batch_from_wire(payload, meta)

    def wait_for_sampleable(self, global_steps: int, partition_id: str, target_count: int,
                            timeout: float | None = None) -> tuple[list[str], dict[str, float]]:
        return self._call("wait_for_sampleable", global_steps, partition_id, target_count, timeout)

    def get_sampleable_count(self, global_steps: int, partition_id: str) -> int:
        return self._call("get_sampleable_count", global_steps, partition_id)

    def dispatch_capacity(self, global_steps: int, partition_id: str,
                          batch_size: int | None = None) -> int:
        """`ReplayBuffer.dispatch_capacity`, asked of the actor: how many more groups a rollout
        worker may dispatch now without any going stale before it is trained."""
        return self._call("dispatch_capacity", global_steps, partition_id, batch_size)

    def release(self, batch: Batch | int) -> None:
        self._call("release", batch.batch_id if isinstance(batch, Batch) else int(batch))

    def held_batches(self, partition_id: str) -> dict[int, list[tuple[str, int, int]]]:
        """Selected, unreleased batches: batch id -> their (uid, session_id, index) keys."""
        return self._call("held_batches", partition_id)

    def held_batch(self, batch_id: int) -> Batch:
        """`ReplayBuffer.held_batch` in the actor: a held batch again, as `sample` returned it
        (after the actor restarted, the batch the trainer held when it died), its table over
        Arrow as `sample`'s is; `UnknownBatchError` when the actor holds no such batch."""
        return batch_from_wire(*self._call("held_batch", batch_id))

    def info(self) -> dict[str, Any]:
        """Where the actor runs: ``pid``, ``node_id``, ``restarted`` (a restart of the first
        process) and ``took_over_from`` (the dead writer whose lake lock it took, or None)."""
        return self._send("info")

    def counts(self, partition_id: str) -> dict[str, int]:
        return self._call("counts", partition_id)

    def partitions(self) -> list[str]:
        return self._call("partitions")

    def close(self) -> None:
        """Close the buffer (flush and unlock the lake); the actor stays up until `kill`."""
        self._call("close")

    def kill(self) -> None:
        """Close the buffer, then end the actor (a detached actor lives until this is called)."""
        import ray
        try:
            self.close()
        finally:
            ray.kill(self.handle)

    def __enter__(self) -> RayReplayBuffer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill()
