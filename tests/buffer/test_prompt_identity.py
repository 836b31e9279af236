"""Prompt identity, refill lineage and stored response lengths, on real buffers and real lakes.

A group may name the dataset prompt it answers (`prompt_id`); the id is written to the lake,
survives a restart and shows in every view of groups and trajectories, so "which prompts keep
getting evicted, and why" is the one query `evicted_prompts`. Every refill decision names the
evictions it replaces. Trajectories carry their response length from ingest, and lakes written
before any of these columns existed still open, restore and answer every query.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from pipeline import ConfigError, IngestError, ReplayBuffer
from pipeline.analysis.views import connect, read_lake
from pipeline.decide.policies.context import CallState
from pipeline.lake.compaction import compact
from sql.loader import load, run
from tests.support.old_lake import without_columns
from tests.support.sql_runs import shared_run

NEW_COLUMNS = {"group_events": ["prompt_id"], "decisions": ["replaces"],
               "trajectories": ["n_response_tokens"]}


def _rows(buf: ReplayBuffer, uid: str, rewards: list[float], step: int = 0,
          lengths: list[int] | None = None) -> list[dict]:
    lengths = lengths or [2] * len(rewards)
    return [{"partition": "train", "uid": uid, "session_id": s, "min_global_steps": step,
             "max_global_steps": step, "reward": r, "prompt_ids": [1, 2],
             "response_ids": list(range(n))} for s, (r, n) in enumerate(zip(rewards, lengths))]


def _settle(buf: ReplayBuffer, uid: str, rewards: list[float] | None, step: int = 0,
            lengths: list[int] | None = None) -> None:
    """Trajectories then `finished`, or `failure` without trajectories (rewards None)."""
    buf.update_status(partition="train", uids=[uid], status="running")
    if rewards is None:
        buf.update_status(partition="train", uids=[uid], status="failure")
        return
    buf.put(_rows(buf, uid, rewards, step, lengths))
    buf.update_status(partition="train", uids=[uid], status="finished")


class PromptRollout:
    """Registers groups for dataset prompts; rewards are fixed per prompt (prompt 1 always
    all-correct, prompt 2 always fails, prompt 3 mixed), so evictions per prompt are known."""

    REWARDS = {1: [1.0, 1.0], 2: None, 3: [0.0, 1.0]}

    def __init__(self) -> None:
        self.buf: ReplayBuffer | None = None
        self.next = 0
        self.queue = [1, 2, 3]
        self.prompt_of: dict[str, int] = {}

    def dispatch(self, prompts: list[int], step: int = 0) -> list[str]:
        uids = [f"u{self.next + i}" for i in range(len(prompts))]
        self.next += len(prompts)
        self.buf.register(partition="train", uids=uids, global_steps=step, n=2,
                          prompt_ids=prompts)
        for u, p in zip(uids, prompts):
            self.prompt_of[u] = p
            _settle(self.buf, u, self.REWARDS[p], step, lengths=[p, p + 1])
        return uids

    def refill(self, k: int) -> None:
        """Replacements cycle through the prompts 3, 1, 2, ... (mixed first)."""
        order = [3, 1, 2]
        self.dispatch([order[(self.next + i) % 3] for i in range(k)])


def _scripted_lake(lake: Path) -> PromptRollout:
    """Async with the zero-variance filter: two batches of one group; prompt 1 and 2 groups are
    evicted (zero variance / failure) and refilled until a prompt-3 group is sampleable."""
    ro = PromptRollout()
    with ReplayBuffer.async_(lake=lake, filter_groups_metric="reward", refill_fn=ro.refill,
                             poll_interval=0.01) as buf:
        ro.buf = buf
        for step in (1, 2):
            ro.dispatch([1, 2])
            buf.release(buf.sample(step, "train", 1, timeout=10))
    return ro


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, PromptRollout]:
    lake = tmp_path_factory.mktemp("prompts") / "lake"
    return lake, _scripted_lake(lake)


# --- registration -------------------------------------------------------------------------------

def test_a_registered_prompt_id_is_in_the_live_view_and_survives_a_restart(tmp_path: Path) -> None:
    with ReplayBuffer.sync(lake=tmp_path / "lake") as buf:
        buf.register(partition="train", uids=["a", "b", "c"], global_steps=0,
                     prompt_ids=[17, None, 17])
        buf.register({"partition": ["train"], "uid": ["d"], "global_steps": [0],
                      "prompt_id": [4]})
        assert [buf.lookup("train", u).prompt_id for u in "abcd"] == [17, None, 17, 4]
    with ReplayBuffer.sync(lake=tmp_path / "lake") as buf:
        assert [buf.lookup("train", u).prompt_id for u in "abcd"] == [17, None, 17, 4]
        assert buf.reissue(3) == {"train": ["a", "b", "c", "d"]}
        assert buf.lookup("train", "a").prompt_id == 17      # a re-issue keeps the prompt


def test_registration_without_prompt_ids_leaves_them_null(tmp_path: Path) -> None:
    with ReplayBuffer.sync(lake=tmp_path / "lake") as buf:
        buf.register(partition="train", uids=["a"], global_steps=0)
        assert buf.lookup("train", "a").prompt_id is None
    ev = read_lake(tmp_path / "lake")["group_events"]
    assert ev.column("prompt_id").to_pylist() == [None]


@pytest.mark.parametrize(("prompt_ids", "message"), [
    ([1], "1 prompt_ids for 2 uids"),
    (["7", 8], r"prompt_ids\[0\]='7' must be an int"),
    ([True, 8], r"prompt_ids\[0\]=True must be an int"),
    ("12", "one id per uid"),
])
def test_bad_prompt_ids_are_refused_naming_the_position(prompt_ids: object, message: str) -> None:
    buf = ReplayBuffer.sync()
    with pytest.raises(ConfigError, match=message):
        buf.register(partition="train", uids=["a", "b"], global_steps=0, prompt_ids=prompt_ids)
    assert buf.lookup("train", "a") is None


def test_a_string_prompt_id_in_rows_is_an_ingest_error_naming_the_row() -> None:
    buf = ReplayBuffer.sync()
    with pytest.raises(IngestError, match="prompt_id"):
        buf.register([{"partition": "train", "uid": "a", "global_steps": 0, "prompt_id": 3},
                      {"partition": "train", "uid": "b", "global_steps": 0,
                       "prompt_id": "gsm8k/12"}])
    assert buf.lookup("train", "a") is None


# --- the lake's views ---------------------------------------------------------------------------

def test_every_view_of_groups_and_trajectories_carries_the_prompt_id(
        scripted: tuple[Path, PromptRollout]) -> None:
    lake, ro = scripted
    con = connect(lake)
    for view in ("groups", "trajectory_fates", "batch_rows", "inflight"):
        got = dict(con.sql(f"select distinct uid, prompt_id from {view}").fetchall())
        assert got == {u: ro.prompt_of[u] for u in got}, view
    assert con.sql("select count(*) from groups where prompt_id is null").fetchall() == [(0,)]
    trained = con.sql("select distinct prompt_id from batch_rows").fetchall()
    assert trained == [(3,)]                 # only the mixed prompt is ever trained
    first = next(u for u, p in ro.prompt_of.items() if p == 1)
    lineage = run(con, load("lineage"), uid=first).to_pylist()
    assert lineage[0]["detail"] == "global_steps=0, prompt_id=1"


def test_evicted_prompts_answers_which_prompts_are_evicted_and_why(
        scripted: tuple[Path, PromptRollout]) -> None:
    lake, ro = scripted
    con = connect(lake)
    got = run(con, load("evicted_prompts")).to_pylist()
    groups = {p: [u for u, q in ro.prompt_of.items() if q == p] for p in (1, 2, 3)}
    # every prompt-1 and prompt-2 group is evicted; prompt 3 only ever trained (or still live)
    want = {1: {"zero_variance": len(groups[1])}, 2: {"failure": len(groups[2])}}
    assert [r["prompt_id"] for r in got] == sorted(want, key=lambda p: -len(groups[p]))
    for r in got:
        p = r["prompt_id"]
        assert (r["n_groups"], r["evicted"], r["trained"]) == (len(groups[p]), len(groups[p]), 0)
        assert dict(r["evicted_by_reason"]) == want[p]
        assert r["evicted_share"] == 1.0
    assert len(groups[1]) >= 2 and len(groups[2]) >= 2


def test_response_lengths_are_stored_at_ingest(scripted: tuple[Path, PromptRollout]) -> None:
    lake, ro = scripted
    traj = read_lake(lake)["trajectories"]
    assert traj.column("n_response_tokens").to_pylist() == \
        [len(x) for x in traj.column("response_ids").to_pylist()]
    con = connect(lake)
    lens = con.sql("select prompt_id, list(distinct response_len order by response_len) "
                   "from trajectory_fates group by prompt_id order by prompt_id").fetchall()
    assert lens == [(1, [1, 2]), (3, [3, 4])]        # prompt p answers with p and p + 1 tokens


# --- refill lineage -----------------------------------------------------------------------------

def _by_poll(dec: pa.Table) -> tuple[dict, list[dict]]:
    evicted: dict[tuple, list[str]] = {}
    refills = []
    for r in dec.to_pylist():
        key = (r["partition"], r["call_id"], r["poll"])
        if r["kind"] == "evict" and r["uid"] not in evicted.get(key, []):
            evicted.setdefault(key, []).append(r["uid"])
        elif r["kind"] == "refill":
            refills.append(r)
    return evicted, refills


def test_async_refills_name_exactly_the_groups_their_poll_evicted(
        scripted: tuple[Path, PromptRollout]) -> None:
    lake, _ = scripted
    evicted, refills = _by_poll(read_lake(lake)["decisions"])
    assert refills
    for r in refills:
        assert r["replaces"] == evicted[(r["partition"], r["call_id"], r["poll"])]
        assert r["count"] == len(r["replaces"])
    replaced = sorted(u for r in refills for u in r["replaces"])
    assert replaced == sorted(u for us in evicted.values() for u in us)


def test_async_refill_lineage_of_the_shared_sql_run() -> None:
    dec = read_lake(shared_run("async").lake)["decisions"]
    evicted, refills = _by_poll(dec)
    assert any(r["replaces"] for r in refills)
    for r in refills:
        assert r["replaces"] == evicted[(r["partition"], r["call_id"], r["poll"])]


def test_dapo_refills_spend_the_credit_of_their_calls_evictions() -> None:
    """Sync DAPO: a refill names evictions of its own call (earlier polls included), a filtered
    group at most twice (its credit is 2), a failure at most once."""
    dec = read_lake(shared_run("sync").lake)["decisions"].to_pylist()
    refills = [r for r in dec if r["kind"] == "refill"]
    assert refills and any(r["replaces"] for r in refills)
    for r in refills:
        earlier = {d["uid"]: d["reason"] for d in dec if d["kind"] == "evict" and
                   d["call_id"] == r["call_id"] and d["seq"] < r["seq"]}
        assert set(r["replaces"]) <= set(earlier)
        assert len(r["replaces"]) <= r["count"]
    named: dict[str, int] = {}
    for r in refills:
        for u in r["replaces"]:
            named[u] = named.get(u, 0) + 1
    reasons = {d["uid"]: d["reason"] for d in dec if d["kind"] == "evict"}
    assert all(n <= (1 if reasons[u] == "failure" else 2) for u, n in named.items())


def test_dapo_credit_is_spent_failures_first_then_oldest_and_split_groups_are_named_twice(
        ) -> None:
    st = CallState()
    st.owe(("a", "b", "c", "stale"), (2, 1, 2, 0))
    assert st.take(2) == ["b", "a"]         # b's failure credit, then half of a's
    assert st.take(2) == ["a", "c"]
    assert st.owed == [["c", 1, True]]
    assert st.take(5) == ["c"] and st.owed == []


def test_a_sync_failure_refill_names_the_failed_group(tmp_path: Path) -> None:
    made: list[str] = []

    def refill(k: int) -> None:
        uids = [f"r{len(made) + i}" for i in range(k)]
        made.extend(uids)
        buf.register(partition="train", uids=uids, global_steps=1, n=2, prompt_ids=[9] * k)
        for u in uids:
            _settle(buf, u, [0.0, 1.0])

    buf = ReplayBuffer.sync(lake=tmp_path / "lake", refill_fn=refill,
                            sync_refill_failed_groups=True, gen_batch_size=1)
    with buf:
        buf.register(partition="train", uids=["ok", "broken"], global_steps=1, n=2,
                     prompt_ids=[8, 9])
        _settle(buf, "ok", [0.0, 1.0])
        _settle(buf, "broken", None)
        assert sorted(buf.sample(1, "train", 2, timeout=10).uids) == ["ok", "r0"]
    dec = read_lake(tmp_path / "lake")["decisions"].to_pylist()
    assert [(r["count"], r["replaces"]) for r in dec if r["kind"] == "refill"] == \
        [(1, ["broken"])]
    assert [r["replaces"] for r in dec if r["kind"] != "refill"] == \
        [None] * (len(dec) - 1)


def test_a_restart_reads_back_the_lineage_it_wrote(tmp_path: Path,
                                                   scripted: tuple[Path, PromptRollout]) -> None:
    lake, _ = scripted
    before = read_lake(lake)
    copy = tmp_path / "lake"
    shutil.copytree(lake, copy)
    with ReplayBuffer.async_(lake=copy, filter_groups_metric="reward",
                             refill_fn=lambda k: None) as buf:
        assert buf.lookup("train", "u0").prompt_id == 1 or \
            buf.lookup("train", "u0").removed == "retired"
    after = read_lake(copy)
    for name in ("decisions", "group_events"):
        assert after[name].drop_columns(["ts"]).equals(before[name].drop_columns(["ts"]))


# --- lakes written before these columns existed -------------------------------------------------

@pytest.mark.parametrize("tier", ["live", "compacted"])
def test_a_lake_written_before_the_new_columns_opens_restores_and_answers(
        tmp_path: Path, scripted: tuple[Path, PromptRollout], tier: str) -> None:
    lake, _ = scripted
    old = tmp_path / "lake"
    shutil.copytree(lake, old)
    if tier == "compacted":
        compact(old)
        assert without_columns(old, NEW_COLUMNS, ("compacted",)) >= 3
    else:
        assert without_columns(old, NEW_COLUMNS, ("live",)) >= 3
    new_tables, old_tables = read_lake(lake), read_lake(old)
    assert old_tables["trajectories"].column("n_response_tokens").equals(
        new_tables["trajectories"].column("n_response_tokens"))
    assert old_tables["group_events"].column("prompt_id").null_count == \
        old_tables["group_events"].num_rows
    con_new, con_old = connect(lake), connect(old)
    for view in ("groups", "trajectory_fates", "batches", "provenance", "candidates"):
        cols = "* exclude (prompt_id)" if view in ("groups", "trajectory_fates") else "*"
        q = f"select {cols} from {view} order by all"
        assert con_old.sql(q).fetchall() == con_new.sql(q).fetchall(), view
    assert run(con_old, load("evicted_prompts")).num_rows == 0
    assert run(con_old, load("decision_log")).column("replaces").null_count > 0
    with ReplayBuffer.async_(lake=old, filter_groups_metric="reward",
                             refill_fn=lambda k: None) as buf:
        buf.register(partition="train", uids=["late"], global_steps=3, n=2, prompt_ids=[5])
        _settle(buf, "late", [0.0, 1.0], step=2)
        assert "late" in buf.candidates("train").column("uid").to_pylist()
    assert connect(old).sql(
        "select prompt_id from groups where uid = 'late'").fetchall() == [(5,)]
