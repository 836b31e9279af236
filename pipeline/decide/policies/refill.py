"""Refill: how many replacement prompts to ask for after a poll, and when a call may finish.

`ReplaceEvicted` (async) asks for every evicted group at once; `RefillFailedWhileShort` (sync)
replaces evicted failures only while the batch is short; `DapoCredit` (sync DAPO, "bufferless")
earns credit per evicted group (each rule declares its credit: 2 for a filtered group, 1 for an
empty failure) and dispatches it into free in-flight slots, then drains in-flight groups and
discards the surplus (`may_finish` and `surplus`: the loop asks every policy, only DAPO says
more than "yes" and "none"). `NoRefill` is for buffers without `refill_fn` and for validation
partitions.

Lineage: every dispatch names, in `CallState.replaces`, the evicted groups it replaces (the
decision log's `replaces` column). Async and sync-failure refills replace exactly the groups the
poll evicted. DAPO spends credit units the way the cap counts them: failures' credit first, then
filtered groups', each oldest eviction first. So one refill may name evictions of several polls,
a filtered group (credit 2) is named by two refills when a dispatch boundary splits its credit,
and evictions whose credit is discarded when draining starts (or that earned none) are named by
no refill.

`max_num_gen_batches` (verl ignores it) caps the prompts asked to replace *filtered* groups (rules
with credit >= 2: zero variance, overlong) in one call at `max_num_gen_batches x train_batch_size`;
the call raises before it would ask for more, instead of refilling forever. 0 = unbounded. Prompts
that replace failures (async, or sync with `sync_refill_failed_groups`) are never counted: in sync
DAPO the credit failures earned is spent first, and only dispatches beyond it count.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

from pipeline.decide.policies.context import CallState, PollContext, PollOutcome
from pipeline.errors import RefillLimitError


class RefillPolicy(Protocol):
    """What the poll loop asks a refill policy; the loop never asks which policy it holds.

    ``name`` is what the lake records for the policy (a `refill` row's reason, the recorded
    configuration): declared, so renaming a class never changes what lands in the lake, and
    snake_case like the eviction reasons beside it. Lakes written before held the class names
    (`ReplaceEvicted`); `policy_name` reads those as today's names. ``about`` says in one line
    what the policy does, for a reader of the recorded configuration (the report). ``drains``
    says whether the policy ends a call by draining (told to the user's configuration, not read
    by the loop)."""

    name: ClassVar[str]
    about: ClassVar[str] = ""
    drains: bool

    def after_poll(self, o: PollOutcome, st: CallState, ctx: PollContext) -> int:
        """How many new prompts to ask for after this poll."""
        ...

    def may_finish(self, o: PollOutcome, st: CallState) -> bool:
        """Whether the call may hand out its batch now that enough groups are sampleable."""
        return True

    def surplus(self, chosen: Sequence[str], sampleable: Callable[[], Sequence[str]]
                ) -> list[str]:
        """The groups, besides the chosen batch, that the call discards; ``sampleable()`` lists
        every sampleable group oldest first (asked only by a policy that discards: it costs a
        sort of the candidates)."""
        return []


def _check_limit(max_num_gen_batches: int, train_batch_size: int, st: CallState,
                 dapo_wanted: int) -> None:
    limit = max_num_gen_batches * train_batch_size
    if not max_num_gen_batches or dapo_wanted == 0 or st.dapo_refilled + dapo_wanted <= limit:
        return
    seen = ", ".join(f"{n} {r}" for r, n in sorted(st.evicted.items()) if n)
    raise RefillLimitError(
        f"this sample call already asked for {st.dapo_refilled} prompts to replace filtered "
        f"groups and would need {dapo_wanted} more, past max_num_gen_batches x train_batch_size "
        f"= {limit}; groups evicted in this call: {seen or 'none'}. If most were zero_variance, "
        "the data may have no reward variance (every group all-correct or all-wrong): check the "
        "reward function or the dataset's difficulty, or raise max_num_gen_batches (0 = "
        "unbounded).")


@dataclass(frozen=True)
class NoRefill(RefillPolicy):
    """Evicted groups are not replaced."""

    name: ClassVar[str] = "no_refill"
    about: ClassVar[str] = "evicted groups are not replaced"
    drains: bool = False

    def after_poll(self, o: PollOutcome, st: CallState, ctx: PollContext) -> int:
        return 0


@dataclass(frozen=True)
class ReplaceEvicted(RefillPolicy):
    """Async: ask for k new prompts as soon as a poll evicted k groups (any reasons, once each).

    ``train_batch_size`` None: the call's batch size scales the `max_num_gen_batches` cap."""

    name: ClassVar[str] = "replace_evicted"
    about: ClassVar[str] = "every poll that evicts k groups asks refill_fn for k new prompts at once"
    max_num_gen_batches: int = 0
    train_batch_size: int | None = None
    drains: bool = False

    def after_poll(self, o: PollOutcome, st: CallState, ctx: PollContext) -> int:
        if o.evicted == 0:
            return 0
        _check_limit(self.max_num_gen_batches, self.train_batch_size or ctx.batch_size, st,
                     o.filtered)
        st.dapo_refilled += o.filtered
        st.replaces = list(o.uids)
        return o.evicted


