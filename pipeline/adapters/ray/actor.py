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
serves any call. Calls sent again by clients are marked as retries (see `retried`). Should the
lake be locked by another process meanwhile (or fail with another `LakeError` short of damage),
the restarted actor stays up without a buffer, answers ``unavailable`` with that error, and
tries the open again on later calls (at most once a second); clients keep sending their calls
within their retry wait. Refills owed to pulling producers outlive the restart (`refills`); a
`sample` whose caller gave up on it (Ctrl-C) stops or keeps its batch (`deliveries`).

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
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from pipeline.adapters.ray import retried
from pipeline.adapters.ray.deliveries import Abandoned, Deliveries, Kept, warn_left_held
from pipeline.adapters.ray.refills import RefillLedger, RefillRequests, asked_in_lake
from pipeline.buffer import ReplayBuffer
from pipeline.decide import Batch
from pipeline.errors import ConfigError, LakeDamageError, LakeError, ReplayLakeError

# ("ok", value) | ("error", type, args, state) | ("unavailable", type, args, state): a restart
# could not open the lake yet, the error says why | ("abandoned", None): its caller gave up
Envelope = tuple
ABANDONED = ("abandoned", None)
REOPEN_EVERY_S = 1.0        # a restart that could not open its lake tries again at most this often


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


def remote_refill(handle: Any, method: str) -> Callable[[int], None]:
    """A refill_fn that calls ``handle.<method>.remote(count)`` on a user's Ray actor and waits.

    That actor registers the new prompts through the buffer client (served by another thread of
    this actor) before it returns, exactly as an in-process refill_fn would. Whatever it raises
    (its own error, or Ray's when that actor is dead) is refill_fn's error: `sample` raises it,
    as in process, with a note naming the dispatcher."""
    import ray

    def refill(count: int) -> None:
        try:
            ray.get(getattr(handle, method).remote(int(count)))
        except Exception as exc:
            exc.add_note(f"(raised by the refill dispatcher {handle!r}.{method}({int(count)}) "
                         "that the replaylake Ray actor asked for new prompts; they stay owed "
                         "and the next sample asks again)")
            raise
    return refill


def buffer_factory(preset: str) -> Callable[..., ReplayBuffer]:
    if preset not in ("sync", "async"):
        raise ConfigError(f"preset={preset!r}: use 'sync' or 'async'")
    return ReplayBuffer.sync if preset == "sync" else ReplayBuffer.async_


def refill_function(refill: Any, pull: RefillRequests) -> Callable[[int], Any] | None:
    """The buffer's refill_fn for a ``refill`` option: None, "pull" or (actor handle, method)."""
    if refill is None:
        return None
    if isinstance(refill, str) and refill == "pull":
        return pull
    if isinstance(refill, tuple) and len(refill) == 2 and isinstance(refill[1], str):
        return remote_refill(*refill)
    raise ConfigError(f"refill={refill!r}: use None, 'pull' or (actor_handle, 'method_name')")


def _restarted() -> bool:
    """Whether this actor process is a restart (Ray ran ``__init__`` again after a death)."""
    import ray
    return ray.get_runtime_context().was_current_actor_reconstructed


