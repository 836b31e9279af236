"""The contract every declaration keeps: the live buffer's engine (compiled once, for numpy or
polars) and the lake's engine (DuckDB, the file as written) agree on random inputs, and a
rule's horizon is honest; the same holds for the selection order and for the status and empty
aggregates of a candidate.

The test iterates over every registered rule and check, so a new rule file is covered the moment
it exists."""
from __future__ import annotations

import random

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from pipeline.decide import aggregates, evaluate, rules, vectors
from pipeline.decide import compile as declared
from pipeline.decide.batch import batch_rows
from pipeline.decide.metrics import off_policy_metrics
from pipeline.state import candidates
from schemas import CANDIDATES, GROUP_TRAJECTORIES, LOOKUPS
from sql import loader
from tests.support.sql_cases import case_connection

SEEDS = range(12)


def _random_candidates(rng: random.Random, n: int) -> list[tuple]:
    rows = []
    for i in range(n):
        n_traj = rng.choice([0, 1, 2, 4])
        values = [rng.choice([0.0, 1.0, 0.1, 1e-200, 3e-200, None]) for _ in range(n_traj)]
        present = [v for v in values if v is not None]
        lengths = [rng.randint(0, 12) for _ in range(n_traj)]
        status = "failure" if n_traj == 0 or rng.random() < 0.2 else "finished"
        rows.append(("train", f"u{i}", rng.randint(0, 30), 1000 + i, status, n_traj,
                     min(present) if present else None, max(present) if present else None,
                     n_traj - len(present), sum(lengths) if n_traj else None,
                     min(lengths, default=None), max(lengths, default=None),
                     rng.randint(0, 5) if n_traj else None, rng.randint(5, 9) if n_traj else None,
                     rng.choice([None, "math", "code", "web"])))
    return rows


def _params(rule: rules.Rule, rng: random.Random, step: int) -> dict:
    out = {}
    for p in loader.load(rule.name).params:
        if p.name == "step":
            out[p.name] = step
        elif p.type == "BOOLEAN":
            out[p.name] = rng.random() < 0.5
        else:
            out[p.name] = rng.randint(1, 10)
    return out


def _use(rule: rules.Rule, rng: random.Random, step: int) -> tuple[dict, rules.RuleUse]:
    """Random parameters (step included) and the use that binds them: a rule with a lookup gets
    random rows for it (a random subset of the datasets, each its own bound, sometimes none), and
    the stale rule's `tightest` is what a configuration binds, the least of every bound."""
    params = _params(rule, rng, step)
    tables: tuple = ()
    if rule.lookup is not None:
        bounds = tuple((d, rng.randint(1, 10)) for d in ("math", "code", "web")
                       if rng.random() < 0.6)
        tables = ((rule.lookup[0], bounds),)
        if "tightest" in params:
            params["tightest"] = min([params["threshold"], *(b for _, b in bounds)])
    knobs = tuple((k, v) for k, v in params.items() if k != "step")
    return params, rules.RuleUse(rule.name, knobs, tables)


def _live(use: rules.RuleUse, rows: list[tuple], params: dict) -> set[str]:
    """The groups the live buffer's evaluation (the rule compiled for numpy) fires on."""
    frame = evaluate.rule_frame(rows, (use,), params)
    return {r[1] for r, hit in zip(rows, evaluate.fired(use.rule, frame, len(rows))) if hit}


def _lake(use: rules.RuleUse, rows: list[tuple], params: dict) -> set[str]:
    con = duckdb.connect()
    con.register("candidates", candidates.table(rows))
    if use.rule.lookup is not None:
        relation = use.rule.lookup[0]
        con.register(relation, pa.Table.from_pylist(
            [dict(zip(LOOKUPS[relation].names, r)) for r in use.lookup_rows()],
            schema=LOOKUPS[relation]))
    return set(loader.run(con, use.name, **params).column("uid").to_pylist())


