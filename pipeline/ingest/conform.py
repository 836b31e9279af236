"""Ingest validation: conform producer input to schemas/ and check every ingest rule (see the README's
"Ingest rules").

A call is accepted or rejected *whole*: every problem of every row is collected, and if there is
any, an IngestError listing them all is raised before anything reaches the lake or the live
buffer. (All-or-nothing keeps a producer's retry simple: fix the batch and send it again.)
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.errors import IngestError, UnknownGroupError
from pipeline.ingest.groups import UNKNOWN_GROUP, group_problems
from pipeline.ingest.retries import split_repeats
from schemas import GROUPS_INPUT, STATUS_INPUT, TRAJECTORIES_INPUT, Problem, conform
from schemas.conform import rows_where
from schemas.conform_fast import plain_lists
from schemas.tables import N_RESPONSE_TOKENS

STATUSES = ("pending", "running", "finished", "failure")
# Every step and weight version is below this (4611686018427387904): spans, staleness and group
# spans are differences of two steps plus one, which then always fit in a signed 64-bit integer,
# so the live buffer (numpy, whose int64 wraps on overflow) and DuckDB over the lake (which refuses)
# compute the same values; the token-weighted sums are computed in 128 bits by both.
STEP_LIMIT = 2**62
STEP_RULE = "must be an integer >= 0 and < 2**62 (4611686018427387904)"
# a removed group whose rows left memory is only known to be gone (see `PartitionState.lookup`)
_GONE = {"retired": "gone (trained and released, evicted, discarded or retired)"}
_RANK = {"pending": 0, "running": 1, "finished": 2, "failure": 2}
_SAFE_PARTITION = re.compile(r"[A-Za-z0-9_.\-]+")
PARTITION_MAX = 200     # characters: a directory name (`partition=<id>`) fits any file system
_VALID: set[str] = set()   # partition ids already found usable (a run has a handful)


def partition_problem(pid: object) -> str | None:
    """Why a partition id is unusable (it becomes a directory name in the lake), or None."""
    if type(pid) is str and pid in _VALID:
        return None
    if not isinstance(pid, str) or not pid:
        return "partition id must be a non-empty string"
    if len(pid) > PARTITION_MAX:
        return (f"partition id {pid[:20]!r}... is {len(pid)} characters long: at most "
                f"{PARTITION_MAX} (it names a directory in the lake)")
    if pid in (".", "..") or not _SAFE_PARTITION.fullmatch(pid):
        return (f"partition id {pid!r} is not safe as a path component: use letters, digits, "
                "'-', '_' and '.' only (not '.' or '..')")
    if len(_VALID) < 4096:
        _VALID.add(pid)
    return None


def check_partition(pid: object) -> str:
    """Raise IngestError for an unusable partition id; return it."""
    why = partition_problem(pid)
    if why:
        raise IngestError("partition id", [Problem("partition", (), why)])
    return pid  # type: ignore[return-value]


def _conformed(what: str, data: Any, schema: pa.Schema, defaults: Mapping[str, Any]) -> pa.Table:
    table, problems = conform(data, schema, defaults)
    if problems:
        raise IngestError(what, problems)
    return table


def _raise(what: str, problems: list[Problem]) -> None:
    if problems:
        unknown = all(p.kind == UNKNOWN_GROUP for p in problems)
        raise (UnknownGroupError if unknown else IngestError)(what, problems)


def _empty_uid_problems(uids: list) -> list[Problem]:
    empty = tuple(i for i, u in enumerate(uids) if not u)   # conformed: never null
    return [Problem("uid", empty, "uid must be a non-empty string")] if empty else []


def _columns(what: str, data: Any, schema: pa.Schema) -> tuple[int, dict[str, list | None]]:
    """``data`` conformed to ``schema`` as python lists, one per column (None: null in every
    row): a dict of plain python lists is checked as it is, anything else goes through the
    general conform and is read back."""
    fast = plain_lists(data, schema, None)
    if fast is not None:
        return fast
    table = _conformed(what, data, schema, {})
    n = table.num_rows
    return n, {f.name: None if 0 < n == table.column(f.name).null_count else
               table.column(f.name).to_pylist() for f in schema}


def validate_groups(data: Any, lookup: Callable[[str, str], Any]
                    ) -> tuple[int, dict[str, list | None]]:
    """Registrations of new prompt groups (status pending); ``lookup(partition, uid)`` -> group.
    Returns the rows as python lists, one per column of the groups input (None: all null)."""
    n, cols = _columns("group registration", data, GROUPS_INPUT)
    partitions, uids = cols["partition"], cols["uid"]
    problems = _partition_list_problems(partitions) + _empty_uid_problems(uids)
    # a python min over ~64 values: between polls the caches are cold, and a numpy compare costs
    # there many times what it does warm
    steps = cols["global_steps"]
    if min(steps, default=0) < 0 or max(steps, default=0) >= STEP_LIMIT:
        problems.append(Problem("global_steps", tuple(
            i for i, v in enumerate(steps) if not 0 <= v < STEP_LIMIT), STEP_RULE))
    if cols["n"] is not None:                  # the shorthand without n: all null
        bad_n = tuple(i for i, v in enumerate(cols["n"]) if v is not None and v < 1)
        if bad_n:
            problems.append(Problem("n", bad_n, "expected session count must be >= 1"))
    if cols["dataset"] is not None:
        empty = tuple(i for i, d in enumerate(cols["dataset"]) if d == "")
        if empty:
            problems.append(Problem("dataset", empty, "dataset must be a non-empty name or null"))
    pairs = list(zip(partitions, uids))
    dup = []
    if len(set(pairs)) != len(pairs):          # a uid twice: every later row of it
        seen: set[tuple[str, str]] = set()
        for i, pu in enumerate(pairs):
            if pu in seen:
                dup.append(i)
            seen.add(pu)
    known = [i for i, (p, u) in enumerate(pairs) if lookup(p, u) is not None]
    if dup:
        problems.append(Problem("uid", tuple(dup), "registered twice in this call"))
    if known:
        problems.append(Problem("uid", tuple(known),
                                "already registered in this partition (uids must be unique)"))
    _raise("group registration", problems)
    return n, cols


def validate_status(data: Any, lookup: Callable[[str, str], Any]
                    ) -> tuple[int, dict[str, list | None]]:
    """Status transitions: forward only (pending -> running -> finished | failure); terminal is
    final. `finished` with a known session count n needs a trajectory for every session 0..n-1.
    Returns the rows as python lists, one per column of the status input."""
    n, cols = _columns("status update", data, STATUS_INPUT)
    partitions = cols["partition"]
    problems = _partition_list_problems(partitions)
    sim: dict[tuple[str, str], tuple[str, int]] = {}    # moved by this call: (status, row)
    for i, (p, u, s) in enumerate(zip(partitions, cols["uid"], cols["status"])):
        if s not in STATUSES:
            problems.append(Problem("status", (i,), f"unknown status {s!r}; use one of {STATUSES}"))
            continue
        g = lookup(p, u)
        if g is None or g.removed:
            why = "never registered" if g is None else \
                f"already {_GONE.get(g.removed, g.removed)}: it takes no more status changes"
            problems.append(Problem("uid", (i,), f"unknown group {u!r} in partition {p!r} "
                                                 f"({why})", UNKNOWN_GROUP))
            continue
        cur, by = sim.get((p, u), (g.status, None))
        if _RANK[s] <= _RANK[cur]:
            now = f"is {cur}" if by is None else \
                f"is {g.status}, and row {by} of this call moves it to {cur!r}"
            problems.append(Problem("status", (i,), f"group {u!r} {now}; {s!r} would not move "
                                                    "it forward (pending -> running -> "
                                                    "finished | failure)"))
            continue
        if s == "finished" and g.n is not None and len(g.sessions) < g.n:
            problems.append(Problem("status", (i,), (
                f"group {u!r} expects n={g.n} sessions but has trajectories for "
                f"{len(g.sessions)}: send the rest first, or mark it 'failure'")))
            continue
        sim[(p, u)] = (s, i)
    _raise("status update", problems)
    return n, cols


def metric_values(table: pa.Table, metric: str | None) -> pa.Array | None:
    """Each trajectory's value of the filter metric (`reward` or a named reward metric)."""
    if metric is None:
        return None
    if metric == "reward":
        return table.column("reward").combine_chunks()
    col = table.column("reward_info").combine_chunks()
    return pc.map_lookup(col, pa.scalar(metric), "first").cast(pa.float64())


