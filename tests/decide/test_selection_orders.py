"""Declared selection orders: each is one SQL file that DuckDB runs over a lake's candidates and
the candidate index derives its second heap from, so both engines pick the same groups in the
same order, ties by terminal seq then uid, and the heap stays right as groups come and go."""
from __future__ import annotations

import json
import random
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from jobs.cli import app
from pipeline import ReplayBuffer
from pipeline.analysis.views import connect
from pipeline.analysis.whatif.rerun import recorded, recorded_settings, replay
from pipeline.config import async_config, sync_config
from pipeline.decide import compile as declared
from pipeline.decide import vectors
from pipeline.decide.policies import ORDERS, SelectionOrder, selection_order
from pipeline.decide.policies.order import check_ranking
from pipeline.errors import ConfigError, LakeError
from pipeline.state import candidates
from sql import loader

DECLARED = ("spread_first", "oldest_version")
SEEDS = range(10)


# --- the index against the file, over literal candidate rows -----------------------------------

def _rows(rng: random.Random, n: int, first: int = 0) -> list[tuple]:
    """Candidate rows whose keys tie often: few metric values, few versions, some groups
    without trajectories (no metric, no version)."""
    rows = []
    for i in range(first, first + n):
        n_traj = rng.choice([0, 2, 4])
        vals = [rng.choice([0.0, 0.5, 1.0, 0.25]) for _ in range(n_traj)]
        lo = rng.randint(0, 4) if n_traj else None
        rows.append(("train", f"u{i:03d}", rng.randint(0, 6), rng.randint(0, 10_000) * 1000 + i,
                     "finished" if n_traj else "failure", n_traj,
                     min(vals) if vals else None, max(vals) if vals else None, 0,
                     10 * n_traj if n_traj else None, 5 if n_traj else None,
                     5 if n_traj else None, lo, None if lo is None else lo + 2, None))
    return rows


def _index(order: str, rows: list[tuple]) -> candidates.CandidateIndex:
    index = candidates.CandidateIndex(selection_order(order))
    for r in rows:
        index.add(r[1], r[2], r[3], r[4])
    index.complete(rows)
    return index


def _duckdb_first(order: str, rows: list[tuple], k: int) -> list[str]:
    if not rows:
        return []
    con = duckdb.connect()
    con.register("candidates", candidates.table(rows))
    name = "select_oldest" if order == "oldest" else f"select_{order}"
    return loader.run(con, name, batch_size=k).column("uid").to_pylist()


@pytest.mark.parametrize("order", DECLARED)
@pytest.mark.parametrize("seed", SEEDS)
def test_both_engines_rank_the_candidates_alike(order: str, seed: int) -> None:
    rng = random.Random(seed)
    rows = _rows(rng, 60)
    removed = sorted(r[1] for r in rows if rng.random() < 0.3)
    index = _index(order, rows)
    index.remove(removed)
    kept = [r for r in rows if r[1] not in set(removed)]
    for k in (1, 4, 17, len(kept)):
        assert index.first(k) == _duckdb_first(order, kept, k), k
    assert index.first(None) == _duckdb_first(order, kept, len(kept))


def test_spread_first_takes_the_widest_spread_and_breaks_ties_by_seq_then_uid() -> None:
    def row(uid: str, seq: int, lo: float | None, hi: float | None) -> tuple:
        return ("train", uid, 0, seq, "finished" if lo is not None else "failure",
                2 if lo is not None else 0, lo, hi, 0, None, None, None, None, None, None)
    rows = [row("flat", 1, 1.0, 1.0), row("none", 0, None, None), row("b", 7, 0.0, 1.0),
            row("a", 7, 0.0, 1.0), row("early", 3, -0.5, 0.5), row("narrow", 2, 0.0, 0.25)]
    want = ["early", "a", "b", "narrow", "flat", "none"]
    assert _index("spread_first", rows).first(None) == _duckdb_first("spread_first", rows, 6) \
        == want


def test_a_nan_spread_ranks_after_every_number_as_in_duckdb() -> None:
    """A group whose metric is infinite in every trajectory has spread inf - inf = NaN: SQL
    orders it after every number (and after the key 1 of a group without the metric), ties
    by seq then uid. A float NaN in the heap compared false both ways and came out first."""
    inf = float("inf")

    def row(uid: str, seq: int, lo: float | None, hi: float | None) -> tuple:
        return ("train", uid, 0, seq, "finished" if lo is not None else "failure",
                2 if lo is not None else 0, lo, hi, 0, None, None, None, None, None, None)
    rows = [row("nan_b", 1, inf, inf), row("wide", 9, 0.0, 1.0), row("nan_a", 1, -inf, -inf),
            row("none", 0, None, None), row("inf", 8, -inf, 0.0), row("flat", 3, 0.5, 0.5)]
    want = ["inf", "wide", "flat", "none", "nan_a", "nan_b"]
    for k in (1, 2, 5, 6):
        assert _index("spread_first", rows).first(k) == _duckdb_first("spread_first", rows, k) \
            == want[:k], k
    index = _index("spread_first", rows)
    index.remove(["inf", "wide", "flat"])
    assert index.first(1) == ["none"] and index.first(None) == ["none", "nan_a", "nan_b"]