@pytest.mark.parametrize("name", sorted(rules.registry()))
@pytest.mark.parametrize("seed", SEEDS)
def test_both_engines_give_the_same_groups(name: str, seed: int) -> None:
    rng = random.Random(seed)
    rule = rules.get(name)
    rows = _random_candidates(rng, 40)
    params, use = _use(rule, rng, rng.randint(0, 40))
    assert _live(use, rows, params) == _lake(use, rows, params)


@pytest.mark.parametrize("name", sorted(rules.registry()))
@pytest.mark.parametrize("seed", SEEDS)
def test_a_rule_fires_anew_only_on_groups_behind_its_horizon(name: str, seed: int) -> None:
    """What the incremental index relies on: a group that did not match at one step and matches
    at a later step was dispatched before the later step's horizon; without a horizon, time
    never changes the verdict."""
    rng = random.Random(seed)
    rule = rules.get(name)
    rows = _random_candidates(rng, 40)
    early, use = _use(rule, rng, rng.randint(0, 30))
    later = dict(early, step=early.get("step", 0) + rng.randint(1, 10)) if "step" in early \
        else early
    before, after = _live(use, rows, early), _live(use, rows, later)
    newly = after - before
    if rule.horizon(later) is None:
        assert newly == set() and before == after
    else:
        gs = {r[1]: r[2] for r in rows}
        assert all(gs[u] < rule.horizon(later) for u in newly)


@pytest.mark.parametrize("seed", SEEDS)
def test_group_aggregates_agree_between_engines(seed: int) -> None:
    rng = random.Random(seed)
    n = 60
    meta = pa.table({
        "partition": ["train"] * n, "uid": [f"u{rng.randint(0, 9)}" for _ in range(n)],
        "metric": [rng.choice([0.0, 1.0, 0.5, None]) for _ in range(n)],
        "n_response_tokens": [rng.randint(0, 20) for _ in range(n)],
        "min_global_steps": [rng.randint(0, 3) for _ in range(n)],
        "max_global_steps": [rng.randint(3, 6) for _ in range(n)],
    }, schema=GROUP_TRAJECTORIES)
    # the live engine: the declared aggregates compiled for numpy, grouped by uid
    items = vectors.compiled_items("group_aggregates")
    uids = sorted(set(meta.column("uid").to_pylist()))
    owner = np.array([uids.index(u) for u in meta.column("uid").to_pylist()])
    cols = {c: vectors.column(meta.column(c)) for c in
            ("metric", "n_response_tokens", "min_global_steps", "max_global_steps")}
    out = vectors.grouped(items, cols, owner, len(uids))
    live = list(zip(["train"] * len(uids), uids, *(out[k].tolist() for k in items)))
    con = duckdb.connect()
    con.register("group_trajectories", meta)
    lake = pl.from_arrow(loader.run(con, "group_aggregates")).sort("uid")
    assert ["partition", "uid", *items] == lake.columns == \
        list(CANDIDATES.names[:2]) + list(CANDIDATES.names[5:-1])
    assert live == lake.rows()


