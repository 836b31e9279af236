"""The buffer's Ray actor: one `ReplayBuffer` behind a threaded actor, with Arrow on the wire.

Why a *threaded* actor (``max_concurrency > 1``): `sample` blocks until enough groups are
sampleable, and the groups it waits for arrive through `put` / `update_status` calls from the
producers. A one-call-at-a-time actor would deadlock there; `ReplayBuffer` is already thread-safe
(one lock, and `sample` waits on a condition that releases it), so Ray's thread pool can serve
producers while the trainer's `sample` waits.

Why results come back as envelopes instead of raised exceptions: replaylake's errors carry
structured state (`IngestError.problems`, `SampleTimeout.counts`) and take custom constructor
arguments, which plain pickling of an exception cannot rebuild (it calls ``cls(*args)``). The actor
catches every `ReplayLakeError` and returns ``("error", class, args, state)``; the client rebuilds
an exception of exactly that class with the same message and attributes and raises it. Any other
exception (a bug) propagates the Ray way, as a `RayTaskError` that is also an instance of its
cause.

Why the open arguments are also given to the constructor: when the actor's process dies and Ray
restarts it (``max_restarts``), Ray runs ``__init__`` again with the same arguments and nothing
else. The restarted actor then opens the lake itself: it takes over the dead process's lock (the
kernel dropped it) and restores the buffer as the last acknowledged write left it, before it
serves any call. Calls sent again by clients are marked as retries (see `retried`).

Trajectory payloads travel as Arrow IPC stream buffers (`pa.Buffer` pickles out of band, so Ray's
object store carries the bytes without turning them into Python lists).

No module-level ray import: this module is imported inside Ray workers (which have ray) and by the
client, which imports ray itself.
"""
from __future__ import annotations

import copyreg
import dataclasses
import os
import threading
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from pipeline.adapters.ray import retried
from pipeline.buffer import ReplayBuffer
from pipeline.decide import Batch
from pipeline.errors import ConfigError, ReplayLakeError

Envelope = tuple  # ("ok", value) | ("error", type, args, state)


def table_to_ipc(table: pa.Table) -> pa.Buffer:
    """One Arrow IPC stream holding ``table`` (schema + record batches)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def ipc_to_table(buf: pa.Buffer | bytes) -> pa.Table:
    """Read back a table written by `table_to_ipc` (zero-copy over the buffer)."""
    return pa.ipc.open_stream(buf).read_all()


def rebuild_error(cls: type[BaseException], args: tuple, state: dict[str, Any]) -> BaseException:
    """An exception of exactly ``cls`` with the given args and attributes, without calling its
    ``__init__`` (whose signature may differ from ``args``, e.g. IngestError(what, problems))."""
    exc = cls.__new__(cls)
    exc.args = args
    exc.__dict__.update(state)
    return picklable(exc)


def _reduce_error(exc: BaseException) -> tuple:
    return rebuild_error, (type(exc), exc.args, dict(vars(exc)))


def picklable(exc: BaseException) -> BaseException:
    """Let ``exc`` pickle by its state rather than by ``cls(*args)``: a producer running in a Ray
    task can then re-raise a rebuilt IngestError / SampleTimeout to *its* caller unchanged."""
    copyreg.pickle(type(exc), _reduce_error)
    return exc


def _guard(fn: Callable[[], Any]) -> Envelope:
    try:
        return ("ok", fn())
    except ReplayLakeError as exc:
        return ("error", type(exc), exc.args, dict(vars(exc)))


def batch_to_wire(batch: Batch) -> tuple[pa.Buffer, dict[str, Any]]:
    """A Batch as (Arrow IPC payload, small metadata dict)."""
    meta = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch) if f.name != "table"}
    return table_to_ipc(batch.table), meta


def batch_from_wire(payload: pa.Buffer, meta: dict[str, Any]) -> Batch:
    return Batch(table=ipc_to_table(payload), **meta)


class RefillRequests:
    """Refills owed to the producers, for drivers that pull them (``refill="pull"``).

    The buffer calls this from inside `sample` with the number of new prompts it needs; the count
    is recorded and `sample` goes on waiting. A producer loop calls `take()` (through the client's
    `take_refills`) and registers that many new prompts, which is what lets `sample` finish."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owed = 0
        self._total = 0

    def __call__(self, count: int) -> None:
        with self._lock:
            self._owed += int(count)
            self._total += int(count)

    def take(self) -> int:
        with self._lock:
            owed, self._owed = self._owed, 0
            return owed

    @property
    def total(self) -> int:
        with self._lock:
            return self._total


def remote_refill(handle: Any, method: str) -> Callable[[int], None]:
    """A refill_fn that calls ``handle.<method>.remote(count)`` on a user's Ray actor and waits.

    That actor registers the new prompts through the buffer client (served by another thread of
    this actor) before it returns, exactly as an in-process refill_fn would."""
    import ray

    def refill(count: int) -> None:
        ray.get(getattr(handle, method).remote(int(count)))
    return refill


def buffer_factory(preset: str) -> Callable[..., ReplayBuffer]:
    if preset not in ("sync", "async"):
        raise ConfigError(f"preset={preset!r}: use 'sync' or 'async'")
    return ReplayBuffer.sync if preset == "sync" else ReplayBuffer.async_


