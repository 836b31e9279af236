"""What a policy sees of one poll: the step, the partition, and what the poll found."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PollContext:
    """The fixed inputs of one `sample` call."""

    step: int
    partition: str
    batch_size: int

    @property
    def validation(self) -> bool:
        """Validation partitions (id exactly `val`) never evict, filter or refill."""
        return self.partition == "val"


@dataclass(frozen=True)
class PollOutcome:
    """What one poll found, after its evictions were applied to the snapshot."""

    evicted: int                 # groups evicted (union of reasons)
    by_reason: dict[str, int]    # groups evicted per reason (a group may count under several)
    empty_failures: int          # evicted failure groups with no trajectory
    sampleable: int              # groups left that sample could hand out
    inflight: int                # pending + running groups of the partition


@dataclass
class CallState:
    """Mutable state of one `sample` call, shared by the refill policy across its polls."""

    credit: int = 0
    refilled: int = 0            # refill prompts asked in this call (all reasons)
    dapo_refilled: int = 0       # of which caused by zero-variance filtering
    draining: bool = False
    filtered: int = 0            # zero-variance groups evicted in this call
    notes: list[str] = field(default_factory=list)
