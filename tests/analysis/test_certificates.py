"""The staleness certificate of a batch: the bound recorded with every selection, `batch.certificate`
from the live buffer and the `certificates` view from the lake (the same rows), and the audit
`certificate_holds`, on real buffers and real lakes (drop, wait, unbounded, a lake written before
the bound was recorded, and one whose selections break their recorded bound)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from jobs.audit import run_audits
from pipeline import ReplayBuffer
from pipeline.analysis.views import connect, read_lake
from pipeline.decide.certificate import COLUMNS
from pipeline.lake.compaction import compact
from sql.loader import run
from tests.support.lake import add_group
from tests.support.old_lake import without_columns
from tests.support.sql_runs import shared_run

NEW = ["bound", "strategy"]


def _lake_rows(lake: Path, batch_id: int) -> list[dict]:
    con = connect(lake)
    return con.sql("select * from certificates where batch_id = $b order by seq",
                   params={"b": batch_id}).to_arrow_table().to_pylist()


def test_every_batch_certificate_is_the_lake_views_rows_and_holds_under_drop() -> None:
    r = shared_run("async")          # drop(2), spans on odd sessions, a validation partition
    con = connect(r.lake)
    assert tuple(con.sql("select * from certificates limit 0").columns) == COLUMNS
    seen_spans = 0
    for b in r.batches:
        cert = b.certificate
        want = (r.threshold, "drop") if b.partition == "train" else (None, None)
        assert (cert.bound, cert.strategy) == want == (b.bound, b.strategy)
        assert (cert.step, cert.batch_id, cert.partition) == (b.step, b.batch_id, b.partition)
        assert cert.rows.column_names == list(COLUMNS)
        assert cert.rows.to_pylist() == _lake_rows(r.lake, b.batch_id), b.batch_id
        assert cert.holds and cert.violations.num_rows == 0
        seen_spans += cert.rows.column("span_tokens").null_count < cert.rows.num_rows
    assert seen_spans > 0                 # some rows reported version spans
    assert run(con, "certificate_holds").num_rows == 0
    assert con.sql("select distinct bound, strategy from batches order by all").fetchall() == [
        (r.threshold, "drop"), (None, None)]


def test_an_unbounded_run_records_no_bound_and_its_certificates_hold() -> None:
    r = shared_run("sync")
    assert {(b.certificate.bound, b.certificate.strategy) for b in r.batches} == {(None, None)}
    con = connect(r.lake)
    assert con.sql("select count(*) from decisions where kind = 'select' and bound is not null"
                   ).fetchall() == [(0,)]
    assert run(con, "certificate_holds").num_rows == 0


def _wait_run(lake: Path, linger: int) -> list:
    """wait(2), one group per batch: two groups finish at step 0; the second is trained
    ``linger`` steps after the first (group span 2 + linger)."""
    out = []
    with ReplayBuffer.async_(lake=lake, max_off_policy_threshold=2,
                             max_off_policy_strategy="wait", poll_interval=0.01) as buf:
        add_group(buf, "a", 0)
        add_group(buf, "b", 0)
        for g in (1, 1 + linger):
            b = buf.sample(g, "train", 1, timeout=5)
            buf.release(b)
            out.append(b)
    return out


def test_a_wait_run_holds_at_exactly_its_bound(tmp_path: Path) -> None:
    first, second = _wait_run(tmp_path / "lake", linger=0)
    for b in (first, second):
        cert = b.certificate
        assert (cert.bound, cert.strategy, cert.holds) == (2, "wait", True)
        assert set(cert.rows.column("group_span").to_pylist()) == {2}    # the bound itself
    assert run(connect(tmp_path / "lake"), "certificate_holds").num_rows == 0


def test_a_finished_group_left_waiting_past_the_wait_bound_is_named_by_both_engines(
        tmp_path: Path) -> None:
    """The wait gate looks at in-flight groups only: a finished group the batches did not take
    in time is trained over the bound, and the certificate says so (group span 3 > 2)."""
    first, second = _wait_run(tmp_path / "lake", linger=1)
    assert first.certificate.holds
    cert = second.certificate
    assert not cert.holds
    assert cert.violations.column("uid").to_pylist() == ["b", "b"]
    assert set(cert.violations.column("group_span").to_pylist()) == {3}
    found = run(connect(tmp_path / "lake"), "certificate_holds").to_pylist()
    assert [(x["uid"], x["seq"], x["bound"], x["strategy"], x["group_span"]) for x in found] == [
        ("b", s, 2, "wait", 3) for s in cert.violations.column("seq").to_pylist()]
    # `replaylake audit` passes the run: wait allows a finished group that waited, and says so
    audits = {a.name: a for a in run_audits(tmp_path / "lake")}
    assert (audits["certificate_holds"].status, audits["certificate_holds"].rows) == ("pass", [])
    assert audits["certificate_holds"].note.startswith("2 row(s) over the bound under `wait`, "
                                                       "which it allows: finished groups")
    # an explicit threshold on a wait run: its selections over T are wait's too, not failures
    over_t = {a.name: a for a in run_audits(tmp_path / "lake", threshold=2)}
    assert (over_t["stale_bound_respected"].status, over_t["stale_bound_respected"].note[:45]) \
        == ("pass", "1 row(s) over the bound under `wait`, which i")


def test_padding_rows_are_certified_but_never_violations(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    with ReplayBuffer.async_(lake=lake, max_off_policy_threshold=2,
                             max_off_policy_strategy="wait", poll_interval=0.01) as buf:
        add_group(buf, "a", 0)
        buf.register(partition="train", uids=["p"], global_steps=0)
        buf.put([{"partition": "train", "uid": "p", "session_id": s, "min_global_steps": 0,
                  "max_global_steps": 0, "reward": 0.0, "prompt_ids": [1], "response_ids": [2],
                  "is_padding": s == 1} for s in range(2)])
        buf.update_status(partition="train", uids=["p"], status="running")
        buf.update_status(partition="train", uids=["p"], status="finished")
        buf.release(buf.sample(1, "train", 1, timeout=5))
        late = buf.sample(2, "train", 1, timeout=5)        # p, at group span 3
    cert = late.certificate
    assert cert.rows.column("over_bound").to_pylist() == [True, True]
    assert cert.violations.column("is_padding").to_pylist() == [False]
    assert run(connect(lake), "certificate_holds").column("seq").to_pylist() == \
        cert.violations.column("seq").to_pylist()


@pytest.mark.parametrize("tier", ["live", "compacted"])
def test_a_lake_written_before_the_bound_was_recorded_reads_with_no_bound(
        tmp_path: Path, tier: str) -> None:
    old = tmp_path / "lake"
    shutil.copytree(shared_run("async").lake, old)
    if tier == "compacted":
        compact(old)
    assert without_columns(old, {"decisions": NEW}) >= 1
    decisions = read_lake(old, ("decisions",))["decisions"]
    assert decisions.column("bound").null_count == decisions.num_rows
    assert decisions.column("strategy").null_count == decisions.num_rows
    con = connect(old)
    assert con.sql("select count(*), count(bound) from certificates").fetchall()[0][1] == 0
    assert con.sql("select count(bound) from batches").fetchall() == [(0,)]
    assert run(con, "certificate_holds").num_rows == 0
    # its stale bound can still be checked from the threshold it recorded
    assert {a.name: a.status for a in run_audits(old)}["stale_bound_respected"] == "pass"
