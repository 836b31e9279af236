"""The audits of sql/audits/: empty on real buffer runs, and each one fires when the lake is tampered
with the kind of row its invariant forbids (written through the real journal and lake writer)."""
from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from jobs.audit import run_audits
from pipeline.analysis.views import connect
from pipeline.lake.files import QUARANTINE_DIR
from pipeline.lake.writer import LakeWriter, read_table
from pipeline.state.journal import Journal
from schemas import LAKE_TABLES
from sql.loader import in_folder, run
from tests.support.sql_runs import Run, shared_run


def _append(lake: Path, table: str, rows: list[dict]) -> None:
    """Append rows the way the buffer does: stamped with the next seq numbers, written durably."""
    next_seq = max((int(read_table(lake, t)["seq"].to_numpy().max(initial=-1))
                    for t in LAKE_TABLES), default=-1) + 1
    writer = LakeWriter(lake)
    try:
        Journal(writer, next_seq).record_rows(table, rows)
    finally:
        writer.close()


def _group(lake: Path, fate: str) -> dict:
    con = connect(lake)
    rows = con.sql("select * from groups where fate = $f and partition = 'train' "
                   "order by registered_seq limit 1", params={"f": fate}).to_arrow_table()
    return rows.to_pylist()[0]


def _traj(g: dict) -> dict:
    return {"partition": g["partition"], "uid": g["uid"], "session_id": 99, "index": 0,
            "min_global_steps": 0, "max_global_steps": 0, "reward": 0.0, "prompt_ids": [1],
            "response_ids": [2], "is_padding": False}


def _in_two_batches(lake: Path) -> str:
    g = _group(lake, "sampled")
    _append(lake, "decisions", [{"partition": "train", "step": 99, "call_id": 99, "poll": 0,
                                 "kind": "select", "uid": g["uid"], "group_span": 1, "batch_id": 999,
                                 "count": 1}])
    return g["uid"]


def _late_trajectory_of_sampled(lake: Path) -> str:
    g = _group(lake, "sampled")
    _append(lake, "trajectories", [_traj(g)])
    return g["uid"]


def _stale_selection(lake: Path) -> str:
    g = _group(lake, "live")
    _append(lake, "decisions", [{"partition": "train", "step": g["global_steps"] + 50,
                                 "call_id": 99, "poll": 0, "kind": "select", "uid": g["uid"],
                                 "group_span": 51, "batch_id": 999, "count": 1}])
    return g["uid"]


def _select_over_its_bound(lake: Path) -> str:
    """A live group with trajectories selected at group span 3 under a recorded bound of 2 (as a
    buffer whose threshold was lower than its groups' spans would have)."""
    con = connect(lake)
    g = con.sql("select g.* from groups g join trajectories t using (partition, uid) "
                "where g.fate = 'live' and g.partition = 'train' and g.n_traj > 0 "
                "order by g.registered_seq limit 1").to_arrow_table().to_pylist()[0]
    _append(lake, "decisions", [{"partition": "train", "step": g["global_steps"] + 2,
                                 "call_id": 99, "poll": 0, "kind": "select", "uid": g["uid"],
                                 "group_span": 3, "batch_id": 999, "count": 1, "bound": 2,
                                 "strategy": "drop"}])
    return g["uid"]


def _evict_after_select(lake: Path) -> str:
    g = _group(lake, "sampled")
    _append(lake, "decisions", [{"partition": "train", "step": 99, "call_id": 99, "poll": 0,
                                 "kind": "evict", "uid": g["uid"], "reason": "stale", "group_span": 9,
                                 "count": 1}])
    return g["uid"]


def _late_trajectory_of_evicted(lake: Path) -> str:
    g = _group(lake, "evicted")
    _append(lake, "trajectories", [_traj(g)])
    return g["uid"]


def _second_terminal(lake: Path) -> str:
    g = _group(lake, "evicted")
    _append(lake, "group_events", [{"partition": "train", "uid": g["uid"], "event": "failure",
                                    "global_steps": g["global_steps"]}])
    return g["uid"]


def _trained_at_step_zero(lake: Path) -> str:
    """A live group selected at step 0: its versions (>= 0) are from the training step's future."""
    con = connect(lake)
    g = con.sql("select g.* from groups g join trajectories t using (partition, uid) "
                "where g.fate = 'live' and g.partition = 'train' and g.n_traj > 0 "
                "order by g.registered_seq limit 1").to_arrow_table().to_pylist()[0]
    _append(lake, "decisions", [{"partition": "train", "step": 0, "call_id": 99, "poll": 0,
                                 "kind": "select", "uid": g["uid"], "group_span": 1,
                                 "batch_id": 999, "count": 1}])
    return g["uid"]


def _trajectory_sent_twice(lake: Path) -> str:
    """A trajectory of a sampled group stored again under its own key: accepted twice."""
    g = _group(lake, "sampled")
    _append(lake, "trajectories", [dict(_traj(g), session_id=0)])
    return g["uid"]


def _finished_without_a_session(lake: Path) -> str:
    """A group registered for 3 sessions that finished holding one (trajectories lost)."""
    event = {"partition": "train", "uid": "short", "global_steps": 1}
    _append(lake, "group_events", [dict(event, event="registered", n=3)])
    _append(lake, "trajectories", [dict(_traj(event), session_id=0)])
    _append(lake, "group_events", [dict(event, event="running"), dict(event, event="finished")])
    return "short"


def _orphan_in_a_salvaged_partition(lake: Path) -> str:
    """A trajectory of a group never registered, where a salvage set group events aside (so
    readers read on, as they do after a salvage that lost a registration)."""
    writer = LakeWriter(lake)
    try:
        writer.record_removed([f"{QUARANTINE_DIR}/then/group_events/partition=train/lost.arrow"])
    finally:
        writer.close()
    _append(lake, "trajectories", [_traj({"partition": "train", "uid": "ghost"})])
    return "ghost"