def test_oldest_version_takes_the_oldest_weights_not_the_oldest_dispatch() -> None:
    def row(uid: str, gs: int, seq: int, lo: int | None) -> tuple:
        return ("train", uid, gs, seq, "finished", 2, None, None, 0, None, None, None, lo, lo, None)
    rows = [row("old_dispatch", 1, 1, 3), row("old_weights", 5, 2, 0), row("no_traj", 2, 3, None)]
    want = ["old_weights", "no_traj", "old_dispatch"]
    assert _index("oldest_version", rows).first(3) == _duckdb_first("oldest_version", rows, 3) \
        == want


@pytest.mark.parametrize("order", DECLARED)
@pytest.mark.parametrize("seed", SEEDS)
def test_the_heap_stays_right_as_groups_arrive_and_leave_between_samples(order: str,
                                                                          seed: int) -> None:
    """An index fed over many polls (arrivals, samples taking its first k, evictions from
    anywhere) ranks like one built from scratch over what is left, after every step."""
    rng = random.Random(seed)
    index = candidates.CandidateIndex(selection_order(order))
    alive: dict[str, tuple] = {}
    n = 0
    for i in range(25):
        new = _rows(rng, rng.randint(0, 12), first=n)
        n += len(new)
        for r in new:
            index.add(r[1], r[2], r[3], r[4])
        index.complete(new)
        alive.update((r[1], r) for r in new)
        k = rng.randint(1, 6)
        taken = index.first(k)
        assert taken == _index(order, list(alive.values())).first(k)
        gone = taken + [u for u in alive if rng.random() < 0.1 and u not in taken]
        index.remove(gone)
        for u in gone:
            del alive[u]
        if i % 5 == 4:
            assert index.first(None) == _duckdb_first(order, list(alive.values()),
                                                      max(len(alive), 1))
    assert len(index._ranked) <= max(64, 2 * index.alive_count)   # dead entries are collected


def test_a_declared_order_refuses_to_rank_groups_it_has_not_keyed() -> None:
    index = candidates.CandidateIndex(selection_order("spread_first"))
    index.add("g", 0, 1, "finished")
    with pytest.raises(AssertionError, match="not aggregated yet"):
        index.first(1)


# --- the value ----------------------------------------------------------------------------------

def test_oldest_is_the_default_and_keeps_the_single_heap() -> None:
    for cfg in (async_config(), sync_config(), async_config(selection_order="oldest")):
        assert cfg.order is None and cfg.selection_order == "oldest"
        assert cfg.aggregated_metric == cfg.filter_metric
    index = candidates.CandidateIndex()
    rows = _rows(random.Random(0), 20)
    for r in rows:
        index.add(r[1], r[2], r[3], r[4])
    index.complete(rows)
    assert index.first(None) == index.oldest(None) == _duckdb_first("oldest", rows, 20)
    assert index._ranked == []


@pytest.mark.parametrize("bad", ["spread", "OLDEST", "", None, 1])
def test_an_unknown_order_is_refused_naming_the_field_and_the_choices(bad: object) -> None:
    for make in (async_config, sync_config):
        with pytest.raises(ConfigError, match="selection_order=") as err:
            make(selection_order=bad)
        assert all(repr(name) in str(err.value) for name in ORDERS)
    with pytest.raises(ConfigError, match="selection_order="):
        ReplayBuffer.async_(selection_order=bad)


def test_the_default_order_needs_no_order_value() -> None:
    with pytest.raises(ConfigError, match="needs no SelectionOrder"):
        SelectionOrder("oldest")


def test_spread_first_without_a_filter_metric_aggregates_the_reward() -> None:
    assert async_config(selection_order="spread_first").aggregated_metric == "reward"
    assert async_config(selection_order="spread_first", filter_groups_metric="acc",
                        refill_fn=lambda n: None).aggregated_metric == "acc"
    assert async_config(selection_order="oldest_version").aggregated_metric is None


# --- a run: the live buffer against DuckDB over its lake ---------------------------------------

