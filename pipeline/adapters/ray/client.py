"""The replay buffer as a named Ray actor, and the client producers and trainers call it through.

`RayReplayBuffer.start(...)` creates the actor (named, optionally detached) that owns one
`ReplayBuffer` and its lake; `RayReplayBuffer.connect(name)` finds it from any process of the
cluster. The client has the in-process buffer's methods with the same parameters and raises the
same replaylake exception types (rebuilt from the actor's error envelope, see `actor`). The
client pickles to just its actor handle, so it can be passed to Ray tasks and actors (remote
producers).

Payloads cross the object store as Arrow: `put` conforms rows to the trajectory schema *on the
caller's side* (so a malformed row is rejected before anything is shipped, with the same
IngestError as in-process) and sends one Arrow IPC buffer; `sample` (and `held_batch`) return the
batch table the same way.

ray is imported lazily (inside functions): importing this module needs no ray.
"""
from __future__ import annotations

import logging
import os
import time
import uuid
from typing import Any

import pyarrow as pa

from pipeline.adapters.ray.actor import (
    BufferActor,
    batch_from_wire,
    ipc_to_table,
    rebuild_error,
    table_to_ipc,
)
from pipeline.arguments import batch_id_arg, timeout_arg
from pipeline.decide import Batch
from pipeline.errors import BufferUnavailableError, ConfigError, IngestError
from schemas import TRAJECTORIES_INPUT, conform

log = logging.getLogger("replaylake")
DEFAULT_NAME = "replaylake"
DEFAULT_MAX_CONCURRENCY = 32
DEFAULT_RETRY_WAIT = 60.0    # seconds a call keeps being sent again while the actor is down
DEFAULT_MAX_RESTARTS = 3     # with a lake; without one a restart would come back empty
_RESOURCE_SLIVER = 0.001     # of `place_on`: pins the actor without using the resource up
# sent again when the actor died under them: idempotent, or made so by the actor (`retried`,
# take_refills by its token)
_RETRIED = frozenset({"put", "register", "update_status", "release", "retire", "take_refills",
                      "sample", "wait_for_sampleable", "get_sampleable_count",
                      "dispatch_capacity", "counts", "partitions", "held_batches", "held_batch",
                      "lookup", "lookup_many", "sampleable_uids", "prepare", "candidates",
                      "info"})
_MARKED = frozenset({"register", "update_status", "release"})   # told that they are a retry
_WAITING = frozenset({"sample", "wait_for_sampleable"})          # told when their caller quits
_TRAJECTORY_DEFAULTS = {"index": 0, "is_padding": False, "versions_inferred": False}
_KILLED = "was ended by kill()"


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


def _unavailable(answer: Any) -> bool:
    """Whether the actor answered that it is restarted but has no buffer yet."""
    return isinstance(answer, tuple) and bool(answer) and answer[0] == "unavailable"


