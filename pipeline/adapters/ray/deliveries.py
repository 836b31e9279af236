"""Waiting calls a caller gave up on (Ctrl-C while its `sample` waited in the actor), and the
batch such a call chose after all.

In process, Ctrl-C stops a waiting `sample` at once, and one interrupted after it chose its batch
keeps the batch for the caller's retry (the next `sample` of that partition at the same step
returns it). Over Ray the trainer's Ctrl-C stops only its own wait for the reply: the call goes on
in the actor. So the client names each waiting call with a token and, when interrupted, tells the
actor it gave up (`abandon`). Then:

- a call not yet answered stops before its next poll (it chose nothing; a call not started yet
  never starts);
- a call that chose its batch before it noticed keeps the batch here, and the next `sample` of
  that partition at the same step and batch size returns it, unless the call named a request and
  this one names another or none (that request's retry gets the batch from the buffer); another
  step: a warning, and the batch stays held, as in process;
- a call whose answer was already sent is reported as ``"replied"``: the client reads the batch
  from that answer for its next `sample`.

A `sample` of a partition waits until the abandoned calls of that partition ended, so that one
that is about to choose cannot choose beside it.
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("replaylake")
REPLIES_KEPT = 1024          # tokens of answered calls remembered for a late `abandon`


class Abandoned(Exception):
    """Stops a call inside the actor once its caller gave up on it (never leaves the actor)."""


@dataclass(frozen=True)
class Kept:
    """A batch chosen by a `sample` whose caller had given up on it."""

    step: int
    batch_id: int
    wire: Any                 # the batch as `sample` answers it
    request: Any = None       # the request the call named (None: none)


def _partition(kwargs: dict[str, Any]) -> Any:
    """The partition a call names (``partition``, else the ``partition_id`` alias)."""
    p = kwargs.get("partition")
    return p if p is not None else kwargs.get("partition_id")


class Deliveries:
    """The actor's record of its waiting calls (see the module doc)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._running: dict[str, Any] = {}              # token -> partition of a call under way
        self._abandoned: set[str] = set()                # tokens given up on, not ended yet
        self._replied: OrderedDict[str, None] = OrderedDict()   # tokens answered, newest last
        self._kept: dict[Any, Kept] = {}                 # partition -> batch nobody received

    def abandon(self, token: str) -> str:
        """The caller gave up on call ``token``: ``"replied"`` when its answer was already
        sent, else ``"abandoned"`` (it stops, or keeps the batch it chose)."""
        with self._cond:
            if token in self._replied:
                del self._replied[token]
                return "replied"
            self._abandoned.add(token)
            return "abandoned"

    def check(self, token: str) -> None:
        """Before every poll of call ``token``: stop it if its caller gave up."""
        with self._cond:
            if token in self._abandoned:
                raise Abandoned(token)

    def run(self, token: str, kwargs: dict[str, Any], call: Callable[[], Any],
            claim: Callable[[Kept], bool] | None = None) -> Any:
        """``call()`` as waiting call ``token`` of ``kwargs``' partition. With ``claim`` (a
        `sample`): the batch kept for this partition is answered instead when ``claim(kept)``
        says it is this call's, and a batch chosen after the caller gave up is kept."""
        partition = _partition(kwargs)
        with self._cond:
            self._cond.wait_for(lambda: not self._ending(partition), _seconds(kwargs))
            if token in self._abandoned:
                self._abandoned.discard(token)
                raise Abandoned(token)
            kept = self._kept.pop(partition, None) if claim is not None else None
            if kept is not None and claim(kept):
                self._answered(token)
                return kept.wire
            self._running[token] = partition
        try:
            result = call()
        except Abandoned:
            self._end(token, answered=False)
            raise
        except BaseException:
            self._end(token, answered=True)
            raise
        return self._deliver(token, partition, result, keep=claim is not None,
                             request=kwargs.get("request"))

    def _ending(self, partition: Any) -> bool:
        return any(t in self._abandoned and p == partition for t, p in self._running.items())

    def _end(self, token: str, answered: bool) -> None:
        with self._cond:
            self._running.pop(token, None)
            self._abandoned.discard(token)
            if answered:
                self._answered(token)
            self._cond.notify_all()

    def _deliver(self, token: str, partition: Any, result: Any, keep: bool,
                 request: Any = None) -> Any:
        with self._cond:
            self._running.pop(token, None)
            self._cond.notify_all()
            if token in self._abandoned:
                self._abandoned.discard(token)
                if keep:
                    meta = result[1]
                    self._kept[partition] = Kept(meta["step"], meta["batch_id"], result,
                                                 request)
                raise Abandoned(token)
            self._answered(token)
            return result

    def _answered(self, token: str) -> None:
        self._replied[token] = None
        while len(self._replied) > REPLIES_KEPT:
            self._replied.popitem(last=False)


def _seconds(kwargs: dict[str, Any]) -> float | None:
    """The call's timeout as a wait (None: none, or one the buffer will refuse)."""
    t = kwargs.get("timeout")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or t != t:
        return None
    return max(float(t), 0.0)


def warn_left_held(kept: Kept, step: Any, partition: Any) -> None:
    """A kept batch that the next `sample` of its partition does not take (another step)."""
    log.warning("sample(step=%s, %s): batch %d, chosen at step %d by a sample whose caller was "
                "interrupted before it received it, stays held (held_batches lists it; release "
                "it or train on it)", step, partition, kept.batch_id, kept.step)
