"""Admission control: `dispatch_capacity` (the declaration `sql/policies/dispatch_capacity.sql`,
run by polars live and by DuckDB over the lake) and the `admit` strategy that paces refills.

The boundary: a rollout side that dispatches at most the capacity, with groups that finish
within their step, never sees a stale eviction over a run; one group more can be one."""
from __future__ import annotations

import random
from itertools import count
from pathlib import Path

import pyarrow as pa
import pytest

from pipeline import ReplayBuffer
from pipeline.analysis.views import connect
from pipeline.config import STRATEGIES, async_config, sync_config
from pipeline.decide.policies import Admit, Unpaced, capacity
from pipeline.errors import ConfigError, RefillLimitError
from sql import loader
from tests.support.policies import Refiller, group, make

EV = "training/off_policy/evicted_samples"


# --- the formula ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("t", "b", "selected", "sampleable", "inflight", "expected"), [
    (2, 4, 0, 0, 0, 8),          # T x B places, nothing taken
    (2, 4, 0, 3, 4, 1),
    (2, 4, 4, 3, 0, 1),          # after the step's sample: its batch took 4 places
    (2, 4, 0, 5, 3, 0),          # exactly full
    (2, 4, 0, 6, 3, 0),          # over-full: never negative
    (1, 3, 0, 2, 0, 1),
])
def test_the_capacity_is_t_times_b_less_what_is_taken_and_queued(
        t, b, selected, sampleable, inflight, expected) -> None:
    assert capacity(t, b, selected, sampleable, inflight) == expected


def test_a_buffer_counts_sampleable_in_flight_and_selected_groups() -> None:
    buf = make("async", max_off_policy_threshold=2, train_batch_size=2)
    assert buf.dispatch_capacity(1, "train") == 4
    for u in ("a", "b"):
        group(buf, u, 1, [0.0, 1.0])
    group(buf, "c", 1, status="running")
    assert buf.dispatch_capacity(1, "train") == 1
    batch = buf.sample(1, "train", 2, timeout=5)
    # the step's batch took 2 of its places: asked at step 1 after its sample, 1 is left; the
    # step after has places again
    assert buf.dispatch_capacity(1, "train") == 1
    assert buf.dispatch_capacity(2, "train") == 3
    buf.release(batch)                       # released groups still took their places
    assert buf.dispatch_capacity(1, "train") == 1
    assert buf.dispatch_capacity(2, "train", batch_size=4) == 7
    assert buf.dispatch_capacity(2, "other") == 4


def test_dispatch_capacity_needs_a_bound_and_a_batch_size() -> None:
    with pytest.raises(ConfigError, match="batch_size="):
        make("async", max_off_policy_threshold=2).dispatch_capacity(1, "train")
    with pytest.raises(ConfigError, match="staleness bound"):
        make("async", max_off_policy_threshold=None, train_batch_size=2).dispatch_capacity(1, "t")
    with pytest.raises(ConfigError, match="staleness bound"):
        make("sync", train_batch_size=2).dispatch_capacity(1, "train")
    assert make("async", max_off_policy_threshold=3).dispatch_capacity(1, "t", batch_size=2) == 6


# --- the boundary over a run: capacity never goes stale, capacity + 1 can -----------------------

def _finish(buf: ReplayBuffer, uids: list[str], gs: int) -> None:
    buf.register(partition="train", uids=uids, global_steps=gs)
    buf.put([{"partition": "train", "uid": u, "session_id": 0, "min_global_steps": max(gs - 1, 0),
              "max_global_steps": max(gs - 1, 0), "reward": 1.0, "prompt_ids": [1],
              "response_ids": [2]} for u in uids])
    buf.update_status(partition="train", uids=uids, status="finished")


