"""Changes to the buffer finish whole: a signal that would raise inside one is held until it ends.

Why: Ctrl-C in a notebook raises KeyboardInterrupt wherever the main thread happens to be, and so
does any Python signal handler that raises (a SIGTERM handler that raises SystemExit, for a
graceful shutdown). Raised between a call's write to the lake and its update of memory, it would
leave rows on disk that memory does not know (a retry would then be accepted as new: the same
trajectory twice), or half of a record in a stream that stays open (the lake would no longer open).
So every change (a `commit`, one poll of `sample`, a `reissue`, closing the lake) runs inside
`held()`: a SIGINT, SIGTERM or SIGHUP that arrives meanwhile is recorded and handed to the
handler the user had installed the moment the change is complete. Waiting (for a sampleable
batch, for room in the memory budget) is never held, so Ctrl-C still stops a waiting call at once.

How: the first `held()` of the main thread wraps the signal's current Python handler in one that
defers while a change is running and otherwise calls it straight through; installing a handler
costs about ten checks that ours is still in place, so a change pays the check only. A
handler the user installs later is wrapped the same way at the next change. Signals are handled in
the main thread only, so other threads need no holding. SIG_DFL and SIG_IGN are left as they are
(they never raise: a default SIGTERM ends the process, which the crash tests cover). The wrapper
stays installed (`signal.getsignal` returns it; its ``inner`` is your handler): restoring the
handler after every change would make each change pay two installs (figures in
docs/performance.md).
"""
from __future__ import annotations

import _signal
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

HELD_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP")
                     if hasattr(signal, name))

_depth = 0                                     # nesting of held() in the main thread
_pending: list[tuple[Callable[..., Any], int, FrameType | None]] = []


class _Deferring:
    """A signal handler that defers ``inner`` while a change is running."""

    def __init__(self, inner: Callable[..., Any]):
        self.inner = inner

    def __call__(self, signum: int, frame: FrameType | None) -> Any:
        if _depth:
            _pending.append((self.inner, signum, frame))
            return None
        return self.inner(signum, frame)


def _wrap() -> None:
    for sig in HELD_SIGNALS:
        # `_signal.getsignal`: `signal.getsignal` converts the answer to an enum, which for a
        # Python handler goes through a caught ValueError, a hundred times the raw lookup
        handler = _signal.getsignal(sig)
        if callable(handler) and not isinstance(handler, _Deferring):
            signal.signal(sig, _Deferring(handler))


class _Held:
    """The context manager `held` returns (one object: entering costs no allocation)."""

    def __enter__(self) -> None:
        global _depth
        if threading.current_thread() is not _MAIN:
            return
        if _depth == 0:
            _wrap()
        _depth += 1

    def __exit__(self, *exc: object) -> None:
        global _depth
        if threading.current_thread() is not _MAIN:
            return
        _depth -= 1
        if _depth == 0 and _pending:
            due = list(_pending)
            _pending.clear()
            for inner, signum, frame in due:
                inner(signum, frame)           # KeyboardInterrupt (or the user's) raises here


_MAIN = threading.main_thread()
_HELD = _Held()


def held() -> _Held:
    """Run a ``with`` block with SIGINT/SIGTERM/SIGHUP handlers deferred to its end (see the
    module doc). Nested blocks defer to the end of the outermost one. Outside the main thread:
    nothing to do."""
    return _HELD