def _reason(exc: BaseException) -> str:
    """One line saying what an error was: its type and the last line of its message (a Ray
    error ends with the remote error's own line)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    return f"{type(exc).__name__}: {last[:300]}" if last else type(exc).__name__


def _dead_for_good(died: Any) -> bool:
    """Whether Ray holds the actor of ``died`` (an `ActorDiedError`) dead for good: no restart
    left, or ended by `ray.kill`. Read from Ray's actor table (the only way that needs no
    dashboard); False when it cannot be read, so that the caller goes on waiting as before."""
    if not getattr(died, "actor_id", None):
        return False
    try:
        from ray._private import state
        info = state.actors(actor_id=died.actor_id)
    except Exception:   # noqa: BLE001 - an unknown answer: wait as for a restart
        return False
    return bool(info) and info.get("State") == "DEAD"


def _local_only(where: str, before_poll: Any) -> None:
    """`before_poll` runs in the buffer's own process: over Ray, the actor's."""
    if before_poll is not None:
        raise ConfigError(f"{where}: before_poll= runs in the buffer's own process, which over "
                          "Ray is the actor's, so the client cannot run it; mirror your data "
                          "plane into the buffer with register / put / update_status calls "
                          "instead and pass before_poll=None")


def _a_list(values: Any) -> Any:
    """A sequence of uids or ids as a list to ship (a string, None or anything else as given:
    the buffer refuses it with the in-process error)."""
    if values is None or isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        return values
    return list(values)


class RayReplayBuffer:
    """Client of the buffer actor: the in-process `ReplayBuffer`'s methods, with its parameters.

    Every call blocks until the actor answers (like the in-process method); ``*_async`` variants
    are not offered because producers already run in their own Ray tasks/actors.

    When the actor's process dies under a call, the client sends the call again until the
    restarted actor answers, for at most ``retry_wait`` seconds (then `BufferUnavailableError`);
    see docs/ray.md, "When the actor dies", for which calls are retried and what that means. An
    actor known to be gone for good (ended by `kill`, or dead with no restart left) fails every
    later call at once."""

    def __init__(self, handle: Any, name: str = DEFAULT_NAME,
                 retry_wait: float = DEFAULT_RETRY_WAIT):
        self.handle = handle
        self.name = name
        self.retry_wait = _retry_wait(retry_wait)
        self.retries = 0            # calls this client sent again after the actor died
        self._ended: str | None = None          # why the actor is gone for good, once known
        self._interrupted: tuple | None = None  # (sample's reply, abandon's reply) of a sample
        #                                         whose caller was interrupted (Ctrl-C)

    def __reduce__(self) -> tuple:
        """Pickles to the actor handle (and name, retry wait): a producer gets a fresh client."""
        return type(self), (self.handle, self.name, self.retry_wait)

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

    # --- sending calls -------------------------------------------------------------------------
    def _call(self, method: str, *args: Any) -> Any:
        return _unwrap(self._send(method, *args), self.name)

    def _send(self, method: str, *args: Any) -> Any:
        """``handle.method.remote(*args)``, sent again (marked as a retry where the actor needs
        to know) while the actor is down, for at most ``retry_wait`` seconds.

        Only the actor's own death is waited out: an error raised inside its method (say by a
        refill dispatcher actor that died, a `RayTaskError`) is the call's answer, raised as is."""
        import ray
        if self._ended is not None:
            raise BufferUnavailableError(self._gone(method))
        deadline, pause, retry = time.monotonic() + self.retry_wait, 0.05, False
        while True:
            extra = (retry,) if method in _MARKED else ()
            try:
                answer = self._get(method, (*args, *extra))
            except ray.exceptions.RayTaskError:
                raise
            except ray.exceptions.RayActorError as exc:
                self._down(method, exc, deadline)
            else:
                if not _unavailable(answer):
                    return answer
                self._down(method, rebuild_error(*answer[1:]), deadline)
            retry = True
            self.retries += 1
            time.sleep(pause)
            pause = min(pause * 2, 1.0)

    def _get(self, method: str, args: tuple) -> Any:
        """One attempt. A waiting call whose caller is interrupted (Ctrl-C) is given up in the
        actor too (see `deliveries`): it stops, or keeps the batch it chose for the next
        `sample`."""
        import ray
        ref = getattr(self.handle, method).remote(*args)
        try:
            return ray.get(ref)
        except (KeyboardInterrupt, SystemExit):
            if method in _WAITING:
                gave_up = self.handle.abandon.remote(args[-1])
                if method == "sample":
                    self._interrupted = (ref, gave_up, args[0]["request"])
            raise

    def _down(self, method: str, cause: BaseException, deadline: float) -> None:
        """The actor did not serve ``method`` (dead, restarting, or restarted without its lake):
        raise `BufferUnavailableError` unless the call is to be sent again."""
        import ray
        if isinstance(cause, ray.exceptions.ActorDiedError) and _dead_for_good(cause):
            self._ended = f"is dead and Ray will not restart it ({_reason(cause)})"
            raise BufferUnavailableError(self._gone(method)) from cause
        lake = not isinstance(cause, ray.exceptions.RayActorError)
        why = (f"it was restarted but cannot open its lake ({_reason(cause)}); free the lake "
               "(end the process that holds it) and call again: the actor tries again on every "
               "call" if lake else f"it went down ({_reason(cause)})")
        if method not in _RETRIED:
            raise BufferUnavailableError(
                f"the replaylake Ray actor {self.name!r} did not serve {method}(): {why}. "
                f"{method}() is not sent again (not idempotent); once the actor is back, check "
                "`counts` and call it again if it did not land") from cause
        if time.monotonic() >= deadline:
            raise BufferUnavailableError(
                f"the replaylake Ray actor {self.name!r} did not serve {method}() within "
                f"retry_wait={self.retry_wait:g}s: {why}" + ("" if lake else
                "; if it has no restarts left, start a new one over the same lake (it "
                "restores it)")) from cause

    def _gone(self, method: str) -> str:
        return (f"the replaylake Ray actor {self.name!r} {self._ended}, so {method}() cannot "
                "be served; start a new one over the same lake (RayReplayBuffer.start(lake=...) "
                "restores it) and connect to that")

    # --- producers -----------------------------------------------------------------------------
    def register(self, data: Any = None, *, partition: str | None = None,
                 uids: list[str] | None = None, global_steps: int | None = None,
                 n: int | None = None, prompt_ids: list[int | None] | None = None,
                 dataset: str | list[str | None] | None = None,
                 partition_id: str | None = None) -> None:
        """`ReplayBuffer.register` in the actor: rows, or the shorthand (``prompt_ids`` one per
        uid, ``dataset`` one name for all or one per uid)."""
        self._call("register", {"data": data, "partition": partition, "uids": _a_list(uids),
                                "global_steps": global_steps, "n": n,
                                "prompt_ids": _a_list(prompt_ids), "dataset": _a_list(dataset),
                                "partition_id": partition_id})

    def update_status(self, data: Any = None, *, partition: str | None = None,
                      uids: list[str] | None = None, status: str | None = None,
                      partition_id: str | None = None) -> None:
        """`ReplayBuffer.update_status` in the actor."""
        self._call("update_status", {"data": data, "partition": partition,
                                     "uids": _a_list(uids), "status": status,
                                     "partition_id": partition_id})

    def put(self, trajectories: Any, timeout: float | None = 0.0) -> int:
        """Conform here, ship one Arrow IPC buffer, let the actor validate groups and store.
        ``timeout``: how long a put over ``max_live_bytes`` waits in the actor for room (None:
        as long as it takes), as in process."""
        timeout = timeout_arg("put", timeout)
        table, problems = conform(trajectories, TRAJECTORIES_INPUT, _TRAJECTORY_DEFAULTS)
        if problems:
            raise IngestError("trajectories", problems)
        return self._call("put", table_to_ipc(table), timeout)

    def retire(self, partition: str | None = None, uids: list[str] | None = None,
               reason: str = "vanished", global_steps: int | None = None, *,
               partition_id: str | None = None) -> list[str]:
        """`ReplayBuffer.retire` in the actor (sent again after a death, it lists only the groups
        the retry retired: those the lost attempt retired are skipped as gone)."""
        return self._call("retire", {"partition": partition, "uids": _a_list(uids),
                                     "reason": reason, "global_steps": global_steps,
                                     "partition_id": partition_id})

    def reissue(self, global_steps: int, partition: str | None = None, *,
                partition_id: str | None = None, release_held: bool = False
                ) -> dict[str, list[str]]:
        """`ReplayBuffer.reissue` in the actor."""
        return self._call("reissue", {"global_steps": global_steps, "partition": partition,
                                      "partition_id": partition_id,
                                      "release_held": release_held})

    def resume(self, global_steps: int, partition: str | None = None, *,
               partition_id: str | None = None, release_held: bool = False
               ) -> dict[str, list[tuple[str, list[int] | None]]]:
        """`ReplayBuffer.resume` in the actor: in-flight groups keep their completed sessions;
        per group, the session ids still to generate."""
        return self._call("resume", {"global_steps": global_steps, "partition": partition,
                                     "partition_id": partition_id,
                                     "release_held": release_held})

    def take_refills(self) -> int:
        """With ``refill="pull"``: how many new prompts the buffer asked for since the last call
        (the count is handed out once); register that many to let a waiting `sample` go on.
        Sent again after a death with the same token, it gets the count the lost attempt took."""
        return self._call("take_refills", uuid.uuid4().hex)

    # --- the consumer --------------------------------------------------------------------------
    def sample(self, global_steps: int, partition: str | None = None,
               batch_size: int | None = None, timeout: float | None = None, *,
               partition_id: str | None = None, before_poll: Any = None,
               request: str | None = None) -> Batch:
        """`ReplayBuffer.sample` in the actor. A `sample` interrupted (Ctrl-C) while it waited
        is given up in the actor too; the next `sample` of that partition at the same step
        returns the batch it chose, if it chose one. Every call is named (``request``, else a
        fresh key), so the call sent again after the actor died under it gets the batch the
        lost attempt chose (see docs/ray.md)."""
        _local_only("sample", before_poll)
        kwargs = {"global_steps": global_steps, "partition": partition,
                  "batch_size": batch_size, "timeout": timeout, "partition_id": partition_id,
                  "request": request}     # (the actor names the call with the token if None)
        chosen = self._interrupted_batch(kwargs)
        if chosen is not None:
            return chosen
        payload, meta = self._call("sample", kwargs, uuid.uuid4().hex)
        return batch_from_wire(payload, meta)

    def _interrupted_batch(self, kwargs: dict[str, Any]) -> Batch | None:
        """The batch an interrupted `sample` of this client chose and whose answer the actor had
        already sent when told (otherwise the actor stopped the call, or keeps its batch for the
        next `sample`): this call's when it is of the same partition, step and batch size, and
        the interrupted call named no request or the same one (a batch chosen under a request
        waits for that request, which the actor answers with it)."""
        import ray
        pending, self._interrupted = self._interrupted, None
        if pending is None:
            return None
        ref, gave_up, request = pending
        if request is not None and request != kwargs["request"]:
            return None
        try:
            if ray.get(gave_up) != "replied" or ray.get(ref)[0] != "ok":
                return None
            batch = batch_from_wire(*ray.get(ref)[1])
        except ray.exceptions.RayError:      # the actor died meanwhile: the batch is held
            return None
        except BaseException:
            self._interrupted = pending
            raise
        step, wanted = kwargs["global_steps"], kwargs["partition"] or kwargs["partition_id"]
        if (batch.step, batch.partition, len(batch.uids)) == (step, wanted, kwargs["batch_size"]):
            return batch
        log.warning("sample(step=%s, %s): batch %d, chosen at step %d by a sample that was "
                    "interrupted before it returned, stays held (held_batches lists it; release "
                    "it or train on it)", step, wanted, batch.batch_id, batch.step)
        return None

    def wait_for_sampleable(self, global_steps: int, partition: str | None = None,
                            target_count: int | None = None, timeout: float | None = None, *,
                            partition_id: str | None = None, before_poll: Any = None) -> Any:
        """`ReplayBuffer.wait_for_sampleable` in the actor (interrupted, it stops there too)."""
        _local_only("wait_for_sampleable", before_poll)
        return self._call("wait_for_sampleable", {
            "global_steps": global_steps, "partition": partition, "target_count": target_count,
            "timeout": timeout, "partition_id": partition_id}, uuid.uuid4().hex)

    def get_sampleable_count(self, global_steps: int, partition: str | None = None, *,
                             partition_id: str | None = None) -> int:
        return self._call("get_sampleable_count", {"global_steps": global_steps,
                                                   "partition": partition,
                                                   "partition_id": partition_id})

    def dispatch_capacity(self, global_steps: int, partition: str | None = None, *,
                          partition_id: str | None = None, batch_size: int | None = None) -> int:
        """`ReplayBuffer.dispatch_capacity`, asked of the actor: how many more groups a rollout
        worker may dispatch now without any going stale before it is trained."""
        return self._call("dispatch_capacity", {"global_steps": global_steps,
                                                "partition": partition,
                                                "partition_id": partition_id,
                                                "batch_size": batch_size})

    def release(self, batch: Batch | int) -> None:
        """`ReplayBuffer.release` in the actor (the batch id checked here, as in process)."""
        self._call("release", batch.batch_id if isinstance(batch, Batch) else batch_id_arg(batch))

    def held_batches(self, partition: str | None = None, *, partition_id: str | None = None
                     ) -> dict[int, list[tuple[str, int, int]]]:
        """Selected, unreleased batches: batch id -> their (uid, session_id, index) keys."""
        return self._call("held_batches", {"partition": partition, "partition_id": partition_id})

    def held_batch(self, batch_id: Batch | int) -> Batch:
        """`ReplayBuffer.held_batch` in the actor: a held batch again, as `sample` returned it
        (after the actor restarted, the batch the trainer held when it died), its table over
        Arrow as `sample`'s is; `UnknownBatchError` when the actor holds no such batch."""
        wanted = batch_id.batch_id if isinstance(batch_id, Batch) else batch_id
        return batch_from_wire(*self._call("held_batch", wanted))

    def lookup(self, partition: str | None = None, uid: str | None = None, *,
               partition_id: str | None = None) -> Any:
        """`ReplayBuffer.lookup` in the actor: a frozen view of the group, or None."""
        return self._call("lookup", {"partition": partition, "uid": uid,
                                     "partition_id": partition_id})

    def lookup_many(self, partition: str | None = None, uids: list[str] | None = None, *,
                    partition_id: str | None = None) -> list[Any]:
        """`ReplayBuffer.lookup_many` in the actor: a frozen view (or None) per uid, in order."""
        return self._call("lookup_many", {"partition": partition, "uids": uids,
                                          "partition_id": partition_id})

    def sampleable_uids(self, partition: str | None = None, *,
                        partition_id: str | None = None) -> list[str]:
        return self._call("sampleable_uids", {"partition": partition,
                                              "partition_id": partition_id})

    def prepare(self, partition: str | None = None, *, partition_id: str | None = None) -> None:
        self._call("prepare", {"partition": partition, "partition_id": partition_id})

    def candidates(self, partition: str | None = None, *, partition_id: str | None = None
                   ) -> pa.Table:
        """`ReplayBuffer.candidates` in the actor, over Arrow."""
        return ipc_to_table(self._call("candidates", {"partition": partition,
                                                      "partition_id": partition_id}))

    def info(self) -> dict[str, Any]:
        """Where the actor runs: ``pid``, ``node_id``, ``restarted`` (a restart of the first
        process), ``took_over_from`` (the dead writer whose lake lock it took, or None) and
        ``reopen_error`` (why a restart could not open the lake yet, or None)."""
        return self._send("info")

    def counts(self, partition: str | None = None, *,
               partition_id: str | None = None) -> dict[str, int]:
        return self._call("counts", {"partition": partition, "partition_id": partition_id})

    def partitions(self) -> list[str]:
        return self._call("partitions")

    def close(self) -> None:
        """Close the buffer (flush and unlock the lake); the actor stays up until `kill`."""
        self._call("close")

    def kill(self) -> None:
        """Close the buffer, then end the actor (a detached actor lives until this is called).
        Once the actor is gone for good (a kill before, or dead with no restart left), there is
        nothing to close: it does nothing more than end it."""
        import ray
        if self._ended == _KILLED:
            return
        try:
            if self._ended is None:
                self.close()
        except BufferUnavailableError:
            if self._ended is None:
                raise
        finally:
            ray.kill(self.handle)
            self._ended = _KILLED

    def __enter__(self) -> RayReplayBuffer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill()
