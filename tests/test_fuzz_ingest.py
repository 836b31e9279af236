"""Hostile input: malformed batches given to `register`, `update_status` and `put` end in a typed
`ReplayLakeError` or a clean accept, never another exception, a hang or a damaged lake; a rejected
call changes nothing, and no partition id writes outside the lake directory.

Inputs fuzzed: wrong types in every column (str for int, float for str, bool, bytes, dicts,
nested lists), nulls, missing and extra columns, ragged column lengths, huge lists, negative and
overflowing steps and token ids (beyond int32 / int64), NaN and ±inf rewards, unicode, control and
path characters in partition ids and uids (`..`, `/`, NUL, `partition=`), duplicate keys within a
call and across calls, out-of-order and repeated status transitions, and whole-batch shapes that
are not rows at all (None, a string, a number, a list of non-dicts).
"""
from __future__ import annotations

import math
import os
import shutil
import signal
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
from hypothesis import event, given, settings
from hypothesis import strategies as st

from pipeline import ReplayBuffer, ReplayLakeError
from pipeline.lake_check import check
from tests.support.lake import lake_counts

HANG_SECONDS = 30

ids = st.one_of(
    st.sampled_from(["train", "val", "g", "h", "", ".", "..", "../escape", "/etc", "a/b",
                     "partition=x", "x\x00y", "~", "$HOME", "con", "ü", "日本", "a" * 300,
                     "train/../../..", " train", "train\n"]),
    st.text(min_size=0, max_size=20),
)
bad_scalars = st.sampled_from([None, True, b"bytes", {"k": 1}, [1], 1.5, "1", object])
steps = st.one_of(st.integers(-5, 5), st.sampled_from([2**31, 2**63 - 1, 2**63, -2**63 - 1,
                                                       2**64, -1]), st.floats(allow_nan=True),
                  bad_scalars)
rewards = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -0.0]), bad_scalars,
                    st.integers(-(2**70), 2**70))
token_lists = st.one_of(
    st.lists(st.integers(-(2**40), 2**40), max_size=8),
    st.builds(lambda n: list(range(n)), st.sampled_from([0, 1, 70_000])),   # huge
    st.lists(st.one_of(st.none(), st.integers(0, 9), st.text(max_size=2)), max_size=4),
    st.lists(st.lists(st.integers(0, 3), max_size=2), max_size=2), bad_scalars,
)
statuses = st.one_of(st.sampled_from(["pending", "running", "finished", "failure", "sampled",
                                      "FINISHED", ""]), bad_scalars)
sessions = st.one_of(st.integers(-2, 4), st.sampled_from([2**31, 2**40]), bad_scalars)


def _row(fields: dict) -> st.SearchStrategy:
    """A row: each field present with a hostile-or-valid value, sometimes missing; maybe extra."""
    return st.fixed_dictionaries({}, optional=fields).flatmap(
        lambda d: st.one_of(st.just(d), st.just({**d, "surprise": 1})))


register_rows = _row({"partition": ids, "uid": ids, "global_steps": steps,
                      "n": st.one_of(st.integers(-1, 4), bad_scalars)})
status_rows = _row({"partition": ids, "uid": ids, "status": statuses})
traj_rows = _row({"partition": ids, "uid": ids, "session_id": sessions, "index": sessions,
                  "min_global_steps": steps, "max_global_steps": steps, "reward": rewards,
                  "prompt_ids": token_lists, "response_ids": token_lists,
                  "reward_info": st.one_of(st.none(), st.just([("acc", math.nan)]), bad_scalars)})


def _batch(rows: st.SearchStrategy) -> st.SearchStrategy:
    """Rows as a list of dicts, as ragged columns, as an Arrow table when it converts, or junk."""
    def columns(rs: list[dict]) -> dict:
        keys = {k for r in rs for k in r}
        return {k: [r[k] for r in rs if k in r] for k in keys}

    def table(rs: list[dict]):
        try:
            return pa.Table.from_pylist(rs)
        except Exception:                        # not convertible: the list itself, then
            return rs

    lists = st.lists(rows, min_size=0, max_size=4)
    return st.one_of(lists, lists.map(lambda rs: rs + rs),           # duplicate keys in a call
                     lists.map(columns), lists.map(table),
                     st.sampled_from([None, "rows", 7, [1, 2], [None], {"uid": "g"}, []]))


calls = st.lists(st.one_of(
    st.tuples(st.just("register"), _batch(register_rows)),
    st.tuples(st.just("update_status"), _batch(status_rows)),
    st.tuples(st.just("put"), _batch(traj_rows)),
), min_size=1, max_size=4)


@contextmanager
def no_hang(what: str):
    def alarm(*_):
        raise AssertionError(f"{what} did not return within {HANG_SECONDS}s")
    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(HANG_SECONDS)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _valid_start(buf: ReplayBuffer) -> None:
    """Groups for the hostile calls to collide with: g pending, h running, k finished."""
    buf.register(partition="train", uids=["g", "h", "k"], global_steps=1, n=2)
    buf.update_status(partition="train", uids=["h", "k"], status="running")
    buf.put([{"partition": "train", "uid": "k", "session_id": s, "min_global_steps": 0,
              "max_global_steps": 0, "reward": float(s), "prompt_ids": [1],
              "response_ids": [2]} for s in range(2)])
    buf.update_status(partition="train", uids=["k"], status="finished")


def _snapshot(buf: ReplayBuffer, lake: Path) -> dict:
    return {"lake": lake_counts(lake),
            "counts": {p: buf.counts(p) for p in buf.partitions()}}


@settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "120")))
@given(calls=calls, sync=st.booleans())
def test_hostile_batches_end_in_a_typed_error_or_a_clean_accept(calls, sync):
    base = Path(tempfile.mkdtemp(prefix="fuzz-"))
    lake = base / "lake"
    try:
        buf = (ReplayBuffer.sync if sync else ReplayBuffer.async_)(lake=lake)
        _valid_start(buf)
        for method, data in calls:
            before = _snapshot(buf, lake)
            with no_hang(method):
                try:
                    getattr(buf, method)(data)
                    event(f"{method} accepted")
                except ReplayLakeError as exc:
                    event(f"{method} rejected: {type(exc).__name__}")
                    assert _snapshot(buf, lake) == before, f"a rejected {method} changed state"
        after = {p: buf.counts(p) for p in buf.partitions()}
        buf.close()
        assert sorted(os.listdir(base)) == ["lake"], "something was written outside the lake"
        assert check(lake).damaged == []
        with ReplayBuffer.sync(lake=lake) if sync else ReplayBuffer.async_(lake=lake) as again:
            assert {p: again.counts(p) for p in again.partitions()} == after
    finally:
        shutil.rmtree(base, ignore_errors=True)