def validate_trajectories(data: Any, lookup: Callable[[str, str], Any],
                          filter_metric: str | None,
                          stored: Callable[[str, str], pa.Table]) -> tuple[pa.Table, int]:
    """Trajectories for groups that are registered and still in flight (pending or running):
    the rows to store, and how many rows of the call were stored identically before (a retry's,
    taken out; see pipeline/ingest/retries.py). ``stored(partition, uid)``: a group's stored rows.

    Runs on every `put`, so it reads each column once: the four key columns as python lists
    (the group checks walk them anyway, and the partition and empty-uid checks reuse them), the
    versions and rewards as python lists too (numpy masks only once something is wrong, to name
    the rows), list lengths from their offsets."""
    table = _conformed("trajectories", data, TRAJECTORIES_INPUT,
                       {"index": 0, "is_padding": False, "versions_inferred": False})
    keys = [table.column(c).to_pylist() for c in ("partition", "uid", "session_id", "index")]
    problems = _partition_list_problems(keys[0]) + _empty_uid_problems(keys[1])
    if _numbers_may_be_bad(table, keys):
        mn, mx = _np(table, "min_global_steps"), _np(table, "max_global_steps")
        session, index = _np(table, "session_id"), _np(table, "index")
        reward_nan = pc.fill_null(pc.is_nan(_one_chunk(table, "reward")), False).to_numpy(
            zero_copy_only=False)        # a null reward (not known) is no NaN
        for name, mask, msg in (
            ("min_global_steps", (mn < 0) | (mn >= STEP_LIMIT), STEP_RULE),
            ("max_global_steps", (mx < 0) | (mx >= STEP_LIMIT), STEP_RULE),
            ("min_global_steps", mn > mx, "min_global_steps > max_global_steps"),
            ("session_id", session < 0, "must be >= 0"),
            ("index", index < 0, "must be >= 0"),
            ("reward", reward_nan, "reward is NaN (send null for a reward not known)"),
        ):
            if mask.any():
                problems.append(Problem(name, tuple(np.flatnonzero(mask).tolist()), msg))
    values = metric_values(table, filter_metric)
    if filter_metric == "reward" and values.null_count:
        problems.append(Problem("reward", rows_where(values.is_null()),
                                "reward is null (not known), and the zero-variance filter on "
                                "'reward' needs one: send the reward sum"))
    if values is not None and filter_metric != "reward":
        nan = pc.is_nan(values)
        if pc.any(nan).as_py():
            problems.append(Problem("reward_info", rows_where(nan),
                                    f"reward metric {filter_metric!r} is NaN (the zero-variance "
                                    "filter needs a number)"))
    problems += _seconds_problems(table)
    held = _list_lengths(table, "response_ids")
    n_resp, stated = _response_length(table, held)
    problems += stated + _length_problems(table, held, n_resp) + _token_problems(table)
    # the response length, stored so lake queries never read the token payload for it (a
    # retry's rows are compared with it, as the stored rows hold it)
    at = table.schema.get_field_index(N_RESPONSE_TOKENS.name)
    table = table.set_column(at, N_RESPONSE_TOKENS, [pa.array(n_resp.astype(np.int64))])
    group, repeats = group_problems(keys, lookup)
    problems += group
    identical: list[int] = []
    if repeats:                     # only on a key collision: the usual put compares nothing
        identical, conflicts = split_repeats(table, repeats, stored)
        problems += conflicts
    _raise("trajectories", problems)
    if identical:
        keep = np.ones(table.num_rows, dtype=bool)
        keep[identical] = False
        table = table.filter(pa.array(keep))
    return table, len(identical)


