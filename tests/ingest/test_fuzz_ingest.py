"""Hostile input: malformed batches given to `register`, `update_status` and `put` end in a typed
`ReplayLakeError` or a clean accept, never another exception, a hang or a damaged lake; a rejected
call changes nothing, and no partition id writes outside the lake directory.

Inputs fuzzed: wrong types in every column (str for int, float for str, bool, bytes, dicts,
nested lists), nulls, missing and extra columns, ragged column lengths, huge lists, negative and
overflowing steps and token ids (beyond int32 / int64), NaN and ±inf rewards, unicode, control and
path characters in partition ids and uids (`..`, `/`, NUL, `partition=`), duplicate keys within a
call and across calls, out-of-order and repeated status transitions, and whole-batch shapes that
are not rows at all (None, a string, a number, a list of non-dicts).

Whatever was accepted, DuckDB reads every view of the lake, its spans are the exact ones, and
its candidate aggregates are the live buffer's: no accepted step makes the two engines disagree.
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
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from pipeline import ReplayBuffer, ReplayLakeError
from pipeline.analysis.views import BASE_TABLES, DERIVED_VIEWS, connect
from pipeline.lake.damage import check
from tests.support.lake import lake_counts

HANG_SECONDS = 30

ids = st.one_of(
    st.sampled_from(["train", "val", "g", "h", "", ".", "..", "../escape", "/etc", "a/b",
                     "partition=x", "x\x00y", "~", "$HOME", "con", "ü", "日本", "a" * 300,
                     "train/../../..", " train", "train\n"]),
    st.text(min_size=0, max_size=20),
)
bad_scalars = st.sampled_from([None, True, b"bytes", {"k": 1}, [1], 1.5, "1", object])
# the step limit's boundary (2**62 - 1 is the largest step accepted), int64's and beyond
steps = st.one_of(st.integers(-5, 5), st.sampled_from([2**31, 2**62 - 1, 2**62, 2**63 - 1, 2**63,
                                                       -2**63 - 1, 2**64, -1]),
                  st.floats(allow_nan=True), bad_scalars)
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


# Calls valid but for their steps, so that boundary steps do get accepted (and refused) often.
boundary = st.sampled_from([2**63 - 1, 2**62, 2**62 - 1, 2**62 - 2, 1, 0])
valid_register = st.builds(
    lambda u, gs: [{"partition": "train", "uid": u, "global_steps": gs, "n": 2}],
    st.sampled_from(["b0", "b1"]), boundary)
valid_put = st.lists(st.builds(
    lambda u, s, lo, hi: {"partition": "train", "uid": u, "session_id": s, "min_global_steps": lo,
                          "max_global_steps": hi, "reward": float(s), "prompt_ids": [1],
                          "response_ids": [2, 3]},
    st.sampled_from(["g", "h", "b0"]), st.integers(0, 1), boundary, boundary), min_size=1,
    max_size=2)
valid_status = st.builds(lambda u: [{"partition": "train", "uid": u, "status": "finished"}],
                         st.sampled_from(["g", "h", "b0"]))

calls = st.lists(st.one_of(
    st.tuples(st.just("register"), _batch(register_rows)),
    st.tuples(st.just("update_status"), _batch(status_rows)),
    st.tuples(st.just("put"), _batch(traj_rows)),
    st.tuples(st.just("register"), valid_register),
    st.tuples(st.just("put"), valid_put),
    st.tuples(st.just("update_status"), valid_status),
), min_size=1, max_size=6)


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


_VERSIONS = ["partition", "uid", "n_traj", "min_version", "max_version"]


def _engines_agree(buf: ReplayBuffer, lake: Path) -> None:
    """Every view reads over the lake (DuckDB refuses an overflow where polars would wrap), the
    trajectories' spans are exact, and the lake's candidates are the live ones."""
    con = connect(lake)
    for view in (*BASE_TABLES, *DERIVED_VIEWS):
        con.sql(f"select * from {view}").to_arrow_table()
    got = con.sql("select min_global_steps, max_global_steps, span from trajectory_fates"
                  ).fetchall()
    assert all(span == hi - lo + 1 for lo, hi, span in got)
    lake_rows = con.sql(f"select {', '.join(_VERSIONS)} from candidates "
                        "order by partition, uid").fetchall()
    live_rows = sorted(tuple(r[c] for c in _VERSIONS) for p in buf.partitions()
                       for r in buf.candidates(p).to_pylist())
    assert lake_rows == live_rows


def _snapshot(buf: ReplayBuffer, lake: Path) -> dict:
    return {"lake": lake_counts(lake),
            "counts": {p: buf.counts(p) for p in buf.partitions()}}


def _at(lo: int, hi: int, session: int = 0) -> list[dict]:
    return [{"partition": "train", "uid": "g", "session_id": session, "min_global_steps": lo,
             "max_global_steps": hi, "reward": float(session), "prompt_ids": [1],
             "response_ids": [2, 3]}]


def _boundary_calls(top: int) -> list[tuple[str, list[dict]]]:
    """The largest step accepted (2**62 - 1), or one past it, in every step column at once."""
    return [("register", [{"partition": "train", "uid": "b0", "global_steps": top, "n": 2}]),
            ("put", _at(0, top)), ("put", _at(top, top, 1)),
            ("update_status", [{"partition": "train", "uid": "g", "status": "finished"}])]


@settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "40")))
@given(calls=calls, sync=st.booleans())
@example(calls=_boundary_calls(2**62 - 1), sync=False)
@example(calls=_boundary_calls(2**62), sync=True)
@example(calls=_boundary_calls(2**63 - 1), sync=False)
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
        _engines_agree(buf, lake)
        buf.close()
        assert sorted(os.listdir(base)) == ["lake"], "something was written outside the lake"
        assert check(lake).damaged == []
        with ReplayBuffer.sync(lake=lake) if sync else ReplayBuffer.async_(lake=lake) as again:
            assert {p: again.counts(p) for p in again.partitions()} == after
    finally:
        shutil.rmtree(base, ignore_errors=True)
