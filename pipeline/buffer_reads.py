"""The buffer's read-only queries (a mixin of `ReplayBuffer`): counts, lookups, held batches, the
candidate table and the depth query. None of them changes a group's fate."""
from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from pipeline.arguments import partition_arg, step_arg
from pipeline.decide import aggregates
from pipeline.decide import evaluate as decide
from pipeline.state import GroupView, candidates, view

if TYPE_CHECKING:
    from pipeline.config import BufferConfig
    from pipeline.lake import LakeWriter
    from pipeline.state import BufferState

_STATUSES = ("pending", "running", "finished", "failure", "sampled")


class BufferReads:
    """Read-only queries over the buffer's state (``self._state``, ``self.config``)."""

    _state: BufferState
    config: BufferConfig

    def get_sampleable_count(self, global_steps: int, partition: str | None = None, *,
                             partition_id: str | None = None) -> int:
        """How many groups `sample` could hand out now; evicts, refills and removes nothing."""
        step_arg("get_sampleable_count", global_steps)
        p = partition_arg(partition, partition_id, "get_sampleable_count")
        with self._state.cond:
            part = self._state.parts.get(p)
            if part is None:
                return 0
            ev = decide.evaluate(part, self.config.rules_for(p), global_steps,
                                 self.config.filter_metric)
            return part.candidates.alive_count - ev.count

    def lookup(self, partition: str, uid: str) -> GroupView | None:
        """A frozen view of the group (uid, global_steps, n, status, removed, keys,
        prompt_id), a retired marker (``removed == 'retired'``: never accepted again), or None
        when never seen."""
        with self._state.cond:
            part = self._state.parts.get(partition)
            if part is None:
                return None
            return view(uid, part.groups.get(uid), uid in part.retired)

    def held_batches(self, partition: str) -> dict[int, list[tuple[str, int, int]]]:
        """Selected, unreleased batches: batch id -> its (uid, session_id, index) keys."""
        with self._state.cond:
            part = self._state.parts.get(partition)
            if part is None:
                return {}
            return {b: [(u, s, x) for u in uids for s, x in sorted(part.groups[u].keys)]
                    for b, uids in part.batches.items()}

    def sampleable_uids(self, partition: str) -> list[str]:
        """Every group the last poll left sampleable, oldest first (evicts nothing)."""
        with self._state.cond:
            part = self._state.parts.get(partition)
            return part.candidates.oldest(None) if part is not None else []

    def prepare(self, partition: str) -> None:
        """Compute now the aggregates of the groups that turned terminal since the last poll,
        which the next poll would compute first (a group's aggregates never change once it is
        terminal, so the poll then decides exactly as it would have). Decides nothing; for a
        thread that feeds the buffer between calls."""
        with self._state.cond:
            part = self._state.parts.get(partition)
            if part is not None:
                aggregates.complete(part)

    def candidates(self, partition: str) -> pa.Table:
        """The candidate table of a partition (schemas.CANDIDATES): every terminal group not yet
        sampled, evicted or discarded, with the aggregates the rules read, oldest first."""
        with self._state.cond:
            part = self._state.parts.get(partition)
            if part is None:
                return candidates.table([])
            aggregates.complete(part)
            alive = part.candidates.alive
            return candidates.table([alive[u] for u in part.candidates.oldest(None)])

    def counts(self, partition: str | None = None, *,
               partition_id: str | None = None) -> dict[str, int]:
        """Live groups of a partition per status (selected, unreleased groups: `sampled`)."""
        p = partition_arg(partition, partition_id, "counts")
        with self._state.cond:
            part = self._state.parts.get(p)
            return part.counts() if part else dict.fromkeys(_STATUSES, 0)

    def partitions(self) -> list[str]:
        with self._state.cond:
            return sorted(self._state.parts)

    @property
    def lake(self) -> LakeWriter | None:
        """The lake this buffer writes (its ``root`` and ``lock``), or None in memory only."""
        return self._state.journal.lake