def _seconds_problems(table: pa.Table) -> list[Problem]:
    """`generation_s`, where given, is a finite number of seconds >= 0 (null: not recorded)."""
    col = table.column("generation_s")
    if col.null_count == table.num_rows:          # the usual put: not recorded
        return []
    bad = pc.invert(pc.fill_null(pc.and_(pc.is_finite(col), pc.greater_equal(col, 0.0)), True))
    if not pc.any(bad).as_py():
        return []
    return [Problem("generation_s", rows_where(bad), "must be a finite number of seconds >= 0 "
                    "(or null: not recorded)")]


def _numbers_may_be_bad(table: pa.Table, keys: list[list]) -> bool:
    """False when no session, index or version is negative, no version reaches STEP_LIMIT, no
    min above its max and no reward NaN; True may be a false alarm (e.g. +inf and -inf
    rewards), which the masks then clear.

    Python over the (non-null, conformed) columns: between two polls the caches are cold, and
    there a put's eight numpy calls cost about twice these lists."""
    lo = table.column("min_global_steps").to_pylist()
    hi = table.column("max_global_steps").to_pylist()
    col = table.column("reward")
    rewards = col.to_pylist()
    return (min(keys[2], default=0) < 0 or min(keys[3], default=0) < 0
            or min(lo, default=0) < 0 or max(hi, default=0) >= STEP_LIMIT
            or (lo != hi and any(a > b for a, b in zip(lo, hi)))
            or math.isnan(sum(rewards) if not col.null_count else   # null: not known
                          sum(r for r in rewards if r is not None)))