def _produce(buf: ReplayBuffer, step: int, rng: random.Random, n: int = 6) -> None:
    """``n`` groups dispatched a step or two before ``step``, of two sessions each, rewards from
    a few values (so spreads tie), each trajectory generated with a version up to 3 behind."""
    uids = [f"s{step}g{i}" for i in range(n)]
    buf.register(partition="train", uids=uids, global_steps=max(step - rng.randint(0, 2), 0), n=2)
    rows = []
    for u in uids:
        for s in range(2):
            v = max(step - rng.randint(1, 3), 0)
            rows.append({"partition": "train", "uid": u, "session_id": s, "index": 0,
                         "min_global_steps": v, "max_global_steps": v,
                         "reward": rng.choice([0.0, 0.5, 1.0]), "prompt_ids": [1, 2],
                         "response_ids": [3] * rng.randint(1, 4), "is_padding": False})
    buf.put(rows)
    buf.update_status(partition="train", uids=uids, status="finished")


def test_a_group_with_infinite_rewards_is_sampled_where_duckdb_ranks_it(tmp_path: Path) -> None:
    """Rewards of +-inf are accepted; a group scoring +inf in every trajectory has spread NaN,
    which the lake orders after every other group: the live buffer too, and silently."""
    lake = tmp_path / "lake"
    inf = float("inf")
    with ReplayBuffer.async_(lake=lake, max_off_policy_threshold=None, poll_interval=0.001,
                             selection_order="spread_first") as buf:
        for uid, rewards in {"all_inf": [inf, inf], "wide": [1.0, 0.0], "flat": [0.5, 0.5],
                             "inf_gap": [-inf, 0.0]}.items():
            buf.register(partition="train", uids=[uid], global_steps=1, n=2)
            buf.put([{"partition": "train", "uid": uid, "session_id": s, "min_global_steps": 0,
                      "max_global_steps": 0, "reward": r, "prompt_ids": [1], "response_ids": [2]}
                     for s, r in enumerate(rewards)])
            buf.update_status(partition="train", uids=[uid], status="finished")
        buf.prepare("train")
        assert _lake_first(lake, "spread_first", 4) == buf.sampleable_uids("train") == [
            "inf_gap", "wide", "flat", "all_inf"]
        assert buf.sample(1, "train", 3, timeout=5).uids == ["inf_gap", "wide", "flat"]


def _lake_first(lake: Path, order: str, k: int) -> list[str]:
    con = connect(lake)
    try:
        return loader.run(con, f"select_{order}", batch_size=k).column("uid").to_pylist()
    finally:
        con.close()


@pytest.mark.parametrize("order", DECLARED)
def test_a_run_samples_what_duckdb_ranks_first_over_its_lake(tmp_path: Path, order: str) -> None:
    """Groups pile up (6 arrive per step, 3 are trained): before every sample the live
    buffer's candidates, ranked by DuckDB over the lake, begin with the batch it then picks;
    a buffer restored from the lake picks the same again."""
    lake = tmp_path / "lake"
    rng = random.Random(7)
    with ReplayBuffer.async_(lake=lake, max_off_policy_threshold=None, selection_order=order,
                             poll_interval=0.001) as buf:
        for step in range(1, 9):
            _produce(buf, step, rng)
            buf.prepare("train")
            want = _lake_first(lake, order, 3)
            assert buf.sampleable_uids("train")[:3] == want
            b = buf.sample(step, "train", 3, timeout=10)
            assert b.uids == want, step
            buf.release(b)
        left = buf.sampleable_uids("train")
    assert len(left) == 8 * 3 and left == _lake_first(lake, order, len(left))
    with ReplayBuffer.async_(lake=lake, max_off_policy_threshold=None, selection_order=order,
                             poll_interval=0.001) as again:
        assert again.sampleable_uids("train") == left


def _run(lake: Path, order: str, steps: int = 6) -> Path:
    rng = random.Random(3)
    with ReplayBuffer.async_(lake=lake, max_off_policy_threshold=3, selection_order=order,
                             poll_interval=0.001) as buf:
        for step in range(1, steps + 1):
            _produce(buf, step, rng)
            buf.release(buf.sample(step, "train", 3, timeout=10))
    return lake


def test_the_lake_records_the_order_and_refuses_a_reopen_with_another(tmp_path: Path) -> None:
    lake = _run(tmp_path / "lake", "spread_first")
    config = json.loads((lake / "_config.json").read_text())
    assert config["versions"][-1]["config"]["selection_order"] == "spread_first"
    assert recorded_settings(lake)["selection_order"] == "spread_first"
    with pytest.raises(LakeError, match="selection_order: lake 'spread_first', now 'oldest'"):
        ReplayBuffer.async_(lake=lake, max_off_policy_threshold=3)
    ReplayBuffer.async_(lake=lake, max_off_policy_threshold=3,
                        allow_changes=("selection_order",)).close()


