"""The core's per-call shortcuts on its ingest path (a batch of groups at a time instead of a row at
a time) leave exactly what the row-by-row way left: the same live payload, the same groups, the same
problems and the same lake bytes. (Speed is measured outside the tests, never asserted here.)"""
from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from jobs.synthetic import trajectories
from pipeline import ReplayBuffer
from pipeline.errors import InvariantError
from pipeline.lake.read import current_files
from pipeline.lake.verify import batches
from pipeline.state.payload import TrajectoryRows
from schemas import LAKE_TABLES


def _groups(uids: list[str], per_group: int, seed: int, version: int = 0) -> pa.Table:
    """``per_group`` trajectories (sessions 0..per_group-1) for each uid, partition `train`."""
    n = len(uids) * per_group
    return trajectories("train", uids, per_group, version=version, rewards=np.zeros(n),
                        prompt_len=(1, 3), response_len=(1, 4), rng=np.random.default_rng(seed))


def _buffers(arr: pa.Array) -> list:
    return [None if b is None else b.to_pybytes() for b in arr.buffers()]


def _held(rows: TrajectoryRows, ids: list[int]) -> list[bool]:
    """Which of ``ids`` can still be read (their chunk is held)."""
    out = []
    for r in ids:
        try:
            rows.take([r])
            out.append(True)
        except InvariantError:
            out.append(False)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_dropping_ranges_frees_chunks_as_dropping_row_by_row_does(seed: int) -> None:
    rnd = random.Random(seed)
    sizes = [rnd.randint(1, 9) for _ in range(8)]
    chunks = [_groups([f"u{i}_{j}" for j in range(n)], 1, seed * 10 + i)
              for i, n in enumerate(sizes)]
    fast, slow = TrajectoryRows(), TrajectoryRows()
    for c in chunks:
        fast.append(c)
        slow.append(c)
    total = sum(sizes)
    # groups of rows: runs that may cross chunk boundaries, some as lists, in a shuffled order
    cuts = sorted(rnd.sample(range(1, total), 10))
    groups: list[range | list[int]] = [range(a, b) for a, b in zip([0, *cuts], [*cuts, total])]
    groups = [list(g) if rnd.random() < 0.3 else g for g in groups]
    rnd.shuffle(groups)
    everything = list(range(total))
    assert fast.held_bytes == slow.held_bytes      # measured before any drop, as a budget would
    for i in range(0, len(groups), 3):
        batch = groups[i:i + 3]
        if i % 2:
            fast.drop_all(batch)
        else:
            for g in batch:
                fast.drop(g)
        for g in batch:
            for r in g:
                slow.drop([r])                     # the row-at-a-time way
        assert fast.held_bytes == slow.held_bytes
        assert _held(fast, everything) == _held(slow, everything)
    assert fast.held_bytes == 0 and not any(_held(fast, everything))


def test_drop_all_merges_adjoining_ranges_and_still_takes_lists_and_empty_groups() -> None:
    rows = TrajectoryRows()
    for n in (4, 4, 4):
        rows.append(_groups([f"u{i}" for i in range(n)], 1, n))
    rows.drop_all([range(0), range(0, 2), range(2, 4), [4, 5], range(0), range(6, 8)])
    assert _held(rows, list(range(12))) == [False] * 8 + [True] * 4
    rows.drop_all([range(8, 10), range(10, 12)])
    assert rows.held_bytes == 0


def _mirror_round(buf: ReplayBuffer, first: int, prev: int | None) -> int:
    """One poll as the verl adapter feeds it: register, put, finish, release, then a sample."""
    uids = [f"g{first + i}" for i in range(8)]
    buf.register({"partition": ["train"] * 8, "uid": uids, "global_steps": [5] * 8})
    buf.put(_groups(uids, 4, first, version=4))
    buf.update_status({"partition": ["train"] * 8, "uid": uids, "status": ["finished"] * 8})
    if prev is not None:
        buf.release(prev)
    return buf.sample(5, "train", 8).batch_id


