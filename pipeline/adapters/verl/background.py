"""The verl adapter's thread: it makes the `kv_clear` calls a call leaves behind, and with the
option `mirror_max_lag` it also keeps every partition mirror current between the trainer's calls,
so that `sample` need not list TransferQueue itself.

Clears leave the call, in either mode. The `kv_clear` of the selected groups' prompt keys and of
evicted or discarded groups' keys is deferred: the call notes the keys and returns, and the
thread clears them at once (woken by the call; it waits for the adapter's lock, so for the call
to end). Until that clear has returned, no listing counts as current, and a call that must list
(every call without the option, a later poll of a `wait`) makes the owed clears itself before it
lists, so no listing ever shows a key the mirror has already let go. `flush()` and `close()`
make every owed clear; `retire` makes its own before it returns. What a caller sees: right after
`sample` returns, TransferQueue may still list the selected prompt keys for the few milliseconds
the clear takes (the trajectory keys of the batch are the trainer's to clear, as always); verl's
buffer makes that clear inside `sample`, where the trainer waits for it.

Without `mirror_max_lag` that is all the thread does: every poll lists the whole partition and
takes in what changed, inside `sample` (verl does the same listing). With it, the thread also
lists every ``max_lag / 2`` seconds and right after each clear it makes, and the *first* poll of
a call uses the thread's view when it is fresh enough; later polls of the same call (a `wait`
strategy or a refill waiting for data) always list, as without the option.

What "fresh enough" means, exactly (`usable`): the listing behind the mirror's state began at
most ``max_lag`` seconds ago, and nothing changed TransferQueue on the adapter's side since that
listing began (no `kv_clear` of an eviction, a selection or an orphan, made or still owed, no
newer listing applied by a call). A batch therefore reflects TransferQueue as it was at most
``max_lag`` seconds before the call: a group that finished within that window may wait for the
next call.

Consistency. Every mirror carries an `epoch`, bumped under the adapter's lock by every listing
applied and by every clear, made or deferred. The thread reads the epoch (under the lock)
before it lists, lists without the lock (a call is never held up by a listing), and applies the
listing only if the epoch is unchanged; otherwise it drops it. So a listing that may predate one
of the adapter's own clears, or that is older than one already applied, is never applied. The
thread makes owed clears under the lock, so a call never lists while one is in flight.

Errors. A listing that fails (TransferQueue not up yet, or shut down) is skipped, and so is an
owed clear that fails (the keys stay owed: the next call makes them before it lists, and raises
if TransferQueue still refuses). A listing whose data the core rejects is not applied (nothing
is half-taken: the mirror rolls back as it does inside a call); the mirror is then marked stale,
so the next call lists by itself and raises the same error to its caller, where it belongs. Each
distinct message is logged once.

Cost. The thread takes the adapter's lock only to apply a listing or make a clear, and a listing
costs what it costs inside a call; it grows with the partition's keys, and the thread lists about
twice per `max_lag`, so a large partition with a short lag keeps a good part of a core busy
(docs/performance.md has the figures; TransferQueue's controller process works besides).
Arrival order of terminal statuses (the tie-break among groups of one dispatch step) then
follows the thread's polls rather than the calls', so it depends on timing; without the option
it depends only on what each call's listing holds.
"""
from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Any

from pipeline.errors import ConfigError

log = logging.getLogger("replaylake.verl")


