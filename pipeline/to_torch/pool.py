"""Output buffers a trainer reuses across ``to_torch`` calls, so each call writes into memory
that was already touched instead of pages the kernel must hand out (and zero) afresh.

Without a pool every call returns new tensors: for a batch of ~90 MB, faulting those pages in
costs about as much as writing them. A trainer that builds one batch per step and is done with it
by the next can hand the tensors back and have the next call write into the same memory::

    pool = TensorPool()
    for step in ...:
        batch = buf.sample(...)
        tensors = batch_to_torch(batch.table, layout="packed", pool=pool)
        train_step(tensors)
        pool.give_back(tensors)      # nothing may read these tensors after this line

Rules the pool keeps:

- a buffer is handed out only while idle: never one whose tensors have not been given back;
- ``give_back`` takes the tensor objects a call returned (the dict, or some of its values), and
  refuses one it did not hand out or that was already given back (a stale second give-back must not
  free the buffer a later call is using);
- tensors the pool did not make (the small per-row ones) are ignored by ``give_back``;
- pinned and pageable buffers are kept apart: a call with ``pin_memory=True`` gets pinned ones;
- when the output goes to an accelerator (``device=``), the host tensors are only staging: the
  call gives them back itself, and the pool waits for the copies reading them before it hands them
  out again.

A handed-out tensor is a view of a larger byte buffer (rows vary in length between calls, so
buffers carry some headroom): ``torch.save`` of it would store the whole buffer; ``clone()`` one
that must outlive its give-back.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from pipeline.errors import PoolError

# A new buffer is this much larger than the tensor asking for it (rounded up to _ROUND bytes), so
# the next batch's slightly longer rows still fit it.
HEADROOM = 1.25
_ROUND = 1 << 16


@dataclass(eq=False)
class _Buffer:
    raw: torch.Tensor                  # uint8 [capacity]
    pinned: bool
    ready: Any = None                  # an event the copies reading this buffer record, or None
    handed: list[torch.Tensor] = field(default_factory=list)   # tensor objects out on loan
    ptr: int = field(init=False)       # the storage's address: the key of the pool's loan table

    def __post_init__(self) -> None:
        self.ptr = self.raw.untyped_storage().data_ptr()

    @property
    def capacity(self) -> int:
        return self.raw.numel()


class TensorPool:
    """Reusable output buffers for ``batch_to_torch(..., pool=)``; see the module doc.

    ``max_bytes`` bounds the bytes the pool keeps (idle and on loan): before it grows past the
    bound it drops idle buffers, smallest first. A call never fails for the pool: when the buffers
    on loan alone exceed the bound, the new buffer is still handed out, and dropped when it comes
    back. ``None`` (the default) keeps every buffer.
    """

    def __init__(self, max_bytes: int | None = None):
        if max_bytes is not None and (isinstance(max_bytes, bool) or max_bytes < 0):
            raise PoolError(f"max_bytes={max_bytes!r} must be a non-negative int or None")
        self.max_bytes = max_bytes
        self._idle: list[_Buffer] = []
        self._loaned: dict[int, _Buffer] = {}     # storage data_ptr -> buffer (pending too)
        self._pending: list[_Buffer] = []         # taken by the running call, not yet lent

    @property
    def idle_bytes(self) -> int:
        return sum(b.capacity for b in self._idle)

    @property
    def loaned_bytes(self) -> int:
        return sum(b.capacity for b in self._loaned.values())

    def take(self, shape: tuple[int, ...], dtype: torch.dtype, pinned: bool) -> torch.Tensor:
        """An uninitialised tensor of ``shape`` and ``dtype`` in an idle buffer (or a new one).

        The buffer stays pending until ``lend`` (the call returned it) or ``abandon`` (it failed).
        """
        nbytes = math.prod(shape) * dtype.itemsize
        buf = None
        for b in self._idle:                    # the smallest idle buffer that fits
            if b.pinned == pinned and b.capacity >= nbytes and (
                    buf is None or b.capacity < buf.capacity):
                buf = b
        if buf is not None:
            self._idle.remove(buf)
            if buf.ready is not None:
                buf.ready.synchronize()         # copies still reading it from an earlier call
                buf.ready = None
        else:
            capacity = max(_ROUND, -(-int(nbytes * HEADROOM) // _ROUND) * _ROUND)
            self._make_room(capacity)
            buf = _Buffer(_allocate(capacity, pinned), pinned)
        self._loaned[buf.ptr] = buf
        self._pending.append(buf)
        return buf.raw[:nbytes].view(dtype).view(shape)

    def lend(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Record the tensor objects a call hands to its caller (``give_back`` checks them); a
        pending buffer none of them views goes back to idle."""
        pending, self._pending = self._pending, []
        for t in tensors.values():
            buf = self._loaned.get(t.untyped_storage().data_ptr()) if t.is_cpu else None
            if buf is not None and any(b is buf for b in pending):
                buf.handed.append(t)
        for buf in pending:
            if not buf.handed:
                self._release(buf, None)

    def abandon(self) -> None:
        """The call that took the pending buffers failed: they go back to idle."""
        pending, self._pending = self._pending, []
        for buf in pending:
            self._release(buf, None)

    def give_back(self, tensors: Mapping[str, torch.Tensor] | Iterable[torch.Tensor],
                  ready: Any = None) -> None:
        """Return a call's tensors; their buffers may be handed out by the next call.

        ``ready``: an event (anything with ``synchronize()``) that completes once nothing reads the
        tensors any more, e.g. a CUDA event recorded after copies that read them.
        """
        items = list(tensors.values() if isinstance(tensors, Mapping) else tensors)
        back: list[tuple[_Buffer, torch.Tensor]] = []
        seen: set[int] = set()
        for t in items:
            if id(t) in seen:                    # the same tensor twice in one give_back
                continue
            seen.add(id(t))
            if not isinstance(t, torch.Tensor):
                raise PoolError(f"give_back takes tensors, got {type(t).__name__}")
            ptr = t.untyped_storage().data_ptr() if t.is_cpu else None
            buf = self._loaned.get(ptr) if ptr is not None else None
            if buf is None:
                if ptr is not None and any(b.ptr == ptr for b in self._idle):
                    raise PoolError("a tensor given back twice: its buffer is already idle")
                continue                         # not the pool's (a per-row tensor)
            if not any(h is t for h in buf.handed):
                raise PoolError("a tensor the pool did not hand out on its buffer's current loan "
                                "(a view made from it, or one from an earlier call): give back "
                                "the tensors batch_to_torch returned")
            back.append((buf, t))
        for buf, t in back:
            buf.handed = [h for h in buf.handed if h is not t]
            if not buf.handed:
                self._release(buf, ready)

    def _release(self, buf: _Buffer, ready: Any) -> None:
        del self._loaned[buf.ptr]
        buf.ready = ready
        if self.max_bytes is not None and self.loaned_bytes + self.idle_bytes + buf.capacity \
                > self.max_bytes:
            if ready is not None:
                ready.synchronize()
            return                               # dropped: over the bound
        self._idle.append(buf)

    def _make_room(self, capacity: int) -> None:
        if self.max_bytes is None:
            return
        self._idle.sort(key=lambda b: b.capacity)
        while self._idle and self.loaned_bytes + self.idle_bytes + capacity > self.max_bytes:
            dropped = self._idle.pop(0)
            if dropped.ready is not None:
                dropped.ready.synchronize()