def test_release_rows_in_the_lake_are_laid_out_as_rows_built_from_dicts(tmp_path) -> None:
    """Byte for byte: an all-null string or list column built by `pa.nulls` would carry a data
    buffer the rows' nulls never had, and the lake would change."""
    buf = ReplayBuffer.async_(lake=tmp_path / "lake")
    prev = None
    for r in range(3):
        prev = _mirror_round(buf, 8 * r, prev)
    buf.close()
    written = [b for path in current_files(tmp_path / "lake", "decisions") for b, _ in batches(path)]
    released = [b for b in written if set(b.column("kind").to_pylist()) == {"release"}]
    assert [b.num_rows for b in released] == [8, 8]
    for got in released:
        rows = [{"partition": "train", "step": 5, "call_id": -1, "poll": 0, "kind": "release",
                 "uid": u, "batch_id": got.column("batch_id")[0].as_py(), "count": 1}
                for u in got.column("uid").to_pylist()]
        for f in LAKE_TABLES["decisions"]:
            if f.name not in ("seq", "ts"):
                want = pa.array([r.get(f.name) for r in rows], f.type)
                assert _buffers(got.column(f.name)) == _buffers(want), f.name


def _reference(rows: list[tuple[str, int, int, int]]) -> dict:
    """Groups filled one row at a time with `Group.add` (row id, session, index)."""
    from pipeline.state.partition import Group
    out: dict[str, Group] = {}
    for u, r, s, x in rows:
        out.setdefault(u, Group(u, 0, None)).add(r, s, x)
    return out


@pytest.mark.parametrize("seed", range(8))
def test_a_put_records_each_groups_rows_and_keys_as_row_by_row_adds_do(seed: int) -> None:
    from pipeline.state.partition import PartitionState
    rnd = random.Random(seed)
    part = PartitionState("train", None)
    uids = [f"u{i}" for i in range(6)]
    for u in uids:
        part.apply_registered(u, 0, None)
    done: list[tuple[str, int, int, int]] = []
    next_row = 0
    for _ in range(4):                    # several puts: groups continue, interleave, grow past 32
        order = [u for u in rnd.sample(uids, 4) for _ in range(rnd.randint(1, 12))]
        if rnd.random() < 0.5:
            rnd.shuffle(order)
        sessions = [rnd.randint(0, 40) for _ in order]
        index = [rnd.choice([0, 0, 1, 70]) for _ in order]
        table = _groups(order, 1, seed)
        table = table.set_column(table.schema.get_field_index("session_id"), "session_id",
                                 pa.array(sessions, pa.int32()))
        table = table.set_column(table.schema.get_field_index("index"), "index",
                                 pa.array(index, pa.int32()))
        part.apply_trajectories(table)
        done += [(u, next_row + i, s, x) for i, (u, s, x) in enumerate(zip(order, sessions, index))]
        next_row += len(order)
        want = _reference(done)
        for u, g in want.items():
            got = part.groups[u]
            assert type(got.rows) is type(g.rows) and list(got.rows) == list(g.rows)
            assert type(got.keys) is type(g.keys) and set(got.keys) == set(g.keys)
            if type(g.keys) is tuple:
                assert got.keys == g.keys                       # same order too


def test_put_checks_every_groups_session_count_whatever_the_others_allow() -> None:
    buf = ReplayBuffer.async_()
    buf.register({"partition": ["train"] * 2, "uid": ["a", "b"], "global_steps": [1, 1],
                  "n": [2, 8]})
    ok = _groups(["a", "b"], 2, 0)
    buf.put(ok)                                                # a: 0, 1 of 2; b: 0, 1 of 8
    more = _groups(["b"], 4, 1).slice(2, 2)                    # b: sessions 2, 3 (of 8)
    assert buf.put(more) == 2
    buf.register(partition="train", uids=["c", "d"], global_steps=1, n=None)
    buf.register(partition="train", uids=["e"], global_steps=1, n=3)
    bad = _groups(["c", "e", "d"], 4, 2)                       # e gets a session 3 (of 3)
    with pytest.raises(Exception, match=r"rows? 7: session_id >= the group's n"):
        buf.put(bad)
    assert buf.lookup("train", "c").keys == frozenset()       # nothing of the call accepted
