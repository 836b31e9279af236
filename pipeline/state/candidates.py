"""The per-partition index of terminal groups not yet removed: the access path every poll uses.

The rules are queries (sql/rules/); this index only decides which rows a poll hands them, like a
database index serving `WHERE` and `ORDER BY ... LIMIT`:
- a group turns terminal once and is then immutable, so its aggregates are computed once (the
  first poll after it turned terminal, together with every other such group, in one query);
- groups that turned terminal since the last committed poll are `fresh`: a rule without a horizon
  reads only a group's own aggregates and needs to see fresh groups only;
- a rule that fires as time passes declares a horizon: only groups dispatched before it can newly
  match, found by walking the front of a heap ordered by (global_steps, terminal seq);
- the k oldest groups come off the same heap in O(k log k);
- under a declared selection order (pipeline/decide/policies/order.py) a second heap holds each
  aggregated group once by `(key, term_seq, uid)`, its key computed with its aggregates (both are
  fixed once the group is terminal), and the k first groups come off that heap the same way.
So a poll costs O(fresh + newly matching + k log n), never O(buffer size).

What "oldest" means is declared once, by the ranking of sql/policies/select_oldest.sql (what the
lake runs): the heap's entries are key tuples of the columns that ranking orders by, in its order.
"""
from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence
from operator import itemgetter
from typing import TYPE_CHECKING, Any, NamedTuple

import pyarrow as pa

from pipeline.decide import compile as declared
from pipeline.errors import InvariantError
from schemas import CANDIDATES
from sql import loader
from sql.loader import SqlError

if TYPE_CHECKING:
    from pipeline.decide.policies import SelectionOrder

COLUMNS = tuple(CANDIDATES.names)
_TERM_SEQ = COLUMNS.index("term_seq")
_STATUS = COLUMNS.index("status")
_MAX_VERSION = COLUMNS.index("max_version")
SELECTION = "select_oldest"
# What the index knows of a group the moment it turns terminal (its aggregates come later).
_AT_TERMINAL = ("global_steps", "term_seq", "uid")


def heap_key(order: Sequence[str]) -> Callable[[int, int, str], tuple]:
    """The heap entry of a group as the key tuple of ``order``: `(gs, term_seq, uid) -> key`.

    The order must name exactly the dispatch step, the terminal seq and the uid, the step first:
    `before` prunes the heap by its first component against a horizon (a dispatch step), and an
    entry must carry the uid and seq to tell a group's current entry from one it left behind.
    That leaves two orders; each builds its tuple directly (`add` runs once per terminal group)."""
    order = tuple(order)
    if order == ("global_steps", "term_seq", "uid"):
        return lambda gs, term_seq, uid: (gs, term_seq, uid)
    if order == ("global_steps", "uid", "term_seq"):
        return lambda gs, term_seq, uid: (gs, uid, term_seq)
    raise SqlError(f"{SELECTION}: the candidate index orders by {', '.join(_AT_TERMINAL)} with "
                   f"global_steps first; the declaration ranks by {', '.join(order)}")


ORDER = declared.window_order(loader.load(SELECTION))
_key = heap_key(ORDER)
_ENTRY_SEQ, _ENTRY_UID = ORDER.index("term_seq"), ORDER.index("uid")   # within a heap entry
# Under the usual order (dispatch step, then terminal seq, which no two groups share) a heap
# entry is one int, the step above the seq's 64 bits, and the uid is looked up: popping from a
# heap of ints costs a third of popping tuples (a buffer of a million trajectories holds 250k
# entries, and every sample pops its batch off the front). Steps are below 2**62 and seqs below
# 2**63, so the packed ints order exactly as the tuples do.
_PACKED = ORDER == ("global_steps", "term_seq", "uid")
_SEQ_BITS = 64
_SEQ_MASK = (1 << _SEQ_BITS) - 1


class _At(NamedTuple):
    """How to read a heap's entries: each entry's uid and terminal seq (C-level callables, read
    in the hottest loops), and how a packed entry's uid is forgotten with it (None: nothing to)."""

    uid: Callable[[Any], str | None]
    seq: Callable[[Any], int]
    drop: Callable[..., Any] | None


_ENTRY_AT = _At(itemgetter(_ENTRY_UID), itemgetter(_ENTRY_SEQ), None)   # key tuples in ORDER
_RANKED_AT = _At(itemgetter(2), itemgetter(1), None)   # `(key, term_seq, uid)`, declared order


class _NaNLast:
    """A NaN order key as SQL orders it: after every number (DuckDB sorts NaN above +inf), equal
    only to itself, so two NaN keys fall through to the tie-breaks. A Python float NaN compares
    false both ways and would leave the heap's order undefined. (A spread of a group whose
    metric is infinite in every trajectory, inf - inf, is one.)"""

    __slots__ = ()

    def __lt__(self, other: object) -> bool:
        return False

    def __gt__(self, other: object) -> bool:
        return other is not self

    def __repr__(self) -> str:
        return "NaN"