class BufferActor:
    """The body of the Ray actor (wrapped with ``ray.remote`` by the client at start time).

    Every call of the buffer answers an envelope (see the module doc); ``("unavailable", ...)``
    when the actor was restarted but could not open its lake yet (see `_reopened`)."""

    def __init__(self, setup: tuple | None = None) -> None:
        self.refills = RefillRequests()
        self.deliveries = Deliveries()
        self.buf: ReplayBuffer | None = None
        self.setup = setup          # the arguments of `open`, for a restart to open with
        self.reopen_error: LakeError | None = None
        self._reopening = threading.Lock()
        self._tried = 0.0
        if setup is not None and _restarted():
            self._reopen()
            if isinstance(self.reopen_error, LakeDamageError):
                raise self.reopen_error

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
        buf = buffer_factory(preset)(lake=lake, fsync=fsync, **kwargs)
        if lake is not None and kwargs["refill_fn"] is self.refills:
            try:
                self.refills.keep_in(RefillLedger(lake, fsync), asked_in_lake(lake),
                                     restarted=_restarted())
            except BaseException:
                buf.close()
                raise
        self.buf = buf

    def _reopen(self) -> None:
        """A restart opens the lake itself. A `LakeError` (its lock held by another process, an
        I/O error) leaves the actor up without a buffer: calls answer ``unavailable`` naming it,
        and the open is tried again (at most once a second) until it succeeds. Anything else
        (damage found by the restart itself, a bug) ends the actor: Ray then reports it dead
        with the error."""
        try:
            self._open(*self.setup)
            self.reopen_error = None
        except LakeError as exc:
            self.reopen_error = exc
        self._tried = time.monotonic()

    def _reopened(self) -> LakeError | None:
        """None once the buffer is open (opening it now if a restart could not); else why not."""
        if self.buf is not None or self.reopen_error is None:
            return None
        with self._reopening:
            if self.buf is None and time.monotonic() - self._tried >= REOPEN_EVERY_S:
                self._reopen()
            return None if self.buf is not None else self.reopen_error

    def _serve(self, fn: Callable[[], Any]) -> Envelope:
        down = self._reopened()
        if down is not None:
            return ("unavailable", type(down), down.args, dict(vars(down)))
        return _guard(fn)

    def info(self) -> dict[str, Any]:
        """Where this actor runs and what it took over: pid, node id, whether it is a restart,
        the dead writer whose lake lock it took (None: the lock was free), and why a restart
        could not open the lake yet (None: it is open)."""
        import ray
        down = self._reopened()
        lake = None if self.buf is None else self.buf.lake
        return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(),
                "restarted": _restarted(),
                "took_over_from": None if lake is None else lake.lock.previous,
                "reopen_error": None if down is None else str(down)}

    # --- producers -----------------------------------------------------------------------------
    def register(self, kwargs: dict[str, Any], retry: bool = False) -> Envelope:
        return self._serve(lambda: self._left(self.buf.register, retried.register_left, kwargs,
                                              retry))

    def update_status(self, kwargs: dict[str, Any], retry: bool = False) -> Envelope:
        return self._serve(lambda: self._left(self.buf.update_status, retried.status_left,
                                              kwargs, retry))

    def _left(self, call: Callable[..., None], left: Callable[..., dict | None],
              kwargs: dict[str, Any], retry: bool) -> None:
        todo = left(self.buf, kwargs) if retry else kwargs
        if todo is not None:
            call(**todo)

    def put(self, payload: pa.Buffer, timeout: float | None) -> Envelope:
        return self._serve(lambda: self.buf.put(ipc_to_table(payload), timeout=timeout))

    def retire(self, kwargs: dict[str, Any]) -> Envelope:
        return self._serve(lambda: self.buf.retire(**kwargs))

    def take_refills(self, token: str | None = None) -> Envelope:
        return self._serve(lambda: self.refills.take(token))

    # --- the consumer --------------------------------------------------------------------------
    def sample(self, kwargs: dict[str, Any], token: str) -> Envelope:
        # named by the caller's request, else by the call's token: sent again after this
        # process died under it, the call gets the batch it chose (`ReplayBuffer.sample`)
        named = {**kwargs, "request": kwargs.get("request") or token}
        return self._waiting(token, kwargs, lambda: batch_to_wire(self.buf.sample(
            **named, before_poll=lambda: self.deliveries.check(token))),
            claim=lambda kept: self._claim(kept, kwargs))

    def wait_for_sampleable(self, kwargs: dict[str, Any], token: str) -> Envelope:
        return self._waiting(token, kwargs, lambda: self.buf.wait_for_sampleable(
            **kwargs, before_poll=lambda: self.deliveries.check(token)))

    def _waiting(self, token: str, kwargs: dict[str, Any], call: Callable[[], Any],
                 claim: Callable[[Kept], bool] | None = None) -> Envelope:
        """A call that may wait, as waiting call ``token`` (see `deliveries`)."""
        try:
            return self._serve(lambda: self.deliveries.run(token, kwargs, call, claim))
        except Abandoned:
            return ABANDONED

    def _claim(self, kept: Kept, kwargs: dict[str, Any]) -> bool:
        """Whether a kept batch is this `sample`'s: same step and batch size, still held, and
        chosen by a call that named no request or the same one (else it waits for that
        request: the buffer answers its retry with it)."""
        if kept.request is not None and kept.request != kwargs.get("request"):
            return False
        if len(kept.wire[1]["uids"]) != kwargs.get("batch_size"):
            return False
        held = any(kept.batch_id in self.buf.held_batches(p) for p in self.buf.partitions())
        if held and kept.step == kwargs.get("global_steps"):
            return True
        if held:
            warn_left_held(kept, kwargs.get("global_steps"), kept.wire[1]["partition"])
        return False

    def abandon(self, token: str) -> str:
        """The caller of waiting call ``token`` gave up on it (see `deliveries`)."""
        return self.deliveries.abandon(token)

    def release(self, batch_id: int, retry: bool = False) -> Envelope:
        return self._serve(lambda: self._release(batch_id, retry))

    def _release(self, batch_id: int, retry: bool) -> None:
        if not retry or retried.release_left(self.buf, batch_id):
            self.buf.release(batch_id)

    def reissue(self, kwargs: dict[str, Any]) -> Envelope:
        return self._serve(lambda: self.buf.reissue(**kwargs))

    def resume(self, kwargs: dict[str, Any]) -> Envelope:
        return self._serve(lambda: self.buf.resume(**kwargs))

    # --- reads: none changes a group's fate --------------------------------------------------
    def get_sampleable_count(self, kwargs: dict[str, Any]) -> Envelope:
        return self._serve(lambda: self.buf.get_sampleable_count(**kwargs))

    def dispatch_capacity(self, kwargs: dict[str, Any]) -> Envelope:
        return self._serve(lambda: self.buf.dispatch_capacity(**kwargs))

    def held_batches(self, kwargs: dict[str, Any]) -> Envelope:
        return self._serve(lambda: self.buf.held_batches(**kwargs))

    def lookup(self, kwargs: dict[str, Any]) -> Envelope:
        return self._serve(lambda: self.buf.lookup(**kwargs))

    def lookup_many(self, kwargs: dict[str, Any]) -> Envelope:
        return self._serve(lambda: self.buf.lookup_many(**kwargs))

    def sampleable_uids(self, kwargs: dict[str, Any]) -> Envelope:
        return self._serve(lambda: self.buf.sampleable_uids(**kwargs))

    def prepare(self, kwargs: dict[str, Any]) -> Envelope:
        return self._serve(lambda: self.buf.prepare(**kwargs))

    def counts(self, kwargs: dict[str, Any]) -> Envelope:
        return self._serve(lambda: self.buf.counts(**kwargs))

    def partitions(self) -> Envelope:
        return self._serve(lambda: self.buf.partitions())

    def held_batch(self, batch_id: Any) -> Envelope:
        return self._serve(lambda: batch_to_wire(self.buf.held_batch(batch_id)))

    def candidates(self, kwargs: dict[str, Any]) -> Envelope:
        return self._serve(lambda: table_to_ipc(self.buf.candidates(**kwargs)))

    def lake_dir(self) -> str | None:
        return None if self.buf is None or self.buf.lake_dir is None else str(self.buf.lake_dir)

    def close(self) -> Envelope:
        """Close the buffer (a restart that never opened its lake has nothing to close)."""
        if self.buf is None:
            return ("ok", None)
        return _guard(self.buf.close)
