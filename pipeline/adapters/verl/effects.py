"""The core -> TransferQueue side of a partition mirror (a mixin of `PartitionMirror`): the keys
an eviction or a selection lets go, the batches selections form, and the `kv_clear` calls that
carry those effects to TransferQueue, made at once or deferred to the background thread
(verl_background.py) and made by `flush`."""
from __future__ import annotations

from typing import Any

from pipeline.adapters.verl.keys import TRAJ, clear
from pipeline.errors import InvariantError


class MirrorEffects:
    """State it reads and writes is the mirror's own (see `PartitionMirror.__init__`)."""

    tq: Any
    partition: str
    kind: dict[str, str]
    by_uid: dict[str, list[str]]
    order: dict[str, int]
    waiting: dict[str, tuple[str, int, int]]
    watch: dict[str, str]
    batches: dict[int, list[str]]
    deferred: list[str]
    epoch: int

    def clear_keys(self, keys: list[str], defer: bool = False) -> None:
        """kv_clear (never with an empty list); afterwards no listing taken before counts as
        current (the epoch moves on once the clear has returned). ``defer``: only note the keys;
        `flush` clears them (the background thread right after the call, or the next listing
        before it lists), and until then no listing counts as current either."""
        if not keys:
            return
        if defer:
            self.deferred.extend(keys)
        else:
            clear(self.tq, self.partition, keys)
        self.epoch += 1

    def flush(self) -> int:
        """Make the deferred clears (in the order they were deferred); returns how many keys.
        If TransferQueue refuses, every key stays owed and the error propagates."""
        if not self.deferred:
            return 0
        keys, self.deferred = self.deferred, []
        try:
            clear(self.tq, self.partition, keys)
        except Exception:
            self.deferred[:0] = keys
            raise
        self.epoch += 1
        return len(keys)

    # --- core -> TransferQueue (called from the core's listener, under its lock) --------------
    def on_remove(self, uids: list[str]) -> list[str]:
        """Evicted / discarded groups: their prompt key and every trajectory key (verl's set)."""
        keys = list(uids)
        for u in uids:
            self.kind.pop(u, None)
            self.watch.pop(u, None)
            for k in self.by_uid.pop(u, ()):
                keys.append(k)
                self.kind.pop(k, None)
                self.order.pop(k, None)
                self.waiting.pop(k, None)
        return keys

    def on_select(self, uids: list[str], batch_id: int) -> list[str]:
        """Selected groups: only their prompt keys go; their trajectory keys form the batch."""
        traj = [k for u in uids for k in self.by_uid.get(u, ()) if self.kind.get(k) == TRAJ]
        traj.sort(key=self.order.__getitem__)
        self.batches[batch_id] = traj
        for u in uids:
            self.kind.pop(u, None)
            self.watch.pop(u, None)
        return traj

    def batch_keys(self, batch_id: int, expected_rows: int) -> list[str]:
        keys = self.batches.get(batch_id, [])
        if len(keys) != expected_rows:
            raise InvariantError(f"batch {batch_id}: {len(keys)} TransferQueue keys for "
                                 f"{expected_rows} trajectories")
        return keys
