"""What a refill policy sees of one poll: the call's fixed inputs and what the poll found."""
from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class PollContext:
    """The fixed inputs of one `sample` call."""

    step: int
    partition: str
    batch_size: int
    request: str | None = None    # the key the caller named the call with (`sample(request=)`)


@dataclass(frozen=True)
class PollOutcome:
    """What one poll found, after its evictions were applied to the snapshot."""

    evicted: int                 # groups evicted (union of reasons)
    by_reason: dict[str, int]    # groups evicted per reason (a group may count under several)
    credit: int                  # DAPO refill credit the evictions earned (largest per group)
    filtered: int                # evicted groups with a filter reason (credit >= 2): DAPO refills
    sampleable: int              # groups left that sample could hand out
    inflight: int                # pending + running groups of the partition
    uids: tuple[str, ...] = ()   # the evicted groups, oldest first (refill lineage)
    credits: tuple[int, ...] = ()   # the DAPO credit each of them earned
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
    owed: list[list] = field(default_factory=list)   # [uid, units left, filtered] to replace
    replaces: list[str] = field(default_factory=list)   # what the last dispatch replaces

    def copy(self) -> CallState:
        """A copy to ask a policy about without changing this call's state."""
        return replace(self, evicted=dict(self.evicted), owed=[list(e) for e in self.owed],
                       replaces=list(self.replaces))

    def owe(self, uids: tuple[str, ...], units: tuple[int, ...]) -> None:
        """Evictions whose credit a later dispatch spends (queued in eviction order)."""
        self.owed.extend([u, n, n >= 2] for u, n in zip(uids, units) if n > 0)

    def take(self, n: int) -> list[str]:
        """Spend ``n`` credit units as the refill cap counts them: failures' credit (< 2) first,
        then filtered groups', oldest eviction first within each. Returns the uids whose credit
        was wholly or partly spent; a group split over two dispatches is named by both."""
        out: list[str] = []
        for filtered in (False, True):
            for entry in self.owed:
                if n == 0:
                    break
                if entry[1] == 0 or entry[2] != filtered:
                    continue
                spent = min(n, entry[1])
                entry[1] -= spent
                n -= spent
                out.append(entry[0])
        self.owed = [e for e in self.owed if e[1] > 0]
        return out