def _paced_run(t: int, b: int, steps: int, seed: int, *, extra_at: int | None = None,
               lake: Path | None = None) -> tuple[int, ReplayBuffer]:
    """A rollout side that asks the capacity before and after each step's sample and
    dispatches a random share of it (all of it when the batch would be short), every group
    finishing at once; at step ``extra_at`` it dispatches one group over the capacity.
    Returns the stale evictions over the run."""
    rng = random.Random(seed)
    buf = ReplayBuffer.async_(lake=lake, max_off_policy_threshold=t, train_batch_size=b,
                              poll_interval=0.01)
    ids = count()
    stale = 0
    for g in range(1, steps + 1):
        for when in ("before", "after"):
            cap = buf.dispatch_capacity(g, "train")
            short = when == "before" and buf.get_sampleable_count(g, "train") < b
            n = cap if short else rng.randint(0, cap)
            if extra_at == g and when == "after":
                n = cap + 1
            if n:
                _finish(buf, [f"u{next(ids)}" for _ in range(n)], g)
            if when == "before":
                batch = buf.sample(g, "train", b, timeout=5)
                stale += int(batch.metrics.get(EV, 0))
                buf.release(batch)
    return stale, buf


@pytest.mark.parametrize("t", [1, 2, 3])
@pytest.mark.parametrize("b", [1, 3])
@pytest.mark.parametrize("seed", range(4))
def test_dispatching_the_capacity_never_leads_to_a_stale_eviction(t: int, b: int,
                                                                   seed: int) -> None:
    stale, buf = _paced_run(t, b, 3 * t + 4, seed)
    assert stale == 0
    assert buf.counts("train")["finished"] <= t * b


@pytest.mark.parametrize("t", [1, 2, 3])
@pytest.mark.parametrize("b", [1, 3])
def test_one_group_over_the_capacity_goes_stale(t: int, b: int) -> None:
    """Asked at step 1 after its sample, the capacity fills steps 2 .. T exactly ((T - 1) x B
    places less what is queued); the group beyond it has span T + 1 at step T + 1."""
    stale, _ = _paced_run(t, b, t + 2, seed=0, extra_at=1)
    assert stale == 1


@pytest.mark.parametrize(("t", "b"), [(2, 2), (3, 1)])
def test_capacity_plus_one_dispatched_before_the_first_sample_goes_stale(t: int, b: int) -> None:
    for extra, expected in ((0, 0), (1, 1)):
        buf = make("async", max_off_policy_threshold=t, train_batch_size=b)
        n = buf.dispatch_capacity(1, "train") + extra
        _finish(buf, [f"u{i}" for i in range(n)], 1)
        stale = 0
        for g in range(1, t + 2):
            if buf.get_sampleable_count(g, "train") < b:     # paced from here on
                _finish(buf, [f"g{g}-{i}" for i in range(buf.dispatch_capacity(g, "train"))], g)
            stale += int(buf.sample(g, "train", b, timeout=5).metrics.get(EV, 0))
        assert stale == expected, extra


# --- both engines: the live count and DuckDB over the lake agree --------------------------------

