"""Refills the buffer actor owes to producers that pull them (``refill="pull"``), kept across a
restart of the actor's process.

The buffer asks for new prompts from inside `sample` (its ``refill_fn``); with ``"pull"`` that
call only records the count, and a producer loop takes it (`RayReplayBuffer.take_refills`) and
registers that many prompts. The buffer writes a `refill` row for every ask and, once restored,
counts every ask of the lake as served: it waits for those prompts' groups. So a count asked
but not yet taken must outlive the process, or a `sample` waiting for it waits forever.

What is known after a restart: the lake holds every ask (its `refill` rows, less the
`refill_failed` ones, which served nothing); what the producers took is written, before the
count leaves the actor, to a small ledger in the lake directory (`_ray_refills.json`: the asks
the lake held when the actor was started, which that actor does not owe, and the prompts
taken since). The restarted actor owes the difference. The ledger also keeps the last counts
handed out by token, so that a `take_refills` sent again after the actor died under it gets the
count the lost attempt took instead of a second one.
"""
from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.errors import LakeError
from pipeline.lake import read_table, replace_durably

LEDGER_NAME = "_ray_refills.json"
TOKENS_KEPT = 64            # takes remembered by token, for the retry of a lost reply
_ASKS = pa.array(["refill", "refill_failed"])


def asked_in_lake(lake: str | os.PathLike) -> int:
    """Prompts the lake's asks served: the counts of its `refill` rows less those of its
    `refill_failed` rows (an ask that failed served nothing; the next ask repeats it)."""
    rows = read_table(lake, "decisions", columns=["seq", "kind", "count"],
                      keep=lambda seg: pc.is_in(seg.column("kind"), _ASKS))
    kinds, counts = rows.column("kind").to_pylist(), rows.column("count").to_pylist()
    return sum(c if k == "refill" else -c for k, c in zip(kinds, counts))


class RefillLedger:
    """The ledger file of one lake (see the module doc)."""

    def __init__(self, lake: str | os.PathLike, fsync: bool):
        self.path = Path(lake) / LEDGER_NAME
        self.fsync = fsync
        self.before = 0          # asks the lake held when the actor was started
        self.taken = 0           # prompts handed out since

    def start(self, asked: int) -> None:
        """A new actor: it owes none of the asks the lake already holds."""
        self.before, self.taken = asked, 0
        self.write({})

    def restart(self, asked: int) -> tuple[int, dict[str, int]]:
        """A restarted actor: (prompts it still owes, the counts the last takes handed out by
        token). A missing or unreadable ledger knows nothing: the actor then starts afresh."""
        try:
            saved = json.loads(self.path.read_text())
            self.before, self.taken = int(saved["before"]), int(saved["taken"])
            given = {str(k): int(v) for k, v in saved["given"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            self.start(asked)
            return 0, {}
        return max(asked - self.before - self.taken, 0), given

    def write(self, given: dict[str, int]) -> None:
        """Record ``taken`` and the counts handed out by token, whole (a crash leaves the old
        ledger or the new one)."""
        tmp = self.path.with_name(f".{LEDGER_NAME}.tmp")
        try:
            tmp.write_text(json.dumps({"before": self.before, "taken": self.taken,
                                       "given": given}))
            if self.fsync:
                replace_durably(tmp, self.path)
            else:
                os.replace(tmp, self.path)
        except OSError as exc:
            raise LakeError(f"cannot write the pull-refill ledger {self.path}: {exc}; the count "
                            "was not handed out (it stays owed)") from exc


class RefillRequests:
    """Refills owed to the producers, for drivers that pull them (``refill="pull"``).

    The buffer calls this from inside `sample` with the number of new prompts it needs; the count
    is recorded and `sample` goes on waiting. A producer loop calls `take()` (through the client's
    `take_refills`) and registers that many new prompts, which is what lets `sample` finish.
    With a ledger (a lake), every count handed out is recorded in it first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owed = 0
        self._given: OrderedDict[str, int] = OrderedDict()   # token -> count it was handed
        self.ledger: RefillLedger | None = None

    def __call__(self, count: int) -> None:
        with self._lock:
            self._owed += int(count)

    def keep_in(self, ledger: RefillLedger, asked: int, restarted: bool) -> None:
        """Record takes in ``ledger`` from now on; after a restart, owe again what the lake
        asked since the actor was started and no producer took."""
        with self._lock:
            self.ledger = ledger
            if not restarted:
                ledger.start(asked)
                return
            owed, given = ledger.restart(asked)
            self._owed += owed
            self._given = OrderedDict(given)

    def take(self, token: str | None = None) -> int:
        """The count owed, handed out once (0 when none); a ``token`` seen before gets the count
        it was handed then (its reply was lost)."""
        with self._lock:
            if token is not None and token in self._given:
                return self._given[token]
            owed = self._owed
            if not owed:
                return 0
            if token is not None:
                self._given[token] = owed
                while len(self._given) > TOKENS_KEPT:
                    self._given.popitem(last=False)
            if self.ledger is not None:
                self.ledger.taken += owed
                try:
                    self.ledger.write(dict(self._given))
                except BaseException:
                    self.ledger.taken -= owed
                    self._given.pop(token, None)
                    raise
            self._owed = 0
            return owed