def _partition_list_problems(partitions: list) -> list[Problem]:
    """Unusable partition ids of a column read as a python list: each bad id once, in order of
    first appearance, with every row naming it."""
    out = []
    for pid in dict.fromkeys(partitions):
        why = partition_problem(pid)
        if why:
            out.append(Problem("partition", tuple(i for i, q in enumerate(partitions) if q == pid),
                               why))
    return out


def one_array(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    """A column as one array: its only chunk as it is (conformed and gathered tables have one:
    no concatenation then), the chunks combined otherwise."""
    if isinstance(col, pa.Array):
        return col
    return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()


def _one_chunk(table: pa.Table, name: str) -> pa.Array:
    return one_array(table.column(name))


def _np(table: pa.Table, name: str) -> np.ndarray:
    return _one_chunk(table, name).to_numpy(zero_copy_only=False)


def _list_lengths(table: pa.Table, name: str) -> np.ndarray:
    """Lengths of a list column straight from its offsets (null rows: -1)."""
    col = _one_chunk(table, name)
    offsets = col.offsets.to_numpy()
    n = offsets[1:] - offsets[:-1]
    if col.null_count:
        n = np.where(np.asarray(col.is_valid()), n, -1)
    return n


# what a token list's items must be: (column, whether some item is out of range, told by one
# reduction over the items; which items are, elementwise; why). A null item is refused in every
# one of them (a trainer's tensor has no place for it).
_TOKEN_ITEMS: tuple[tuple[str, Callable[[np.ndarray], bool], Callable[[np.ndarray], np.ndarray],
                          str], ...] = (
    ("prompt_ids", lambda v: v.min() < 0, lambda v: v < 0, "token ids must be >= 0"),
    ("response_ids", lambda v: v.min() < 0, lambda v: v < 0, "token ids must be >= 0"),
    # int8 read as uint8: a negative value is above 127, so one maximum tells both ends
    ("response_mask", lambda v: v.view(np.uint8).max() > 1, lambda v: (v != 0) & (v != 1),
     "mask values must be 0 or 1"),
    # NaN is the maximum of anything that holds one, and `NaN <= 0` is false
    ("rollout_log_probs", lambda v: not v.max() <= 0, lambda v: ~(v <= 0),
     "a log-probability must be a number <= 0 (NaN and positive values are not)"),
)


def _token_problems(table: pa.Table) -> list[Problem]:
    """Items of the token lists: none null, ids >= 0, masks 0 or 1, log-probs <= 0 (what the
    trainer's tensors take as they are). Each column is judged by the null count and one
    reduction over its list's item buffer (a few microseconds on every put); only when that
    finds something are its own items tested one by one, to name the rows."""
    out = []
    for name, any_bad, bad_items, why in _TOKEN_ITEMS:
        col = _one_chunk(table, name)
        if col.null_count == len(col):
            continue                  # all null (unknown)
        items = col.values            # every item, and any a slice of the array left out
        if not len(items):
            continue
        if items.null_count:
            exact = col.flatten()     # this array's own items
            rows = _item_rows(col, np.asarray(exact.is_null()))
            if rows:
                out.append(Problem(name, rows, "holds a null item inside its list: every item "
                                               "must be a number"))
                continue
            items = exact.drop_null()
            if not len(items):
                continue
        if not any_bad(items.to_numpy(zero_copy_only=False)):
            continue
        v = col.flatten().to_numpy(zero_copy_only=False)
        rows = _item_rows(col, bad_items(v)) if len(v) else ()
        if rows:
            out.append(Problem(name, rows, why))
    return out


def _item_rows(col: pa.Array, bad: np.ndarray) -> tuple[int, ...]:
    """The rows of a list column holding an item where ``bad`` (one flag per flattened item)."""
    parents = np.asarray(pc.list_parent_indices(col))
    return tuple(np.unique(parents[bad]).tolist())


def _response_length(table: pa.Table, held: np.ndarray) -> tuple[np.ndarray, list[Problem]]:
    """Each row's response length: the count a producer sent without its tokens
    (`n_response_tokens`), else the length of `response_ids` (``held``); and the problems of the
    counts sent (below 0, or beside tokens of another length)."""
    col = _one_chunk(table, N_RESPONSE_TOKENS.name)
    if col.null_count == len(col):
        return held, []               # the usual put: the tokens say it
    if col.null_count == 0:
        stated = col.to_numpy()
        if not len(stated) or (stated.min() >= 0 and held.max() <= 0):
            return stated, []         # counts alone, every one sent (the verl adapter's put)
        given = np.ones(len(stated), dtype=bool)
    else:
        stated = col.fill_null(-1).to_numpy(zero_copy_only=False)
        given = np.asarray(col.is_valid())
    out = []
    if (given & (stated < 0)).any():
        out.append(Problem(N_RESPONSE_TOKENS.name,
                           tuple(np.flatnonzero(given & (stated < 0)).tolist()),
                           "must be >= 0 (or null: the length of response_ids)"))
    other = given & (held > 0) & (stated != held)
    if other.any():
        out.append(Problem(N_RESPONSE_TOKENS.name, tuple(np.flatnonzero(other).tolist()),
                           "differs from the length of response_ids: send the tokens, or their "
                           "count with response_ids empty"))
    return np.where(given & (stated >= 0), stated, held), out


def _length_problems(table: pa.Table, held: np.ndarray, n_resp: np.ndarray) -> list[Problem]:
    """Per-token columns must match the response tokens sent (``held``); version spans must
    cover the response length ``n_resp`` (the count sent without the tokens, where one was)."""
    out = []
    for name in ("response_mask", "rollout_log_probs"):
        if table.column(name).null_count == table.num_rows:
            continue                  # all null (unknown): no length to compare
        n = _list_lengths(table, name)
        if (n == held).all():
            continue
        bad = (n >= 0) & (n != held)
        if bad.any():
            out.append(Problem(name, tuple(np.flatnonzero(bad).tolist()),
                               "length differs from response_ids"))
    spans = _one_chunk(table, "version_spans")
    if spans.null_count < len(spans):
        flat = pc.list_flatten(spans)
        parents = pc.list_parent_indices(spans)
        if flat.null_count or flat.field("version").null_count or \
                flat.field("n_tokens").null_count:      # nothing else can be read of such spans
            missing = pc.or_(pc.or_(pc.is_null(flat), pc.is_null(pc.struct_field(flat, "version"))),
                             pc.is_null(pc.struct_field(flat, "n_tokens")))
            return out + [Problem("version_spans", _item_rows(spans, np.asarray(missing)),
                                  "holds a null span (or a span with a null version or "
                                  "n_tokens): every span is a (version, n_tokens) pair of "
                                  "numbers")]
        tok = np.bincount(np.asarray(parents), weights=flat.field("n_tokens").to_numpy(),
                          minlength=len(spans)).astype(np.int64)
        has = np.asarray(pc.is_valid(spans))
        bad_len = has & (tok != n_resp)
        if bad_len.any():
            out.append(Problem("version_spans", tuple(np.flatnonzero(bad_len).tolist()),
                               "n_tokens do not add up to the response length"))
        ver = flat.field("version").to_numpy()
        lo = np.asarray(table.column("min_global_steps"))[np.asarray(parents)]
        hi = np.asarray(table.column("max_global_steps"))[np.asarray(parents)]
        outside = np.unique(np.asarray(parents)[(ver < lo) | (ver > hi)])
        if outside.size:
            out.append(Problem("version_spans", tuple(outside.tolist()),
                               "a version lies outside [min_global_steps, max_global_steps]"))
        neg = np.unique(np.asarray(parents)[flat.field("n_tokens").to_numpy() < 0])
        if neg.size:
            out.append(Problem("version_spans", tuple(neg.tolist()), "n_tokens must be >= 0"))
    return out