def _lake_capacities(lake: Path, steps: list[int], t: int, b: int) -> list[int]:
    """DuckDB alone, over the lake (one connection for the lake as it stands): per step, the
    async preset's rules (`stale`, `failure`) run over the lake's candidates, and the capacity
    over the survivors, the in-flight groups and the decision log."""
    import duckdb
    lake_con = connect(lake)
    cands = lake_con.sql("select * from candidates").to_arrow_table()
    inflight = lake_con.sql("select * from inflight").to_arrow_table()
    decisions = lake_con.sql("select * from decisions").to_arrow_table()
    out = []
    for step in steps:
        evicted = set()
        for rule, params in (("stale", {"step": step, "threshold": t, "tightest": t}),
                             ("failure", {"evict_all": True})):
            evicted |= set(loader.run(lake_con, rule, **params).column("uid").to_pylist())
        survivors = cands.filter(pa.array([u not in evicted
                                           for u in cands.column("uid").to_pylist()], pa.bool_()))
        con = duckdb.connect()
        con.register("candidates", survivors)
        con.register("inflight", inflight)
        con.register("decisions", decisions)
        rows = loader.run(con, "dispatch_capacity", step=step, threshold=t,
                          batch_size=b).to_pylist()
        out.append({r["partition"]: r["capacity"] for r in rows}.get("train", t * b))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_the_live_capacity_is_the_lake_s(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    t, b = rng.randint(1, 3), rng.randint(1, 4)
    lake = tmp_path / "lake"
    buf = ReplayBuffer.async_(lake=lake, max_off_policy_threshold=t, train_batch_size=b,
                              poll_interval=0.01)
    ids = count()
    with buf:
        for g in range(1, 8):
            # some groups stay in flight, some fail (the next poll evicts them)
            for _ in range(rng.randint(0, b + 2)):
                uid = f"u{next(ids)}"
                status = rng.choice(["finished", "finished", "running", "pending", "failure"])
                group(buf, uid, g, [0.0, 1.0] if status != "pending" else None, status=status)
            steps = [g, g + 1]
            assert [buf.dispatch_capacity(s, "train") for s in steps] == \
                _lake_capacities(lake, steps, t, b)
            if buf.get_sampleable_count(g, "train") >= b:
                batch = buf.sample(g, "train", b, timeout=5)
                if rng.random() < 0.5:
                    buf.release(batch)
            steps = [g - 1, g, g + 1]
            assert [buf.dispatch_capacity(s, "train") for s in steps] == \
                _lake_capacities(lake, steps, t, b)
        live = buf.dispatch_capacity(7, "train")
    # a restored buffer counts the same places as taken
    with ReplayBuffer.async_(lake=lake, max_off_policy_threshold=t, train_batch_size=b) as again:
        assert again.dispatch_capacity(7, "train") == live


def test_the_live_engine_compiles_the_declared_capacity() -> None:
    from pipeline.decide import compile as declared
    items = declared.select_items(loader.load("dispatch_capacity"), "final")
    assert items == {"capacity": "greatest($threshold * $batch_size - n_selected - n_sampleable "
                                 "- n_inflight, 0)"}


# --- the `admit` strategy ------------------------------------------------------------------------

def test_every_strategy_is_listed_when_one_is_wrong() -> None:
    with pytest.raises(ConfigError) as err:
        async_config(max_off_policy_strategy="bogus")
    for s in STRATEGIES:
        assert repr(s) in str(err.value)
    assert "admit" in STRATEGIES


def test_admit_needs_train_batch_size_and_a_threshold() -> None:
    with pytest.raises(ConfigError, match="train_batch_size=None must be a positive int with "
                                          "max_off_policy_strategy='admit'"):
        async_config(max_off_policy_strategy="admit")
    with pytest.raises(ConfigError, match="needs max_off_policy_threshold"):
        async_config(max_off_policy_strategy="admit", max_off_policy_threshold=None,
                     train_batch_size=4)
    cfg = async_config(max_off_policy_strategy="admit", max_off_policy_threshold=3,
                       train_batch_size=4)
    assert cfg.admission == Admit(3, 4) and cfg.gate is None
    assert cfg.bound() == 3                      # the stale rule stays on as a safety net
    assert async_config().admission == Unpaced()
    assert sync_config(max_off_policy_strategy="admit").preset == "sync"   # ignored, as verl


def _stale_at(buf: ReplayBuffer, uid: str, gs: int) -> None:
    group(buf, uid, gs, [0.0, 1.0])


def test_admit_asks_refills_only_up_to_the_capacity_and_the_rest_at_the_next_step() -> None:
    """T=2, B=2 (4 places). At step 3: two groups of step 1 are stale (evicted, 2 refills
    owed), 3 of step 3 are sampleable: capacity 4 - 3 = 1, so one refill is asked; the batch
    is full without the second, which is asked at step 4."""
    ref = Refiller(step=3)
    buf = make("async", ref, max_off_policy_threshold=2, max_off_policy_strategy="admit",
               train_batch_size=2)
    for u in ("old0", "old1"):
        _stale_at(buf, u, 1)
    for u in ("a", "b", "c"):
        _stale_at(buf, u, 3)
    batch = buf.sample(3, "train", 2, timeout=5)
    assert batch.metrics[EV] == 2
    assert ref.calls == [1]
    assert batch.uids == ["a", "b"]
    buf.release(batch)
    # step 4: nothing new evicted; 2 sampleable (c, refill0) -> capacity 2, the owed one is asked
    ref.step = 4
    batch = buf.sample(4, "train", 2, timeout=5)
    assert ref.calls == [1, 1]
    assert EV not in batch.metrics


def test_drop_asks_every_refill_at_once_where_admit_paces_them() -> None:
    ref = Refiller(step=3)
    buf = make("async", ref, max_off_policy_threshold=2, train_batch_size=2)
    for u in ("old0", "old1"):
        _stale_at(buf, u, 1)
    for u in ("a", "b", "c"):
        _stale_at(buf, u, 3)
    buf.sample(3, "train", 2, timeout=5)
    assert ref.calls == [2]


def test_admit_refill_rows_name_the_oldest_evictions_first(tmp_path: Path) -> None:
    ref = Refiller(step=3)
    buf = make("async", ref, max_off_policy_threshold=2, max_off_policy_strategy="admit",
               train_batch_size=2, lake=tmp_path / "lake")
    ref.buf = buf
    for u in ("old0", "old1"):
        _stale_at(buf, u, 1)
    for u in ("a", "b", "c"):
        _stale_at(buf, u, 3)
    buf.release(buf.sample(3, "train", 2, timeout=5))
    ref.step = 4
    buf.release(buf.sample(4, "train", 2, timeout=5))
    buf.close()
    rows = connect(tmp_path / "lake").sql(
        "select step, count, replaces from decisions where kind = 'refill' order by seq"
    ).fetchall()
    assert rows == [(3, 1, ["old0"]), (4, 1, ["old1"])]


def test_admit_raises_when_the_cap_leaves_a_short_batch_nothing_to_wait_for() -> None:
    """Two samples at one step take more than train_batch_size: no place is left and nothing
    is in flight, so the owed refill could never be asked within the call."""
    ref = Refiller(step=1)
    buf = make("async", ref, max_off_policy_threshold=1, max_off_policy_strategy="admit",
               train_batch_size=2)
    for u in ("a", "b"):
        _stale_at(buf, u, 1)
    group(buf, "f", 1, [0.0], status="failure")
    buf.sample(1, "train", 2, timeout=5)
    with pytest.raises(RefillLimitError, match="dispatch capacity is 0"):
        buf.sample(1, "train", 1, timeout=5)
    assert ref.calls == []


def _admit_recording_asks() -> tuple[ReplayBuffer, list[int]]:
    """T=2, B=2 under admit with the DAPO filter; refill_fn only records each ask (as one that
    hands it to the rollout side and returns before any group is registered)."""
    asks: list[int] = []
    return make("async", max_off_policy_threshold=2, max_off_policy_strategy="admit",
                train_batch_size=2, filter_groups_metric="reward", refill_fn=asks.append), asks


def test_admit_counts_asked_prompts_in_flight_until_their_groups_register() -> None:
    """A refill_fn that hands the ask to the rollout side and returns before the new groups are
    registered: the next poll of the call must not see the same room and ask again. T=2, B=2,
    at step 3: 3 zero-variance groups evicted (3 owed), 2 sampleable, 1 in flight: capacity 1.
    One prompt is asked; it holds its place until a group registers (not twice after that),
    and an ask never registered holds no place at the next step."""
    buf, asks = _admit_recording_asks()
    group(buf, "c", 2, [0.0, 1.0])
    group(buf, "a", 3, [0.0, 1.0])
    group(buf, "b", 3, status="running")
    for u in ("z1", "z2", "z3"):
        group(buf, u, 3, [1.0, 1.0])
    assert buf.dispatch_capacity(3, "train") == 1
    batch = buf.sample(3, "train", 2, timeout=5)
    assert batch.uids == ["c", "a"]
    assert asks == [1]                          # not one per poll until all 3 were asked
    assert buf.dispatch_capacity(3, "train") == 0     # b and the asked prompt take the places
    group(buf, "r0", 3, status="running")       # the asked group arrives: counted once
    assert buf.dispatch_capacity(3, "train") == 0
    buf.update_status(partition="train", uids=["b", "r0"], status="failure")
    assert buf.dispatch_capacity(3, "train") == 2


def test_an_asked_prompt_never_registered_holds_no_place_at_the_next_step() -> None:
    buf, asks = _admit_recording_asks()
    group(buf, "a", 3, [0.0, 1.0])
    group(buf, "z", 3, [1.0, 1.0])
    group(buf, "b", 3, status="running")
    assert buf.dispatch_capacity(3, "train") == 2
    buf.release(buf.sample(3, "train", 1, timeout=5))
    assert asks == [1]
    # selected 1, in flight b and the asked prompt: 4 - 1 - 2 = 1 at step 3
    assert buf.dispatch_capacity(3, "train") == 1
    # at step 4 the ask no longer counts: 4 places, only b in flight (the batch was step 3's)
    assert buf.dispatch_capacity(4, "train") == 3