TORCH_DTYPES = {np.dtype(np.int64): torch.int64, np.dtype(np.int32): torch.int32,
                np.dtype(np.float32): torch.float32, np.dtype(bool): torch.bool}


def output(shape: tuple[int, ...], dtype: Any, pin: bool, zeroed: bool,
           pool: TensorPool | None) -> torch.Tensor:
    """One large output tensor of a ``to_torch`` call (``dtype``: its numpy dtype), allocated by
    the one policy every output follows: lent by ``pool`` when given (touched memory from
    earlier calls, zeroed if asked), page-locked by torch when ``pin``, else from numpy's
    allocator. numpy's serves a large array from memory an earlier batch freed, where torch's
    maps fresh pages for every large tensor and faults each one in again (a [1, 3.2M] int64
    tensor: ~7.5 ms against ~1.4 ms). Each tensor owns its memory (unless lent)."""
    if pool is not None:
        t = pool.take(shape, TORCH_DTYPES[np.dtype(dtype)], pin)
        if zeroed:
            t.numpy().fill(0)
        return t
    if pin:
        make = torch.zeros if zeroed else torch.empty
        return make(shape, dtype=TORCH_DTYPES[np.dtype(dtype)], pin_memory=True)
    # fresh pages come zeroed from the OS (calloc): np.zeros costs no fill pass there
    return torch.from_numpy(np.zeros(shape, dtype) if zeroed else np.empty(shape, dtype))


def _allocate(capacity: int, pinned: bool) -> torch.Tensor:
    """A uint8 buffer: page-locked by torch when pinned; otherwise from numpy, the allocator a
    call without a pool uses for its outputs (huge pages on large arrays where the kernel allows
    them), so pooled and fresh tensors differ only in being reused."""
    if pinned:
        return torch.empty(capacity, dtype=torch.uint8, pin_memory=True)
    return torch.from_numpy(np.empty(capacity, np.uint8))