def check_max_lag(value: Any) -> float | None:
    """`mirror_max_lag`: None (off) or a positive number of seconds."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
            or value == float("inf"):
        raise ConfigError(f"mirror_max_lag={value!r} must be None (every call lists "
                          "TransferQueue itself) or a positive, finite number of seconds")
    return float(value)


def usable(mirror: Any, max_lag: float | None, now: float | None = None) -> bool:
    """May a call's first poll use the mirror's state as it is, without listing?"""
    if max_lag is None or mirror.listed_at is None or mirror.epoch != mirror.fresh_epoch:
        return False
    return (time.monotonic() if now is None else now) - mirror.listed_at <= max_lag


class BackgroundMirror:
    """One daemon thread per adapter instance; it holds the adapter weakly and ends when the
    adapter is closed or garbage-collected (then, or at exit, the clears still owed are made).

    ``lock`` is the adapter's, the one that makes its calls one at a time: the thread takes it
    to apply a listing or make a clear, never to list. Of the adapter itself it uses only
    `partition_mirrors()` and `core`, and holds it weakly: the core's listener holds the adapter,
    so a strong reference from a running thread would keep both alive for good."""

    def __init__(self, adapter: Any, lock: Any, max_lag: float | None,
                 owed: list | None = None):
        self.max_lag = max_lag
        self._lock = lock
        self.polls = 0                 # listings applied by the thread (for tests and logs)
        self.cleared = 0               # keys the thread cleared for the calls
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._logged: set[str] = set()
        ref = weakref.ref(adapter)
        self._thread = threading.Thread(target=self._run, args=(ref,), daemon=True,
                                        name="replaylake-verl-mirror")
        # an adapter collected (or left open at exit) without close(): stop the thread, then
        # make the clears the last call left behind (its prompt keys would stay in
        # TransferQueue for good); ``owed``, each partition's `OwedClears`, holds nothing that
        # holds the adapter (a finalizer's argument that did would keep it alive for good)
        weakref.finalize(adapter, self._last_clears, [] if owed is None else owed)
        self._thread.start()

    def wake(self) -> None:
        """A call deferred clears: make them now, then list again."""
        self._wake.set()

    def _halt(self) -> None:
        self._stop.set()
        self._wake.set()

    def _last_clears(self, owed: list, timeout: float = 5.0) -> None:
        """The adapter is gone without close(): halt the thread and make the clears still owed,
        as close() would (an error is logged: nobody is left to raise it to). Made by a helper
        thread waited for ``timeout`` seconds at most: a TransferQueue already gone at exit
        never holds the process."""
        self._halt()
        if not any(o.keys for o in owed):
            return                              # the usual end: nothing owed
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
        helper = threading.Thread(target=self._clear_owed, args=(owed, timeout), daemon=True,
                                  name="replaylake-verl-last-clears")
        helper.start()
        helper.join(timeout)

    def _clear_owed(self, owed: list, timeout: float) -> None:
        if not self._lock.acquire(timeout=timeout):
            log.warning("verl adapter collected without close(): its lock stayed held, so the "
                        "clears its last call owed were not made")
            return
        try:
            for o in list(owed):
                try:
                    self.cleared += o.flush()
                except Exception as exc:  # noqa: BLE001 - no caller is left to raise it to
                    log.warning("verl adapter collected without close(): clearing the keys "
                                "partition %r still owed failed: %s", o.partition, exc)
        finally:
            self._lock.release()

    def stop(self, timeout: float = 5.0) -> None:
        self._halt()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self, ref: Any) -> None:
        period = None if self.max_lag is None else self.max_lag / 2
        while True:
            self._wake.wait(period)
            self._wake.clear()
            if self._stop.is_set():
                return
            adapter = ref()
            if adapter is None:
                return
            try:
                self._poll_all(adapter)
            finally:
                del adapter

    def _poll_all(self, adapter: Any) -> None:
        for m in adapter.partition_mirrors():
            if self._stop.is_set():
                return
            with self._lock:
                try:
                    self.cleared += m.flush()
                except Exception as exc:  # noqa: BLE001 - still owed: the next call makes them
                    self._log_once(logging.WARNING, f"clearing deferred keys of {m.partition!r} "
                                   f"failed: {exc} (they stay owed; the next call retries)")
                    continue
                epoch = m.epoch
            if self.max_lag is None:
                continue              # clears only: every call lists for itself
            began = time.monotonic()
            try:
                listing = m.list_keys()
            except Exception as exc:  # noqa: BLE001 - TransferQueue down: try next period
                self._log_once(logging.DEBUG, f"listing {m.partition!r} failed: {exc}")
                continue
            with self._lock:
                if m.epoch != epoch or self._stop.is_set():
                    continue          # the adapter changed TransferQueue or listed since
                try:
                    m.apply(listing, began)
                    adapter.core.prepare(m.partition)   # the new groups' aggregates, off the call
                except Exception as exc:  # noqa: BLE001 - the next call lists and raises it
                    m.mark_stale()
                    self._log_once(logging.WARNING,
                                   f"partition {m.partition!r}: {type(exc).__name__}: {exc} "
                                   "(the next call lists TransferQueue itself and raises it)")
                    continue
                self.polls += 1

    def _log_once(self, level: int, message: str) -> None:
        if message not in self._logged:
            self._logged.add(message)
            log.log(level, "verl adapter background mirror: %s", message)
