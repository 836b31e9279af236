"""The typed error tree: every error replaylake raises on purpose derives from ReplayLakeError."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path


class ReplayLakeError(Exception):
    """Base class of every error replaylake raises on purpose."""


class ConfigError(ReplayLakeError, ValueError):
    """A configuration value is invalid; raised at construction, naming the parameter."""


class PresetKeywordError(ReplayLakeError, TypeError):
    """An unknown keyword to a preset constructor (a TypeError, as Python raises for any unknown
    keyword), naming the method the user called and the closest known keyword."""


class IngestError(ReplayLakeError, ValueError):
    """Input rejected whole: carries every problem found (column, rows, what is wrong).

    Nothing of the rejected call reached the buffer or the lake.
    """

    def __init__(self, what: str, problems: Iterable[object]):
        self.what = what
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(
            f"{what} rejected ({len(self.problems)} problem(s); nothing was accepted):\n{lines}")

    def __reduce__(self):   # picklable (Ray, multiprocessing) with its problems
        return type(self), (self.what, self.problems)


class UnknownGroupError(IngestError):
    """A trajectory or status names a group the buffer never registered, or one already removed."""


class BufferFullError(ReplayLakeError, RuntimeError):
    """`put` would take the live payload past the buffer's `max_live_bytes` (back-pressure): the
    producer should wait for the trainer to sample and release, or pass `put(..., timeout=s)`."""


class SampleTimeout(ReplayLakeError, TimeoutError):
    """`sample` waited longer than its timeout; carries the group counts per status."""

    def __init__(self, message: str, counts: Mapping[str, int]):
        self.message = message
        self.counts = dict(counts)
        super().__init__(f"{message}; groups by status: {self.counts}")

    def __reduce__(self):   # picklable (Ray, multiprocessing) with its counts
        return type(self), (self.message, self.counts)


class RefillLimitError(ReplayLakeError, RuntimeError):
    """Refilling cannot (or may no longer) fill the batch: stop instead of looping forever."""


class MissingMetricError(ReplayLakeError, ValueError, RuntimeError):
    """Finished groups lack the reward metric the zero-variance filter needs (also a RuntimeError,
    which is what verl raises here)."""


class EmptyBatchError(ReplayLakeError, RuntimeError):
    """The selected groups hold no trajectory at all (sync, non-validation)."""


class InvariantError(ReplayLakeError, AssertionError):
    """An internal invariant broke: a bug in replaylake, never the user's input."""


class _KeyErrorMessage(KeyError):
    """A KeyError whose message prints as written (a bare KeyError prints its repr, in quotes)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class UnknownBatchError(ReplayLakeError, _KeyErrorMessage):
    """`release` of a batch this buffer does not hold (never sampled, or already released)."""


class BufferUnavailableError(ReplayLakeError, ConnectionError):
    """The buffer's Ray actor did not answer within the client's retry wait: it died and was not
    restarted (no restarts left, or its node is gone), or its restart is still restoring."""


class UnknownMetricError(ReplayLakeError, _KeyErrorMessage):
    """A metric key that is not declared, or a mean merged without its weight."""


class PoolError(ReplayLakeError, ValueError):
    """A tensor given back to a TensorPool that it did not hand out, or that was already given
    back; or a pool built with a bad limit."""


class LakeError(ReplayLakeError, OSError):
    """The lake directory cannot be opened or written."""


class LakeDamageError(LakeError):
    """A lake file is damaged (not merely torn at its tail): names the file and byte offset."""

    def __reduce__(self):
        return type(self), (self.path, self.offset, self.problem)

    def __init__(self, path: Path, offset: int, problem: str):
        self.path, self.offset, self.problem = Path(path), offset, problem
        super().__init__(f"lake file {self.path} is damaged at byte {offset}: {problem}. Only a "
                         "torn tail is ignored; run `replaylake lake check --lake <lake>` to list "
                         "the damage and `replaylake lake salvage --lake <lake>` to set it aside")