TAMPERS: dict[str, Callable[[Path], str]] = {
    "certificate_holds": _select_over_its_bound,
    "finished_groups_complete": _finished_without_a_session,
    "no_orphan_rows": _orphan_in_a_salvaged_partition,
    "no_trajectory_twice": _trajectory_sent_twice,
    "no_trajectory_in_two_batches": _in_two_batches,
    "no_future_versions": _trained_at_step_zero,
    "no_group_in_two_batches": _in_two_batches,
    "no_partial_group_in_batch": _late_trajectory_of_sampled,
    "stale_bound_respected": _stale_selection,
    "conservation": _evict_after_select,
    "no_trajectory_after_terminal": _late_trajectory_of_evicted,
    "no_double_terminal": _second_terminal,
}


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_every_audit_is_empty_on_a_real_run(kind: str) -> None:
    r: Run = shared_run(kind)
    results = run_audits(r.lake, threshold=r.threshold or 1_000_000)
    assert {x.name: x.rows for x in results} == {q.name: [] for q in in_folder("audits")}


def test_rows_a_strategy_allows_are_counted_apart_and_the_others_still_fail(tmp_path: Path
                                                                           ) -> None:
    """A selection over its bound under `wait` or `mask` is that strategy's design (a note, not a
    failure); one under `drop` in the same lake still fails the audit."""
    lake = tmp_path / "lake"
    shutil.copytree(shared_run("async").lake, lake)
    dropped = _select_over_its_bound(lake)
    con = connect(lake)
    others = con.sql("select g.* from groups g join trajectories t using (partition, uid) "
                     "where g.fate = 'live' and g.partition = 'train' and g.uid <> $u "
                     "order by g.registered_seq limit 2", params={"u": dropped}
                     ).to_arrow_table().to_pylist()
    _append(lake, "decisions", [
        {"partition": "train", "step": g["global_steps"] + 2, "call_id": 99, "poll": 0,
         "kind": "select", "uid": g["uid"], "group_span": 3, "batch_id": 998, "count": 1,
         "bound": 2, "strategy": strategy} for g, strategy in zip(others, ("wait", "mask"))])
    audit = {a.name: a for a in run_audits(lake)}["certificate_holds"]
    assert audit.status == "FAIL"
    assert {(r["uid"], r["strategy"]) for r in audit.rows} == {(dropped, "drop")}
    assert "over the bound under `wait`, which it allows" in audit.note
    assert "over the bound under `mask`, which it allows: the masked rows" in audit.note


def test_every_audit_has_a_tampering_test() -> None:
    assert sorted(TAMPERS) == sorted(q.name for q in in_folder("audits"))


@pytest.mark.parametrize("audit", sorted(TAMPERS))
def test_audit_fires_on_a_tampered_lake(audit: str, tmp_path: Path) -> None:
    r = shared_run("async")
    lake = tmp_path / "lake"
    shutil.copytree(r.lake, lake)
    uid = TAMPERS[audit](lake)
    params = {"threshold": r.threshold} if audit == "stale_bound_respected" else {}
    found = run(connect(lake), audit, **params).to_pylist()
    assert found and {row["uid"] for row in found} == {uid}


def test_audit_fails_after_a_salvage_lost_a_finished_groups_trajectories(lake: Path) -> None:
    from typer.testing import CliRunner

    from jobs.cli import app
    from pipeline import ReplayBuffer
    from pipeline.lake.recovery import salvage
    from pipeline.lake.writer import segment_files
    from tests.support.lake import add_group
    from tests.support.lake_damage import write_ends, zero_bytes
    with ReplayBuffer.sync(lake=lake) as buf:
        for uid in ("g0", "g1", "g2"):
            add_group(buf, uid, 1, [0.0, 1.0, 0.0, 1.0], n=4)
    [seg] = segment_files(lake, "trajectories")
    zero_bytes(seg, write_ends(seg)[0] + 5, 4)     # g1's put: its four trajectories
    assert salvage(lake).lost_writes == 1
    res = CliRunner().invoke(app, ["audit", "--lake", str(lake)])
    assert res.exit_code == 1, res.output
    assert "FAIL  finished_groups_complete (1 violating row(s))" in res.output
    assert "uid=g1, n_expected=4, n_sessions=0, missing=[0, 1, 2, 3]" in " ".join(res.output.split())
    assert max(len(line) for line in res.output.splitlines()) <= 80     # wrapped, not 200 wide


def test_the_command_listing_every_violating_row_runs_as_printed() -> None:
    """More rows than shown: the audit prints the `replaylake sql` command listing them all,
    with the parameters it ran with, and that command runs."""
    import re
    import shlex

    from typer.testing import CliRunner

    from jobs.cli import app
    r = shared_run("async")
    res = CliRunner().invoke(app, ["audit", "--lake", str(r.lake), "--threshold", "1"],
                             env={"COLUMNS": "80"})
    assert res.exit_code == 1, res.output
    lines = res.output.splitlines()
    # the command to paste is printed whole on a line of its own; every other line fits 80
    commands = [line.strip() for line in lines if line.strip().startswith("replaylake sql ")]
    assert max(len(line) for line in lines if line.strip() not in commands) <= 80
    hint = re.search(r"\(\+[\d,]+ more; all of them:\)\n\s*replaylake (sql .*)", res.output)
    assert hint and "--param threshold=1" in hint.group(1)
    listed = CliRunner().invoke(app, [*shlex.split(hint.group(1)), "--format", "json"])
    assert listed.exit_code == 0, listed.output