def refill_function(refill: Any, pull: RefillRequests | None) -> Callable[[int], Any] | None:
    """The buffer's refill_fn for a ``refill`` option: None, "pull" or (actor handle, method)."""
    if refill is None:
        return None
    if refill == "pull":
        return pull if pull is not None else RefillRequests()
    if isinstance(refill, tuple) and len(refill) == 2 and isinstance(refill[1], str):
        return remote_refill(*refill)
    raise ConfigError(f"refill={refill!r}: use None, 'pull' or (actor_handle, 'method_name')")


def _restarted() -> bool:
    import ray
    return ray.get_runtime_context().was_current_actor_reconstructed


class BufferActor:
    """The body of the Ray actor (wrapped with ``ray.remote`` by the client at start time)."""

    def __init__(self, setup: tuple | None = None) -> None:
        self.refills = RefillRequests()
        self.buf: ReplayBuffer | None = None
        self.setup = setup          # the arguments of `open`, for a restart to open with
        if setup is not None and _restarted():
            self._open(*setup)

    def open(self, preset: str, lake: str | None, fsync: bool, refill: Any,
             buffer_kwargs: dict[str, Any]) -> Envelope:
        """Build the buffer (restoring the lake); separate from ``__init__`` so that a refused
        config or a locked lake comes back as the same typed error as in-process."""
        return _guard(lambda: self._open(preset, lake, fsync, refill, buffer_kwargs))

    def _open(self, preset: str, lake: str | None, fsync: bool, refill: Any,
              buffer_kwargs: dict[str, Any]) -> None:
        kwargs = dict(buffer_kwargs)
        kwargs["refill_fn"] = refill_function(refill, self.refills)
        if lake is not None:
            os.makedirs(os.path.dirname(os.path.abspath(lake)) or ".", exist_ok=True)
        self.buf = buffer_factory(preset)(lake=lake, fsync=fsync, **kwargs)

    def info(self) -> dict[str, Any]:
        """Where this actor runs and what it took over: pid, node id, whether it is a restart,
        and the dead writer whose lake lock it took (None: the lock was free)."""
        import ray
        lake = None if self.buf is None else self.buf.lake
        return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(),
                "restarted": _restarted(),
                "took_over_from": None if lake is None else lake.lock.previous}

    def ping(self) -> str:
        return "ok"

    def register(self, kwargs: dict[str, Any], retry: bool = False) -> Envelope:
        return _guard(lambda: self._left(self.buf.register, retried.register_left, kwargs, retry))

    def update_status(self, kwargs: dict[str, Any], retry: bool = False) -> Envelope:
        return _guard(lambda: self._left(self.buf.update_status, retried.status_left, kwargs,
                                         retry))

    def _left(self, call: Callable[..., None], left: Callable[..., dict | None],
              kwargs: dict[str, Any], retry: bool) -> None:
        todo = left(self.buf, kwargs) if retry else kwargs
        if todo is not None:
            call(**todo)

    def put(self, payload: pa.Buffer) -> Envelope:
        return _guard(lambda: self.buf.put(ipc_to_table(payload)))

    def sample(self, global_steps: int, partition_id: str, batch_size: int,
               timeout: float | None) -> Envelope:
        return _guard(lambda: batch_to_wire(
            self.buf.sample(global_steps, partition_id, batch_size, timeout=timeout)))

    def wait_for_sampleable(self, global_steps: int, partition_id: str, target_count: int,
                            timeout: float | None) -> Envelope:
        return _guard(lambda: self.buf.wait_for_sampleable(
            global_steps, partition_id, target_count, timeout=timeout))

    def get_sampleable_count(self, global_steps: int, partition_id: str) -> Envelope:
        return _guard(lambda: self.buf.get_sampleable_count(global_steps, partition_id))

    def dispatch_capacity(self, global_steps: int, partition_id: str,
                          batch_size: int | None) -> Envelope:
        return _guard(lambda: self.buf.dispatch_capacity(global_steps, partition_id,
                                                         batch_size=batch_size))

    def release(self, batch_id: int, retry: bool = False) -> Envelope:
        if retry and not retried.release_left(self.buf, batch_id):
            return ("ok", None)
        return _guard(lambda: self.buf.release(batch_id))

    def held_batches(self, partition_id: str) -> Envelope:
        return _guard(lambda: self.buf.held_batches(partition_id))

    def held_batch(self, batch_id: int) -> Envelope:
        return _guard(lambda: batch_to_wire(self.buf.held_batch(batch_id)))

    def reissue(self, global_steps: int, partition_id: str | None) -> Envelope:
        return _guard(lambda: self.buf.reissue(global_steps, partition_id))

    def resume(self, global_steps: int, partition_id: str | None) -> Envelope:
        return _guard(lambda: self.buf.resume(global_steps, partition_id))

    def counts(self, partition_id: str) -> Envelope:
        return _guard(lambda: self.buf.counts(partition_id))

    def partitions(self) -> Envelope:
        return _guard(self.buf.partitions)

    def take_refills(self) -> int:
        return self.refills.take()

    def refills_requested(self) -> int:
        return self.refills.total

    def lake_dir(self) -> str | None:
        return None if self.buf.lake_dir is None else str(self.buf.lake_dir)

    def close(self) -> Envelope:
        return _guard(self.buf.close)