NAN_LAST = _NaNLast()


def _ranked_key(key: Any) -> Any:
    return NAN_LAST if key != key else key       # only NaN differs from itself


class _Rows(dict):
    """uid -> candidate row. A dict subclass on purpose: CPython's collector stops tracking an
    exact dict whose keys and values hold no containers (our rows are tuples of scalars, which it
    untracks too), and every insert of a new row tracks it again in the youngest generation. Then
    the next young collection walks all of it, in most `sample` calls of a large buffer.
    A subclass is never untracked, so it ages into the oldest generation like any long-lived
    object and is walked only by the rare full collections."""

    __slots__ = ()


class CandidateIndex:
    """Alive terminal groups of one partition: rows (tuples in CANDIDATES order), the groups still
    awaiting their aggregates, a lazily-cleaned heap and the fresh list; under a declared
    ``order``, a second lazily-cleaned heap of the aggregated groups in that order."""

    def __init__(self, order: SelectionOrder | None = None) -> None:
        self.alive: dict[str, tuple] = _Rows()
        self.unaggregated: dict[str, tuple[int, int, str]] = {}   # uid -> (gs, term seq, status)
        self.fresh: list[str] = []
        self._heap: list = []           # key tuples in ORDER, or packed ints (`_PACKED`)
        self._uid_of: dict[int, str] = {}   # packed entry -> its group (`_PACKED` only)
        self.order = order
        self._ranked: list[tuple] = []  # (key, term_seq, uid) of aggregated groups (order only)

    @property
    def alive_count(self) -> int:
        return len(self.alive) + len(self.unaggregated)

    def count_of(self, uids: set[str]) -> int:
        """How many of ``uids`` are candidates (alive, aggregated or not). Walks ``uids`` only
        (`set.intersection` of a dict would walk the dict: a million candidates)."""
        alive, fresh = self.alive, self.unaggregated
        return sum(1 for u in uids if u in alive or u in fresh)

    def add(self, uid: str, gs: int, term_seq: int, status: str) -> None:
        """A group turned terminal; its aggregates come with the next `complete`."""
        self.unaggregated[uid] = (gs, term_seq, status)
        self.fresh.append(uid)
        if _PACKED:
            e = (gs << _SEQ_BITS) | term_seq
            self._uid_of[e] = uid
            heapq.heappush(self._heap, e)
        else:
            heapq.heappush(self._heap, _key(gs, term_seq, uid))

    def complete(self, rows: list[tuple], keys: list | None = None) -> None:
        """Store the candidate rows of unaggregated groups (their aggregates are now known);
        ``keys``: the declared order's key of each row when the caller computed them already."""
        for r in rows:
            uid = r[1]
            del self.unaggregated[uid]
            self.alive[uid] = r
        if not self.unaggregated:
            # a dict keeps the room of its deleted entries, and walking it walks them: after a
            # restore of a million groups, every later poll walked a million dead slots to find
            # its few new groups (0.5 ms a call). An empty one is replaced
            self.unaggregated = {}
        if self.order is not None and rows:
            for key, r in zip(self._keys(rows) if keys is None else keys, rows):
                heapq.heappush(self._ranked, (_ranked_key(key), r[_TERM_SEQ], r[1]))

    def _keys(self, rows: list[tuple]) -> list:
        """The declared order's key of each row: one evaluation over a frame of only the columns
        it reads."""
        return self.order.key.fn(columns(rows, self.order.reads)).tolist(len(rows))

    def remove(self, uids: list[str]) -> None:
        for u in uids:
            if self.alive.pop(u, None) is None:
                self.unaggregated.pop(u, None)     # or an in-flight group retired from outside
        self._heap = self._pruned(self._heap, self._entry_at())
        if self.order is not None:
            self._ranked = self._pruned(self._ranked, _RANKED_AT)

    def _entry_at(self) -> _At:
        """How to read an entry of `_heap`: packed (`_PACKED`) or a key tuple in ORDER."""
        if _PACKED:
            return _At(self._uid_of.get, _SEQ_MASK.__and__, self._uid_of.pop)
        return _ENTRY_AT

    def _pruned(self, h: list, at: _At) -> list:
        """``h`` without its dead front entries (selected/stale groups sit there: drop them now),
        rebuilt from its live entries once most of it is dead (amortised O(1) per group). A
        packed entry's uid leaves `_uid_of` with the entry (``at.drop``)."""
        alive, pop, uid_at, seq_at, drop = self.alive, heapq.heappop, at.uid, at.seq, at.drop
        while h:
            r = alive.get(uid_at(h[0]))      # `_live`, inlined for the common case
            if r is not None and r[_TERM_SEQ] == seq_at(h[0]) or \
                    r is None and self._live(h[0], at):
                break
            e = pop(h)
            if drop is not None:
                drop(e, None)
        if len(h) > 64 and len(h) > 2 * self.alive_count:
            kept = []
            for e in h:
                if self._live(e, at):
                    kept.append(e)
                elif drop is not None:
                    drop(e, None)
            h = kept
            heapq.heapify(h)
        return h

    def settle(self) -> None:
        """A committed poll examined every fresh group: from now on only horizons revisit them."""
        self.fresh = []

    def _live(self, e: Any, at: _At) -> bool:
        """Is heap entry ``e`` its group's current one (the group alive, terminal at that seq)?"""
        u = at.uid(e)
        r = self.alive.get(u)
        if r is not None:
            return r[_TERM_SEQ] == at.seq(e)
        p = self.unaggregated.get(u)
        return p is not None and p[1] == at.seq(e)

    def before(self, horizon: int) -> list[str]:
        """Alive groups with gs < horizon, by walking only the heap's front (no pops): the
        dispatch step leads every entry, so an entry is below the horizon exactly when it is
        below ``horizon << 64`` packed, or below the 1-tuple ``(horizon,)``."""
        out, h, stack = [], self._heap, [0] if self._heap else []
        at = self._entry_at()
        bound = horizon << _SEQ_BITS if _PACKED else (horizon,)
        while stack:
            i = stack.pop()
            if i < len(h) and h[i] < bound:
                if self._live(h[i], at):
                    out.append(at.uid(h[i]))
                stack.extend((2 * i + 1, 2 * i + 2))
        return out

    def to_examine(self, horizon: int | None) -> list[tuple]:
        """Rows of the fresh groups plus those a time-dependent rule may newly match, each once.
        Every unaggregated group must have been completed first."""
        uids = dict.fromkeys(u for u in self.fresh if u in self.alive)
        if horizon is not None:
            uids.update(dict.fromkeys(self.before(horizon)))
        return [self.alive[u] for u in uids]

    def oldest(self, k: int | None) -> list[str]:
        """The k oldest alive groups in the declared ORDER, oldest first; all of them if k is None."""
        return self._first(self._heap, k, self._entry_at())

    def first(self, k: int | None) -> list[str]:
        """The k groups a sample takes first, in the selection order (oldest first unless an
        order is declared); all of them if k is None. Every group must have been completed."""
        if self.order is None:
            return self.oldest(k)
        if self.unaggregated:     # a group without its key yet would be passed over silently
            raise InvariantError(f"selection_order={self.order.name!r}: {len(self.unaggregated)} "
                                 "group(s) are not aggregated yet; complete them before ranking")
        return self._first(self._ranked, k, _RANKED_AT)

    def _first(self, h: list, k: int | None, at: _At) -> list[str]:
        """The uids of the k smallest live entries of heap ``h`` (all, sorted, if k is None),
        walking only its front: O(k log k)."""
        if k is None:
            return [at.uid(e) for e in sorted(e for e in h if self._live(e, at))]
        out: list[str] = []
        # the hottest loop of a selection: names bound locally, the liveness test inlined (`_live`)
        alive, uid_at, seq_at = self.alive, at.uid, at.seq
        for e in _front(h) if k > 0 else ():
            u = uid_at(e)
            r = alive.get(u)
            if (r[_TERM_SEQ] == seq_at(e)) if r is not None else self._live(e, at):
                out.append(u)
                k -= 1
                if not k:
                    break
        return out

    def status(self, uid: str) -> str:
        return self.alive[uid][_STATUS]

    def newest_version(self, uids: list[str]) -> int | None:
        """The newest weight version any trajectory of these (aggregated) groups reports, padding
        rows included; None when none has a trajectory."""
        alive = self.alive
        return max((v for u in uids if (v := alive[u][_MAX_VERSION]) is not None), default=None)