@pytest.mark.parametrize("seed", SEEDS)
def test_provenance_and_off_policy_metrics_agree_between_engines(seed: int) -> None:
    rng = random.Random(seed)
    n, step = 24, rng.randint(5, 12)
    spans_of = []
    resp = []
    for _ in range(n):
        length = rng.randint(0, 6)
        resp.append(list(range(length)))
        if rng.random() < 0.5:
            spans_of.append(None)
        else:
            cut = rng.randint(0, length)
            spans_of.append([{"version": 1, "n_tokens": cut}, {"version": 3, "n_tokens": length - cut}])
    payload = pa.table({
        "partition": ["train"] * n, "uid": [f"u{i // 4}" for i in range(n)], "seq": range(n),
        "min_global_steps": [1] * n, "max_global_steps": [3] * n,
        "is_padding": [rng.random() < 0.2 for _ in range(n)],
        "response_ids": pa.array(resp, pa.list_(pa.int32())),
        "version_spans": pa.array(spans_of, pa.list_(pa.struct(
            [("version", pa.int64()), ("n_tokens", pa.int32())]))),
    })
    groups = {f"u{i}": rng.randint(0, step) for i in range(n // 4)}
    provenance = batch_rows(payload, batch_id=0, step=step, group_steps=groups)
    live, weights = off_policy_metrics(provenance)
    rows = provenance.frame()
    con = duckdb.connect()
    con.register("batch_rows", rows.select(
        "partition", "step", "batch_id", "uid", "seq", "global_steps", "min_global_steps",
        "max_global_steps", "is_padding", "n_response_tokens", "span_tokens", "span_version_sum",
        "span_version_min").with_columns(   # 128-bit sums cross to Arrow as decimals
            pl.col(pl.Int128).cast(pl.Decimal(38, 0))).to_arrow())
    prov = loader.run(con, "provenance")
    for col in ("span", "staleness", "staleness_worst", "group_span", "token_staleness_sum"):
        assert prov.column(col).to_pylist() == rows[col].to_list()   # rows come in seq order
    con.register("provenance", prov)
    lake = loader.run(con, "off_policy").to_pylist()
    if not live:
        assert lake == []
        return
    (row,) = lake
    for key, value in live.items():
        col = key.split("/", 1)[1].replace("off_policy/", "").replace("/", "_")
        assert row[col] == pytest.approx(value), key
    assert weights["n_trajectories"] == row["n_trajectories"]


@pytest.mark.parametrize("seed", SEEDS)
def test_the_certificate_verdict_agrees_between_engines(seed: int) -> None:
    """`over_bound` of sql/views/certificates.sql, compiled for polars over a batch's provenance
    and run by DuckDB over the same rows and recorded bounds (group span at, under and over)."""
    rng = random.Random(seed)
    step, n = rng.randint(3, 9), 12
    groups = {f"u{i}": rng.randint(0, step) for i in range(4)}
    bound = rng.choice([None, 1, 2, 3, 4])
    payload = pa.table({
        "partition": ["train"] * n, "uid": [f"u{i % 4}" for i in range(n)], "seq": range(n),
        "min_global_steps": [0] * n, "max_global_steps": [1] * n,
        "is_padding": [rng.random() < 0.2 for _ in range(n)],
        "response_ids": pa.array([[1] * rng.randint(0, 3) for _ in range(n)],
                                 pa.list_(pa.int32())),
        "version_spans": pa.nulls(n, pa.list_(pa.struct([("version", pa.int64()),
                                                          ("n_tokens", pa.int32())]))),
    })
    rows = batch_rows(payload, batch_id=0, step=step, group_steps=groups).frame()
    live = rows.with_columns(bound=pl.lit(bound, pl.Int64), strategy=pl.lit("drop")).with_columns(
        *(e.alias(k) for k, e in declared.compiled_items("certificates", "certified").items()))
    con = duckdb.connect()
    con.register("provenance", rows.select(
        "partition", "step", "batch_id", "uid", "seq", "is_padding", "global_steps",
        "min_global_steps", "max_global_steps", "staleness", "staleness_worst", "group_span",
        "n_response_tokens", "span_tokens", "token_staleness_max").to_arrow())
    con.register("decisions", pa.table({
        "partition": ["train"] * 4, "batch_id": [0] * 4, "uid": list(groups), "kind": ["select"] * 4,
        "bound": pa.array([bound] * 4, pa.int64()), "strategy": ["drop"] * 4}))
    lake = loader.run(con, "certificates")
    assert lake.column("over_bound").to_pylist() == live["over_bound"].to_list()
    spans = live["group_span"].to_list()
    assert live["over_bound"].to_list() == [bound is not None and s > bound for s in spans]


# --- the selection order: one ranking, run by DuckDB and derived by the candidate index --------

def _index_of(rows: list[tuple], removed: set[str]) -> candidates.CandidateIndex:
    """A candidate index holding ``rows`` (status as given), with ``removed`` taken out again."""
    index = candidates.CandidateIndex()
    for r in rows:
        index.add(r[1], r[2], r[3], r[4])
    index.complete(rows)
    index.remove(sorted(removed))
    return index


def _lake_oldest(rows: list[tuple], k: int) -> list[str]:
    con = duckdb.connect()
    con.register("candidates", candidates.table(rows))
    return loader.run(con, candidates.SELECTION, batch_size=k).column("uid").to_pylist()


@pytest.fixture(params=[True, False], ids=["packed", "tuples"])
def packed(request, monkeypatch) -> bool:
    """The index's heap as packed ints (the shipped order) and as the key tuples another
    declared order needs."""
    monkeypatch.setattr(candidates, "_PACKED", request.param)
    return request.param


@pytest.mark.parametrize("seed", SEEDS)
def test_both_engines_pick_the_same_oldest_groups_in_the_same_order(seed: int, packed) -> None:
    """Dispatch steps drawn from a few values, so most groups tie on the step and the terminal
    seq (drawn out of order) decides; some groups leave the index before it is asked."""
    rng = random.Random(seed)
    rows = _random_candidates(rng, 40)
    seqs = rng.sample(range(1000, 2000), len(rows))
    rows = [(r[0], r[1], rng.randint(0, 3), seqs[i], *r[4:]) for i, r in enumerate(rows)]
    removed = {r[1] for r in rows if rng.random() < 0.25}
    kept = [r for r in rows if r[1] not in removed]
    index = _index_of(rows, removed)
    for k in (1, 3, 10, len(kept)):
        assert index.oldest(k) == _lake_oldest(kept, k), k
    assert index.oldest(None) == _lake_oldest(kept, len(kept))
    for horizon in (0, 1, 2, 4):               # the groups dispatched before a horizon
        assert sorted(index.before(horizon)) == sorted(r[1] for r in kept if r[2] < horizon)


def test_the_heap_sheds_removed_groups_and_keeps_the_order(packed) -> None:
    """Groups leave in batches off the front and from the middle; the heap is rebuilt once most
    of it is dead, and the order holds throughout (a group terminal again, after a re-issue,
    keeps only its newest entry)."""
    rng = random.Random(7)
    rows = [("train", f"g{i}", rng.randint(0, 5), 1000 + i, "finished", *[None] * 9)
            for i in range(300)]
    index = _index_of(rows, set())
    kept = list(rows)
    for _ in range(6):
        gone = set(index.oldest(20)) | {r[1] for r in rng.sample(kept, 10)}
        index.remove(sorted(gone))
        kept = [r for r in kept if r[1] not in gone]
        assert index.oldest(5) == _lake_oldest(kept, 5)
        assert len(index._heap) <= max(64, 2 * len(kept)) + 30
        if packed:
            assert set(index._uid_of) == set(index._heap)
    again = ("train", kept[-1][1], 0, 5000, "finished", *[None] * 9)   # terminal again
    index.remove([again[1]])
    index.add(again[1], again[2], again[3], again[4])
    index.complete([again])
    kept = [r for r in kept if r[1] != again[1]] + [again]
    assert index.oldest(None) == _lake_oldest(kept, len(kept))
    if packed:       # an entry's uid is kept exactly while the entry is in the heap
        assert set(index._uid_of) == set(index._heap)


def test_a_tie_on_the_dispatch_step_goes_to_the_earlier_terminal_status(packed) -> None:
    rows = [("train", "late", 2, 30, "finished", *[None] * 9),
            ("train", "early", 2, 10, "failure", *[None] * 9),
            ("train", "older", 1, 99, "finished", *[None] * 9)]
    assert _index_of(rows, set()).oldest(3) == _lake_oldest(rows, 3) == ["older", "early", "late"]


def test_the_live_order_is_the_ranking_the_selection_file_declares() -> None:
    assert candidates.ORDER == declared.window_order(loader.load("select_oldest")) \
        == ("global_steps", "term_seq", "uid")
    # the lake's candidates view lists groups in the same order, per partition
    last = loader.load("candidates").text.strip().splitlines()[-1]
    assert last == f"order by partition, {', '.join(candidates.ORDER)}"


def test_the_heap_key_follows_the_declared_order() -> None:
    assert candidates.heap_key(("global_steps", "term_seq", "uid"))(1, 5, "a") == (1, 5, "a")
    assert candidates.heap_key(("global_steps", "uid", "term_seq"))(1, 5, "a") == (1, "a", 5)


@pytest.mark.parametrize("order", [("term_seq", "global_steps", "uid"), ("global_steps", "term_seq"),
                                   ("global_steps", "term_seq", "uid", "n_traj")])
def test_an_order_the_index_cannot_keep_is_refused(order: tuple[str, ...]) -> None:
    with pytest.raises(loader.SqlError, match="global_steps first"):
        candidates.heap_key(order)


@pytest.mark.parametrize(("ranking", "message"), [
    ("order by global_steps desc, term_seq, uid", "plain columns"),
    ("order by global_steps + 1, term_seq, uid", "plain columns"),
])
def test_a_ranking_the_live_engine_cannot_reproduce_is_refused(tmp_path, ranking: str,
                                                               message: str) -> None:
    (tmp_path / "q.sql").write_text(
        "-- name: q\n-- description: d\n-- params: none\n-- reads: candidates\n-- returns: uid\n"
        f"select uid, row_number() over (partition by partition {ranking}) as rank "
        "from candidates\n")
    with pytest.raises(loader.SqlError, match=message):
        declared.window_order(loader.load("q", tmp_path))


# --- effective status and empty aggregates: the lake's views, compiled for the live buffer ------

def test_groups_without_trajectories_get_the_same_status_and_aggregates_in_both_engines(
        tmp_path) -> None:
    from pipeline import ReplayBuffer
    from pipeline.analysis.views import connect
    from tests.support.lake import add_group

    lake = tmp_path / "lake"
    with ReplayBuffer.sync(lake=lake, poll_interval=0.05) as buf:
        add_group(buf, "finished-empty", 1, [])
        add_group(buf, "failed-empty", 2, [], status="failure")
        add_group(buf, "finished", 3, [0.0, 1.0])
        add_group(buf, "failed", 4, [1.0], status="failure")
        live = buf.candidates("train")
        lake_rows = connect(lake, filter_metric=None).sql(   # the sync preset filters on none
            "select * from candidates where partition = 'train'").to_arrow_table()
    assert live.to_pylist() == lake_rows.to_pylist()
    by_uid = {r["uid"]: r for r in live.to_pylist()}
    assert [by_uid[u]["status"] for u in ("finished-empty", "failed-empty", "finished", "failed")] \
        == ["failure", "failure", "finished", "failure"]
    assert tuple(by_uid["finished-empty"][c] for c in CANDIDATES.names[5:-1]) \
        == aggregates.empty_aggregates() == (0, None, None, 0, None, None, None, None, None)


@pytest.mark.parametrize("status", ["finished", "failure"])
@pytest.mark.parametrize("n_traj", [0, 1, 3])
def test_the_live_effective_status_is_the_groups_view_s(status: str, n_traj: int) -> None:
    log = [{"table": "group_events", "uid": "g", "event": "registered", "global_steps": 1}]
    log += [{"table": "trajectories", "uid": "g", "session_id": s} for s in range(n_traj)]
    log += [{"table": "group_events", "uid": "g", "event": status, "global_steps": 1}]
    con = case_connection({"log": log})
    ((lake,),) = con.sql("select effective_status from groups").fetchall()
    assert aggregates.effective_status(status, n_traj) == lake


# --- the wait gate: one declaration, both engines ---------------------------------------------
# `sql/policies/wait_gate_blockers.sql` lists the in-flight groups that keep `sample` from
# returning; the live buffer compiles its predicate and asks it of the oldest in-flight group.
# Both are held to that one text, at the `>=` boundary above all.

def _inflight(rng: random.Random, step: int, threshold: int) -> pa.Table:
    """In-flight and landed groups of two partitions, spans clustered around the threshold."""
    rows = []
    for i in range(rng.randint(0, 8)):
        span = threshold + rng.choice([-2, -1, 0, 0, 1, 2])
        rows.append({"partition": rng.choice(["train", "val"]), "uid": f"u{i}",
                     "global_steps": step - span + 1,
                     "status": rng.choice(["pending", "running", "running", "finished"])})
    return pa.Table.from_pylist(rows, schema=pa.schema([
        ("partition", pa.string()), ("uid", pa.string()), ("global_steps", pa.int64()),
        ("status", pa.string())]))


def _blockers(table: pa.Table, step: int, threshold: int) -> set[tuple[str, str]]:
    con = duckdb.connect()
    con.register("inflight", table)
    out = loader.run(con, "wait_gate_blockers", step=step, threshold=threshold)
    return set(zip(out.column("partition").to_pylist(), out.column("uid").to_pylist()))


@pytest.mark.parametrize("threshold", [1, 2, 4])
@pytest.mark.parametrize("span_offset", [-1, 0, 1])
def test_the_wait_gate_blocks_at_exactly_the_threshold_in_both_engines(
        threshold: int, span_offset: int) -> None:
    from pipeline.decide.policies.stale import WaitGate, blocks
    step, span = 10, threshold + span_offset
    gs = step - span + 1
    table = pa.table({"partition": ["train"], "uid": ["g"], "global_steps": pa.array([gs], pa.int64()),
                      "status": ["running"]})
    expected = span >= threshold
    assert (_blockers(table, step, threshold) == {("train", "g")}) is expected
    assert blocks(step, gs, threshold) is expected
    assert WaitGate(threshold).open(step, gs) is not expected


@pytest.mark.parametrize("seed", SEEDS)
def test_the_live_gate_opens_exactly_when_the_declaration_lists_no_blocker(seed: int) -> None:
    from pipeline.decide.policies.stale import WaitGate, blocks
    rng = random.Random(seed)
    step, threshold = rng.randint(0, 20), rng.randint(1, 6)
    table = _inflight(rng, step, threshold)
    lake = _blockers(table, step, threshold)
    rows = table.to_pylist()
    flying = [r for r in rows if r["status"] in ("pending", "running")]
    assert {(r["partition"], r["uid"]) for r in flying
            if blocks(step, r["global_steps"], threshold)} == lake
    for partition in ("train", "val"):
        oldest = min((r["global_steps"] for r in flying if r["partition"] == partition),
                     default=None)
        assert WaitGate(threshold).open(step, oldest) is \
            (not any(p == partition for p, _ in lake))


# --- mask: the stale rule's text as a mark, both engines --------------------------------------
# `max_off_policy_strategy="mask"` marks, among the chosen groups, exactly those the `stale` rule
# would evict (`StaleMask`, compiled from sql/rules/stale.sql); the lake runs that file.

def _one_bound(threshold: int) -> rules.RuleUse:
    """The `stale` rule as mask uses it: one bound, no per-dataset rows."""
    return rules.RuleUse("stale", (("threshold", threshold), ("tightest", threshold)),
                         tables=(("stale_bounds", ()),))


@pytest.mark.parametrize("seed", SEEDS)
def test_the_live_mask_marks_exactly_the_groups_the_stale_rule_lists(seed: int) -> None:
    from pipeline.decide.policies.stale import StaleMask
    rng = random.Random(seed)
    rows = _random_candidates(rng, 40)
    step, threshold = rng.randint(0, 40), rng.randint(1, 10)
    marked = StaleMask(threshold).stale(step, {r[1]: (r[2], r[4]) for r in rows})
    assert marked == _lake(_one_bound(threshold), rows,
                           {"step": step, "threshold": threshold, "tightest": threshold})


@pytest.mark.parametrize("offset", [-1, 0, 1])
def test_the_mask_marks_one_step_over_the_threshold_in_both_engines(offset: int) -> None:
    from pipeline.decide.policies.stale import StaleMask
    step, threshold = 10, 3
    gs = step - (threshold + offset) + 1              # group span threshold + offset
    row = ("train", "g", gs, 1, "finished", 1, None, None, 0, 2, 2, 2, 0, 0)
    lake = _lake(_one_bound(threshold), [row],
                 {"step": step, "threshold": threshold, "tightest": threshold})
    assert StaleMask(threshold).stale(step, {"g": (gs, "finished")}) == lake == (
        {"g"} if offset > 0 else set())


# --- admission: one capacity, both engines ----------------------------------------------------
# `sql/policies/dispatch_capacity.sql` counts, per partition, the places taken and queued; the
# live buffer keeps those counts itself and evaluates the compiled `capacity` item over them
# (`pipeline.decide.policies.admission.capacity`; the live buffer against the lake's DuckDB is
# in tests/decide/test_admission.py). The analysis `dispatch_pacing` charts the same expression.

@pytest.mark.parametrize("seed", SEEDS)
def test_the_compiled_capacity_is_the_declaration_s_over_random_relations(seed: int) -> None:
    from pipeline.decide.policies import capacity
    from schemas import DECISIONS
    rng = random.Random(seed)
    step, threshold, batch = rng.randint(0, 6), rng.randint(1, 4), rng.randint(1, 5)
    flying = _inflight(rng, step, threshold)
    cands = candidates.table([r for r in _random_candidates(rng, rng.randint(0, 12))])
    selects = [{"partition": rng.choice(["train", "val"]), "step": rng.randint(0, 8),
                "call_id": 0, "poll": 0, "kind": rng.choice(["select", "select", "evict"]),
                "uid": f"s{i}", "count": 1, "seq": i, "ts": 0} for i in range(rng.randint(0, 12))]
    con = duckdb.connect()
    con.register("inflight", flying)
    con.register("candidates", cands)
    con.register("decisions", pa.Table.from_pylist(selects, schema=DECISIONS))
    lake = {r["partition"]: r for r in loader.run(con, "dispatch_capacity", step=step,
                                                  threshold=threshold,
                                                  batch_size=batch).to_pylist()}
    for partition in ("train", "val"):
        sel = sum(1 for r in selects if r["partition"] == partition and r["kind"] == "select"
                  and r["step"] >= step)
        buffered = sum(1 for p in cands.column("partition").to_pylist() if p == partition)
        fly = sum(1 for r in flying.to_pylist() if r["partition"] == partition
                  and r["status"] in ("pending", "running"))
        live = capacity(threshold, batch, sel, buffered, fly)
        row = lake.get(partition)
        if row is None:
            assert (sel, buffered, fly) == (0, 0, 0) and live == threshold * batch
        else:
            assert (row["n_selected"], row["n_sampleable"], row["n_inflight"]) == \
                (sel, buffered, fly)
            assert row["capacity"] == live


def test_the_pacing_analysis_charts_the_declared_capacity() -> None:
    policy = declared.select_items(loader.load("dispatch_capacity"), "final")["capacity"]
    chart = declared.select_items(loader.load("dispatch_pacing"), "paced")["capacity"]
    assert chart == policy


@pytest.mark.parametrize("seed", SEEDS)
def test_the_stale_rule_judges_each_dataset_by_its_own_bound_on_both_engines(seed: int) -> None:
    """The mapping case held explicitly: both engines agree, and the per-dataset bounds change
    the verdict against the default alone (a tighter math bound evicts more, a looser code bound
    keeps more), exactly as each group's own bound says."""
    rng = random.Random(seed)
    rows = _random_candidates(rng, 60)
    step, default = rng.randint(10, 30), rng.randint(3, 6)
    bounds = (("code", default + 3), ("math", default - 2))
    # each dataset's bound and one over it (span = step - global_steps + 1)
    for uid, dataset, span in (("m-at", "math", default - 2), ("m-over", "math", default - 1),
                               ("c-at", "code", default + 3), ("c-over", "code", default + 4)):
        rows.append(("train", uid, step - span + 1, 5000 + len(rows), "finished", 1, 1.0, 1.0,
                     0, 2, 2, 2, 0, 0, dataset))
    use = rules.RuleUse("stale", (("threshold", default), ("tightest", default - 2)),
                        (("stale_bounds", bounds),))
    params = {"step": step, "threshold": default, "tightest": default - 2}
    got = _live(use, rows, params)
    assert got == _lake(use, rows, params)
    own = dict(bounds)
    assert got == {r[1] for r in rows if r[4] == "finished"
                   and step - r[2] + 1 > own.get(r[-1], default)}
    assert {"m-over", "c-over"} <= got and not {"m-at", "c-at"} & got