def test_a_lake_recorded_before_the_order_existed_reads_as_oldest(tmp_path: Path) -> None:
    lake = _run(tmp_path / "lake", "oldest", steps=2)
    path = lake / "_config.json"
    rec = json.loads(path.read_text())
    for v in rec["versions"]:
        del v["config"]["selection_order"]
    path.write_text(json.dumps(rec))
    assert recorded_settings(lake)["selection_order"] == "oldest"
    ReplayBuffer.async_(lake=lake, max_off_policy_threshold=3).close()   # same order: no refusal
    with pytest.raises(LakeError, match="selection_order"):
        ReplayBuffer.async_(lake=lake, max_off_policy_threshold=3, selection_order="spread_first")


@pytest.mark.parametrize("order", DECLARED)
def test_whatif_of_the_recorded_order_reproduces_every_batch(tmp_path: Path, order: str) -> None:
    lake = _run(tmp_path / "lake", order)
    got, want = replay(lake, tmp_path / "replay"), recorded(lake)
    assert len(want.batches) == 6 and got.batches == want.batches


def test_whatif_replays_an_oldest_run_under_a_declared_order(tmp_path: Path) -> None:
    lake = _run(tmp_path / "lake", "oldest")
    same = replay(lake, tmp_path / "same", selection_order="oldest")
    other = replay(lake, tmp_path / "other", selection_order="spread_first")
    assert same.batches == recorded(lake).batches
    assert other.batches != same.batches
    # the replay ran the declared order: its lake says so, and replaying it reproduces it
    assert recorded_settings(other.lake)["selection_order"] == "spread_first"
    assert replay(other.lake, tmp_path / "again").batches == other.batches


def test_the_whatif_command_takes_the_order_and_refuses_an_unknown_one(tmp_path: Path) -> None:
    lake = _run(tmp_path / "lake", "oldest")
    res = CliRunner().invoke(app, ["whatif", "--lake", str(lake), "--selection-order",
                                   "oldest_version", "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    assert recorded_settings(tmp_path / "a" / "lake")["selection_order"] == "oldest_version"
    res = CliRunner().invoke(app, ["whatif", "--lake", str(lake), "--selection-order", "newest",
                                   "--out", str(tmp_path / "b")])
    assert res.exit_code != 0 and "selection_order='newest'" in res.output


def test_the_report_says_which_order_the_run_trained_in() -> None:
    from pipeline.analysis.report.settings import settings
    from pipeline.lake import config as lake_config
    rows = {s.name: (s.value, s.meaning) for s in
            settings(lake_config.describe(async_config(selection_order="oldest_version")))}
    assert rows["selection_order"] == (
        "oldest_version", f"a sample takes first the group with {ORDERS['oldest_version']}")


def test_the_verl_adapter_keeps_verls_order() -> None:
    from pipeline.adapters.verl.options import core_config, merge
    for preset in ("sync", "async"):
        assert core_config(preset, merge({}, None), 8, "drop").order is None
    with pytest.raises(ConfigError, match="selection_order"):
        merge({}, {"selection_order": "spread_first"})     # not a verl option: refused, not used


@pytest.mark.parametrize("order", DECLARED)
def test_the_live_key_and_ranking_are_the_ones_the_file_declares(order: str) -> None:
    q = loader.load(f"select_{order}")
    assert declared.window_order(q) == ("order_key", "term_seq", "uid")
    # the live key is the file's `order_key` item, compiled (for numpy) from its text
    assert SelectionOrder(order).key is \
        vectors.compile_cached(declared.select_items(q, "keyed")["order_key"])
    assert SelectionOrder(order).reads_metric == (order == "spread_first")


@pytest.mark.parametrize("ranking", ["order_key, uid, term_seq", "global_steps, term_seq, uid",
                                     "order_key, term_seq"])
def test_a_declared_order_ranking_by_anything_else_is_refused(tmp_path: Path,
                                                              ranking: str) -> None:
    (tmp_path / "q.sql").write_text(
        "-- name: q\n-- description: d\n-- params: none\n-- reads: candidates\n-- returns: uid\n"
        f"select uid, row_number() over (partition by partition order by {ranking}) as rank "
        "from candidates\n")
    with pytest.raises(loader.SqlError, match="ranks by order_key, term_seq, uid"):
        check_ranking(loader.load("q", tmp_path))