@dataclass(frozen=True)
class RefillFailedWhileShort(RefillPolicy):
    """Sync with sync_refill_failed_groups and no filter: replace evicted empty failures while
    fewer than batch_size groups are sampleable; surplus stays buffered, in-flight is not awaited."""

    name: ClassVar[str] = "refill_failed_while_short"
    about: ClassVar[str] = "evicted failures are replaced while the batch is short"
    drains: bool = False

    def after_poll(self, o: PollOutcome, st: CallState, ctx: PollContext) -> int:
        if o.evicted == 0 or o.sampleable >= ctx.batch_size:
            return 0
        st.replaces = list(o.uids)
        return o.evicted


@dataclass(frozen=True)
class DapoCredit(RefillPolicy):
    """Sync DAPO: the evictions' credit, dispatched as
    `min(credit, max(0, max_inflight x train_batch_size - in_flight))` rounded down to a multiple
    of gen_batch_size. Once the batch is full, draining starts and never stops within the call:
    remaining credit is discarded, in-flight groups are awaited (and still filtered), then the
    oldest batch_size groups are taken and every other sampleable group is discarded."""

    name: ClassVar[str] = "dapo_credit"
    about: ClassVar[str] = (
        "DAPO: each eviction earns credit (2 for a filtered group, 1 for an empty failure), "
        "dispatched into free in-flight slots; once the batch is full, in-flight groups are "
        "awaited and the surplus is discarded")
    train_batch_size: int
    gen_batch_size: int
    max_inflight_gen_batches: int = 1
    max_num_gen_batches: int = 0
    drains: bool = True

    def may_finish(self, o: PollOutcome, st: CallState) -> bool:
        """Only once draining began and every in-flight group has landed (and was filtered)."""
        return st.draining and o.inflight == 0

    def surplus(self, chosen: Sequence[str], sampleable: Callable[[], Sequence[str]]
                ) -> list[str]:
        """Every sampleable group the batch did not take: a sync DAPO call leaves none behind."""
        taken = set(chosen)
        return [u for u in sampleable() if u not in taken]

    def after_poll(self, o: PollOutcome, st: CallState, ctx: PollContext) -> int:
        if not st.draining:
            st.credit += o.credit
            st.free_credit += o.free_credit
            st.owe(o.uids, o.credits)
            if o.sampleable >= ctx.batch_size:
                st.draining = True
                st.credit = st.free_credit = 0
                st.owed.clear()        # credit discarded: those evictions are never replaced
        if st.draining:
            if o.sampleable < ctx.batch_size and o.inflight == 0:
                raise RefillLimitError(
                    f"draining began with a full batch, but only {o.sampleable}/{ctx.batch_size} "
                    "groups are sampleable now and nothing is in flight (groups were removed "
                    "from outside the sample call); verl would poll forever here")
            return 0
        slots = self.max_inflight_gen_batches * self.train_batch_size - o.inflight
        dispatch = min(st.credit, max(0, slots))
        dispatch -= dispatch % self.gen_batch_size
        if dispatch > 0:
            # credit is one pool; what failures earned is dispatched first and never capped, so
            # only prompts beyond it replace filtered groups (verl itself has no cap)
            free = min(st.free_credit, dispatch)
            _check_limit(self.max_num_gen_batches, self.train_batch_size, st, dispatch - free)
            st.dapo_refilled += dispatch - free
            st.free_credit -= free
            st.credit -= dispatch
            st.replaces = st.take(dispatch)
            return dispatch
        if st.credit > 0 and o.inflight == 0:
            raise RefillLimitError(
                f"DAPO refill credit {st.credit} is below gen_batch_size={self.gen_batch_size} and "
                f"nothing is in flight, so the batch ({o.sampleable}/{ctx.batch_size} groups) can "
                "never fill (verl would sleep forever here). Use a gen_batch_size that divides the "
                "credit (e.g. 1), or a larger buffer of prompts per dispatch.")
        return 0


POLICIES: dict[str, type[RefillPolicy]] = {
    p.name: p for p in (NoRefill, ReplaceEvicted, RefillFailedWhileShort, DapoCredit)}
# the names lakes recorded before the declared names were snake_case
OLD_NAMES = {"NoRefill": NoRefill.name, "ReplaceEvicted": ReplaceEvicted.name,
             "RefillFailedWhileShort": RefillFailedWhileShort.name, "DapoCredit": DapoCredit.name}


def policy_name(recorded: str | None) -> str | None:
    """A refill name as a lake recorded it (a `refill` row's reason, the recorded configuration's
    policy), as the policy is named now: an older lake's `ReplaceEvicted` is `replace_evicted`.
    Any other name (a user's own policy) is returned as it is."""
    return None if recorded is None else OLD_NAMES.get(recorded, recorded)
