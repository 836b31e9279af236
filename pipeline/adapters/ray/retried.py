"""A call sent again after the buffer's actor died under it: what of it had already landed.

When the actor's process dies with a call in flight, the caller cannot tell whether the call was
written to the lake before the death (the restarted actor restored it) or not. The client sends
it again, marked as a retry, and the actor takes out what the lost attempt already did:

- `put` needs nothing here: an identical row already stored is a no-op in the buffer itself
  (`PutResult.already_stored`), a different row under the same key is still refused.
- `register`: a group already known in that partition exactly as the call registers it (same
  ``global_steps``, ``n``, ``prompt_id`` and ``dataset``), or already gone (it was registered,
  trained and released meanwhile), is the lost attempt's (a call is all-or-nothing, so it landed
  whole or not at all). A known group registered otherwise is another producer's: the retry is
  refused whole, naming what each side registered.
- `update_status`: a group already at that status, or past it (running once `finished` was
  asked, sampled, released), is the lost attempt's; one at a conflicting status (`failure`
  where `finished` was asked) is left in, and refused as on a first attempt.
- `release`: a batch no longer held was released by the lost attempt.

The rows are read exactly as the buffer reads them (every input it takes: rows, a dict of
columns, a pyarrow or polars table, the keyword shorthand with ``partition`` or its
``partition_id`` alias); a call the buffer would refuse as it stands is sent on whole, so the
retry is refused exactly as a first attempt is. Only retries take this path: a first attempt
that names a known group is refused as always.
"""
from __future__ import annotations

from typing import Any

import pyarrow as pa

from pipeline.arguments import dataset_list, partition_arg, prompt_id_list, uid_list
from pipeline.buffer import ReplayBuffer
from pipeline.errors import IngestError, ReplayLakeError
from pipeline.ingest.conform import partition_problem
from schemas import GROUPS_INPUT, STATUS_INPUT, Problem, conform

_PER_UID = ("prompt_ids", "dataset")     # shorthand keywords that hold one value per uid
_RANK = {"pending": 0, "running": 1, "finished": 2, "failure": 2, "sampled": 3}
_AS_REGISTERED = ("global_steps", "n", "prompt_id", "dataset")


def _shorthand_rows(kwargs: dict[str, Any], where: str) -> dict[str, list]:
    """The rows the buffer builds from the keyword shorthand (raises its error where it would)."""
    uids = uid_list(where, kwargs.get("uids"))
    partition = partition_arg(kwargs.get("partition"), kwargs.get("partition_id"), where,
                              check=False)
    k = len(uids)
    if where == "update_status":
        return {"partition": [partition] * k, "uid": uids, "status": [kwargs.get("status")] * k}
    data = {"partition": [partition] * k, "uid": uids,
            "global_steps": [kwargs.get("global_steps")] * k, "n": [kwargs.get("n")] * k}
    if kwargs.get("prompt_ids") is not None:
        data["prompt_id"] = prompt_id_list(where, kwargs["prompt_ids"], k)
    if kwargs.get("dataset") is not None:
        data["dataset"] = dataset_list(where, kwargs["dataset"], k)
    return data


def _rows(kwargs: dict[str, Any], schema: pa.Schema, where: str) -> pa.Table | None:
    """The call's rows as the buffer reads them, or None when the buffer refuses the call as it
    stands (it is then sent on whole, to be refused as a first attempt is)."""
    data = kwargs.get("data")
    try:
        if data is None:
            data = _shorthand_rows(kwargs, where)
        elif kwargs.get("prompt_ids") is not None or kwargs.get("dataset") is not None:
            return None                       # `register` refuses rows with the shorthand's
    except ReplayLakeError:
        return None
    table, problems = conform(data, schema, {})
    if problems or any(partition_problem(p) for p in set(table.column("partition").to_pylist())):
        return None
    return table


def _leave(kwargs: dict[str, Any], table: pa.Table, left: list[bool]) -> dict[str, Any] | None:
    """``kwargs`` with only the rows marked in ``left`` (None when nothing is left to do)."""
    if not any(left):
        return None
    if all(left):
        return kwargs
    if kwargs.get("data") is not None:
        return {"data": table.filter(pa.array(left))}
    keep = [i for i, flag in enumerate(left) if flag]
    per_uid = {k: [v[i] for i in keep] for k, v in kwargs.items()
               if k in _PER_UID and isinstance(v, list)}
    return {**kwargs, "uids": [kwargs["uids"][i] for i in keep], **per_uid}


def register_left(buf: ReplayBuffer, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The registrations of a retried `register` the lost attempt did not make; `IngestError`
    when a group it names is registered otherwise (another producer's)."""
    table = _rows(kwargs, GROUPS_INPUT, "register")
    if table is None:
        return kwargs
    left, clashes = [], []
    for i, row in enumerate(table.to_pylist()):
        g = buf.lookup(row["partition"], row["uid"])
        left.append(g is None)
        if g is not None and g.removed != "retired":
            theirs = {k: getattr(g, k) for k in _AS_REGISTERED}
            ours = {k: row[k] for k in _AS_REGISTERED}
            if theirs != ours:
                clashes.append(Problem("uid", (i,), (
                    f"group {row['uid']!r} is already registered in partition "
                    f"{row['partition']!r} as {_shown(theirs)}; this call, sent again after the "
                    f"buffer's actor died under it, registers it as {_shown(ours)}: it is "
                    "another registration of that uid (uids must be unique), not the one the "
                    "lost attempt made")))
    if clashes:
        raise IngestError("group registration (sent again)", clashes)
    return _leave(kwargs, table, left)


def _shown(fields: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in fields.items() if v is not None or k == "n")


def status_left(buf: ReplayBuffer, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The status moves of a retried `update_status` the lost attempt did not make."""
    table = _rows(kwargs, STATUS_INPUT, "update_status")
    if table is None:
        return kwargs
    left = []
    for row in table.to_pylist():
        g = buf.lookup(row["partition"], row["uid"])
        done = g is not None and (g.status == row["status"] or bool(g.removed) or
                                  _RANK.get(g.status, -1) > _RANK.get(row["status"], 9))
        left.append(not done)
    return _leave(kwargs, table, left)


def release_left(buf: ReplayBuffer, batch_id: int) -> bool:
    """Whether a retried `release` still has a batch to release."""
    return any(batch_id in buf.held_batches(p) for p in buf.partitions())