def _front(h: list) -> Iterator[Any]:
    """The entries of heap ``h``, smallest first, found by walking only its front (a frontier of
    the nodes whose parents were taken; the children of node i sit at 2i+1 and 2i+2)."""
    front = [(h[0], 0)] if h else []
    pop, push, n = heapq.heappop, heapq.heappush, len(h)
    while front:
        entry, i = pop(front)
        yield entry
        j = 2 * i + 1
        if j < n:
            push(front, (h[j], j))
            if j + 1 < n:
                push(front, (h[j + 1], j + 1))


def columns(rows: list[tuple], names: Sequence[str] | None = None) -> dict[str, Any]:
    """Candidate rows as numpy columns of the CANDIDATES schema (`pipeline.decide.vectors.Col`,
    what the compiled rules read): only ``names`` of them if given."""
    from pipeline.decide import vectors
    return {c: vectors.from_list([r[_AT[c]] for r in rows], _TYPES[c])
            for c in (COLUMNS if names is None else names)}


_AT = {c: i for i, c in enumerate(COLUMNS)}
_TYPES = {f.name: f.type for f in CANDIDATES}


def table(rows: list[tuple]) -> pa.Table:
    """Candidate rows as an Arrow table of the CANDIDATES schema."""
    return pa.Table.from_pylist([dict(zip(COLUMNS, r)) for r in rows], schema=CANDIDATES)
