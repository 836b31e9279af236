"""What a refill policy sees of one poll: the call's fixed inputs and what the poll found."""
from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.partitions import is_validation


@dataclass(frozen=True)
class PollContext:
    """The fixed inputs of one `sample` call."""

    step: int
    partition: str
    batch_size: int

    @property
    def validation(self) -> bool:
        return is_validation(self.partition)


@dataclass(frozen=True)
class PollOutcome:
    """What one poll found, after its evictions were applied to the snapshot."""

    evicted: int                 # groups evicted (union of reasons)
    by_reason: dict[str, int]    # groups evicted per reason (a group may count under several)
    credit: int                  # DAPO refill credit the evictions earned (largest per group)
    filtered: int                # evicted groups with a filter reason (credit >= 2): DAPO refills
    sampleable: int              # groups left that sample could hand out
    inflight: int                # pending + running groups of the partition
    free_credit: int = 0         # part of `credit` earned by unfiltered evictions (failures):
    #                              refills max_num_gen_batches does not count (0: count them all)


@dataclass
class CallState:
    """Mutable state of one `sample` call, shared by the refill policy across its polls."""

    credit: int = 0
    refilled: int = 0            # refill prompts asked in this call (all reasons)
    dapo_refilled: int = 0       # of which replace filtered groups (what max_num_gen_batches caps)
    free_credit: int = 0         # sync DAPO credit owed to failures, not yet dispatched
    draining: bool = False
    evicted: dict[str, int] = field(default_factory=dict)   # groups evicted per reason
