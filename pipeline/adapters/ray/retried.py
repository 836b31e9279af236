"""A call sent again after the buffer's actor died under it: what of it had already landed.

When the actor's process dies with a call in flight, the caller cannot tell whether the call was
written to the lake before the death (the restarted actor restored it) or not. The client sends
it again, marked as a retry, and the actor takes out what the lost attempt already did:

- `put` needs nothing here: an identical row already stored is a no-op in the buffer itself
  (`PutResult.already_stored`), a different row under the same key is still refused.
- `register`: a group already known in that partition with the same ``n`` (or already gone: it
  was registered, trained and released meanwhile) is the lost attempt's (a call is
  all-or-nothing, so it landed whole or not at all).
- `update_status`: a group already at that status, or past it (running once `finished` was
  asked, sampled, released), is the lost attempt's; one at a conflicting status (`failure`
  where `finished` was asked) is left in, and refused as on a first attempt.
- `release`: a batch no longer held was released by the lost attempt.

Only retries take this path: a first attempt that names a known group is refused as always.
"""
from __future__ import annotations

from typing import Any

from pipeline.buffer import ReplayBuffer

_PER_UID = ("prompt_ids", "dataset")     # shorthand keywords that hold one value per uid
_RANK = {"pending": 0, "running": 1, "finished": 2, "failure": 2, "sampled": 3}


def _rows(kwargs: dict[str, Any], keys: tuple[str, ...]) -> list[dict[str, Any]]:
    data = kwargs.get("data")
    if data is None:
        uids = kwargs["uids"]
        return [{"uid": u, **{k: kwargs[k] for k in keys if k != "uid"}} for u in uids]
    if hasattr(data, "to_pylist"):            # a pyarrow Table
        data = data.to_pylist()
    if isinstance(data, dict):
        n = len(data["uid"])
        return [{k: data.get(k, [None] * n)[i] for k in keys} for i in range(n)]
    return [dict(zip(keys, (row.get(k) for k in keys))) for row in data]


def _shorthand(kwargs: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """``kwargs`` with only ``rows`` left (None when nothing is left to do)."""
    if not rows:
        return None
    if kwargs.get("data") is None:
        # per-uid lists of the shorthand (`register`'s prompt_ids, dataset) keep the uids left
        at = {u: i for i, u in enumerate(kwargs["uids"])}
        keep = [at[r["uid"]] for r in rows]
        per_uid = {k: [v[i] for i in keep] for k, v in kwargs.items()
                   if k in _PER_UID and isinstance(v, list)}
        return {**kwargs, "uids": [r["uid"] for r in rows], **per_uid}
    return {"data": rows}


def register_left(buf: ReplayBuffer, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The registrations of a retried `register` the lost attempt did not make."""
    rows = _rows(kwargs, ("partition", "uid", "global_steps", "n"))
    left = []
    for r in rows:
        g = buf.lookup(r["partition"], r["uid"])
        if g is None or not (g.removed or g.n == r["n"]):
            left.append(r)
    return _shorthand(kwargs, left)


def status_left(buf: ReplayBuffer, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The status moves of a retried `update_status` the lost attempt did not make."""
    rows = _rows(kwargs, ("partition", "uid", "status"))
    left = []
    for r in rows:
        g = buf.lookup(r["partition"], r["uid"])
        done = g is not None and (g.status == r["status"] or bool(g.removed) or
                                  _RANK.get(g.status, -1) > _RANK.get(r["status"], 9))
        if not done:
            left.append(r)
    return _shorthand(kwargs, left)


def release_left(buf: ReplayBuffer, batch_id: int) -> bool:
    """Whether a retried `release` still has a batch to release."""
    return any(batch_id in buf.held_batches(p) for p in buf.partitions())
