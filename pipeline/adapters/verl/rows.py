"""New TransferQueue trajectory keys -> one Arrow table of the core's trajectory input schema.

Which fields are read decides the mirror's cost (one `kv_batch_get` per poll for the fields every
new key needs -- `rm_scores` and `extra_fields` together in `rewards` mode --, whose cost grows
with every trajectory and field read; docs/performance.md has the figures): `decisions` reads only
what a rule
needs (`rm_scores` for metric `reward`, `extra_fields` for a named metric or when the tags carry
no versions), `rewards` also every reward for the lake, `full` also the token payload. Token
columns not read stay empty lists (the core's payload is then provenance only: verl's trainer
reads the tokens from TransferQueue by key, never from us), and the response length goes to the
core on its own (`n_response_tokens`): verl's agent loop tags every trajectory with it
(`response_len`), so it costs no read; a key whose tag lacks it has its `responses` field read.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from pipeline.adapters.verl import fields as vf
from pipeline.errors import IngestError, MissingMetricError
from pipeline.ingest import STEP_LIMIT, STEP_RULE
from pipeline.state.constants import constant, empty_lists
from schemas import TRAJECTORIES_INPUT, Problem

_TOKENS = (("prompt_ids", "prompts", pa.int32()), ("response_ids", "responses", pa.int32()),
           ("response_mask", "response_mask", pa.int8()),
           ("rollout_log_probs", "rollout_log_probs", pa.float32()))


def trajectory_rows(tq: Any, partition: str, todo: Sequence[tuple[str, tuple[str, int, int], int]],
                    tags: Sequence[dict], fields: str, filter_metric: str | None
                    ) -> tuple[pa.Table | None, list[int], list[int]]:
    """``todo``: (key, (uid, session, index), dispatch step) per new trajectory key, ``tags``
    their TransferQueue tags. Returns (rows of the readable keys, their indices into ``todo``,
    indices of keys without data in storage yet). Raises MissingMetricError when metric `reward`
    is filtered on and a trajectory has no `rm_scores` (verl raises a bare KeyError there), and
    an IngestError for values no row can hold (weight versions out of range, a filter metric
    `float()` refuses, token values their column's type cannot hold), whose problems' rows are
    indices into ``todo``, so the caller can take out just those trajectories' groups."""
    keys = [k for k, _, _ in todo]
    need_rm = fields != "decisions" or filter_metric == "reward"
    need_extra = fields != "decisions" or filter_metric not in (None, "reward")
    # each tag's versions, read once (`_table` keeps them); plain ints, the usual tag, need no
    # further look
    lo = [t.get("min_global_steps") for t in tags]
    hi = [t.get("max_global_steps") for t in tags]
    if need_extra:
        extra_at = list(range(len(keys)))
    else:
        extra_at = [i for i, (a, b) in enumerate(zip(lo, hi))
                    if not (type(a) is int and type(b) is int) and not vf.has_tag_versions(tags[i])]
    extra_rows: list[Any] = [None] * len(keys)
    if need_rm and len(extra_at) == len(keys):     # both fields of every key: one read
        got = vf.read_fields(tq, partition, keys, ["rm_scores", "extra_fields"])
        rm_rows, extra_rows = got["rm_scores"], got["extra_fields"]
    else:
        rm_rows = (vf.read_fields(tq, partition, keys, ["rm_scores"])["rm_scores"] if need_rm
                   else [None] * len(keys))
        if extra_at:
            got = vf.read_fields(tq, partition, [keys[i] for i in extra_at], ["extra_fields"])
            for j, i in enumerate(extra_at):
                extra_rows[i] = got["extra_fields"][j]
    tokens = vf.read_fields(tq, partition, keys, [src for _, src, _ in _TOKENS]) \
        if fields == "full" else {}
    lengths, read_responses = (None, False) if tokens else _lengths(tq, partition, keys, tags)
    late = [i for i in range(len(keys)) if rm_rows[i] is vf.NOT_READY
            or extra_rows[i] is vf.NOT_READY or any(tokens[f][i] is vf.NOT_READY for f in tokens)
            or (read_responses and lengths[i] is vf.NOT_READY)
            ] if need_rm or extra_at or tokens or read_responses else []   # (nothing read: none)
    late_set = set(late)
    keep = [i for i in range(len(keys)) if i not in late_set] if late else list(range(len(keys)))
    if filter_metric == "reward":
        missing = [keys[i] for i in keep if rm_rows[i] is vf.MISSING]
        if missing:
            raise MissingMetricError(
                f"{len(missing)} trajectory key(s) of partition {partition!r} have no 'rm_scores' "
                f"field, which filter_groups_metric='reward' needs: groups "
                f"{sorted({todo[keys.index(k)][1][0] for k in missing})[:5]}, keys {missing[:5]}")
    if not keep:
        return None, [], late
    all_kept = len(keep) == len(keys)
    return _table(partition, todo, tags, keep, rm_rows, extra_rows, tokens, filter_metric,
                  lo if all_kept else [lo[i] for i in keep],
                  hi if all_kept else [hi[i] for i in keep],
                  None if lengths is None else lengths if all_kept else [lengths[i] for i in keep]
                  ), keep, late


def _lengths(tq: Any, partition: str, keys: list[str], tags: Sequence[dict]
             ) -> tuple[list[int | None], bool]:
    """The response length of each key read without its tokens (None: not known; NOT_READY:
    no data yet), and whether the `responses` field was read: verl's agent loop tags every
    trajectory with its length (`response_len`, the length of its `responses`); a key whose tag
    lacks it (another writer) has its `responses` field read instead (those keys alone)."""
    out = [t.get("response_len") for t in tags]
    odd = [i for i, v in enumerate(out) if type(v) is not int or v < 0]   # the usual: none
    untagged = []
    for i in odd:
        out[i] = vf.response_length(out[i])          # a numpy int, say
        if out[i] is None:
            untagged.append(i)
    if untagged:
        got = vf.read_fields(tq, partition, [keys[i] for i in untagged], ["responses"])
        for j, i in enumerate(untagged):
            row = got["responses"][j]
            out[i] = row if row is vf.NOT_READY else vf.response_length(row)
    return out, bool(untagged)


def _table(partition: str, todo: Sequence, tags: Sequence[dict], keep: list[int],
           rm_rows: list, extra_rows: list, tokens: dict[str, list],
           filter_metric: str | None, lo: list | None = None,
           hi: list | None = None, lengths: list | None = None) -> pa.Table:
    """``lo`` / ``hi``: the kept keys' version tags as listed, if already read (a new list
    each: changed here); ``lengths``: the kept keys' response lengths where their tokens are
    not read (None: the tokens are; an unknown length is None and counts the tokens sent, 0)."""
    # column by column, locals only: this runs once per new trajectory
    n = len(keep)
    parsed = [todo[i][1] for i in keep]
    uid, session, index = ([p[j] for p in parsed] for j in range(3))
    kept_tags = tags if n == len(tags) else [tags[i] for i in keep]
    if lo is None or hi is None:
        lo = [t.get("min_global_steps") for t in kept_tags]
        hi = [t.get("max_global_steps") for t in kept_tags]
    extras = [None if extra_rows[i] is None else vf.extra_of(extra_rows[i]) for i in keep]
    inferred = [False] * n
    for j in [j for j in range(n) if type(lo[j]) is not int or type(hi[j]) is not int]:
        lo[j], hi[j], inferred[j] = vf.versions_of(kept_tags[j], extras[j], todo[keep[j]][2])
    bad_rm: list[Problem] = []
    if rm_rows.count(None) == len(rm_rows):       # not read (`decisions` without metric reward)
        reward = None
    else:
        reward = []
        reward_of = vf.reward_of
        for i in keep:
            rm = rm_rows[i]
            try:
                r = None if rm is None else reward_of(rm)
            except TypeError as exc:       # no reward can be read from it: its group is refused
                r = None
                bad_rm.append(Problem("rm_scores", (i,), f"key {todo[i][0]!r}: {exc}; write a "
                                      "1-D float tensor, as verl's reward loop does"))
            reward.append(r)                  # None: not written yet (the lake says null)
    info = None if extras.count(None) == n else \
        [None if e is None else vf.reward_info_of(e) for e in extras]
    padding = [bool(t.get("is_padding", False)) for t in kept_tags]
    problems = _version_problems(keep, lo, hi) + bad_rm
    if filter_metric not in (None, "reward"):
        problems += _metric_problems(todo, keep, extra_rows, filter_metric)
    if problems:           # before pyarrow sees the versions
        raise IngestError(f"verl trajectories of partition {partition!r}", problems)
    # a column every row shares (the rewards not read: null, not known; no padding, ...) is a
    # remembered one
    cols = {"uid": uid, "session_id": session, "index": index, "min_global_steps": lo,
            "max_global_steps": hi, "reward": reward, "reward_info": info,
            "is_padding": padding, "versions_inferred": inferred, "n_response_tokens": lengths}
    data: dict[str, pa.Array] = {
        f.name: _column(cols[f.name], f.type, n) for f in TRAJECTORIES_INPUT if f.name in cols}
    data["partition"] = constant(partition, n, pa.string())
    for name, src, typ in _TOKENS:
        required = name in ("prompt_ids", "response_ids")
        if src in tokens:
            rows = [tokens[src][i] for i in keep]
            try:
                data[name] = vf.token_lists(rows, typ, null_as_empty=required)
            except (pa.ArrowInvalid, OverflowError, TypeError, ValueError):
                problems.append(_token_problem(name, src, typ, rows, keep))
        elif required:
            data[name] = empty_lists(n, typ)
    if problems:
        raise IngestError(f"verl trajectories of partition {partition!r}", problems)
    return pa.table({f.name: data[f.name] if f.name in data else pa.nulls(n, f.type)
                     for f in TRAJECTORIES_INPUT}, schema=TRAJECTORIES_INPUT)


def _column(values: list | None, typ: pa.DataType, n: int) -> pa.Array:
    """``values`` as a column of ``typ`` (None: null in every row); one value in every row of a
    bool column is a remembered column (`constant`). Floats are converted as they are: 0.0 and
    -0.0 are equal, and a remembered column would make one the other."""
    if values is None:
        return constant(None, n, typ)
    if n and typ == pa.bool_() and values.count(values[0]) == n and type(values[0]) is bool:
        return constant(values[0], n, typ)
    return pa.array(values, type=typ)


def _version_problems(keep: list[int], lo: list, hi: list) -> list[Problem]:
    """Weight versions outside the steps ingest takes (one past int64 would otherwise fail
    inside pyarrow with no key named); rows are indices into the caller's ``todo``."""
    if lo and min(lo) >= 0 and min(hi) >= 0 and max(lo) < STEP_LIMIT and max(hi) < STEP_LIMIT:
        return []                   # the usual put: four C loops, not a Python one
    bad = tuple(i for i, a, b in zip(keep, lo, hi)
                if not (0 <= a < STEP_LIMIT and 0 <= b < STEP_LIMIT))
    return [Problem("min_global_steps/max_global_steps", bad, STEP_RULE)] if bad else []


def _metric_problems(todo: Sequence, keep: list[int], extra_rows: list,
                     metric: str) -> list[Problem]:
    """Trajectories whose filter metric is present but not a value `float()` takes (verl would
    crash in float() on it): named with the value, never reported as a missing metric."""
    out = []
    for i in keep:
        bad, value = vf.unreadable_metric(vf.extra_of(extra_rows[i]), metric)
        if bad:
            out.append(Problem("reward_extra_info", (i,), (
                f"metric {metric!r} of key {todo[i][0]!r} is {_short(value)}, which float() "
                "does not take: write a number (or a numeric string) for it")))
    return out


def _token_problem(name: str, src: str, typ: pa.DataType, rows: list, keep: list[int]) -> Problem:
    """The trajectories whose `src` tensor holds values `typ` cannot hold (found one by one:
    only after the whole column failed to convert)."""
    bad = []
    for j, r in enumerate(rows):
        try:
            vf.token_lists([r], typ)
        except (pa.ArrowInvalid, OverflowError, TypeError, ValueError):
            bad.append(keep[j])
    return Problem(name, tuple(bad), f"TransferQueue field {src!r} holds values a {typ} column "
                                     "cannot hold")


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
