"""`replaylake audit` on `drop` lakes recorded with per-dataset staleness bounds
(max_off_policy_threshold={"math": 1, "*": 3}): each selection is held to its own dataset's bound,
or the "*" default for a dataset the mapping does not name and a group without one; `--threshold
N` holds every selection to the one bound N. Real buffers writing real lakes, real DuckDB."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jobs.audit import audit_bounds, run_audits
from jobs.cli import app
from pipeline import ReplayBuffer
from pipeline.config import ThresholdError
from tests.analysis.test_audits import _append
from tests.support.lake import traj

BOUNDS = {"math": 1, "*": 3}
STEP = 4
# the groups the run trains at STEP, each at its own bound: (uid, dispatch step, dataset)
WITHIN = [("m", 4, "math"), ("c", 2, "code"), ("n", 2, None)]


def _finished(buf: ReplayBuffer, uid: str, gs: int, dataset: str | None) -> None:
    """Register ``uid`` (dispatched at ``gs``, of ``dataset``), fill it and finish it."""
    buf.register(partition="train", uids=[uid], global_steps=gs, n=2,
                 **({} if dataset is None else {"dataset": dataset}))
    v = max(gs - 1, 0)
    buf.put([traj(uid, s, min_gs=v, max_gs=v, reward=float(s)) for s in range(2)])
    buf.update_status(partition="train", uids=[uid], status="finished")


def _mapping_lake(lake: Path, late_math: int = 0) -> Path:
    """A `drop` run under BOUNDS that trains the WITHIN groups at STEP (math at group span 1, code
    at 3, the group without a dataset at 3: each exactly its own bound), then registers
    ``late_math`` math groups dispatched at STEP - 1 and finishes them, undecided."""
    with ReplayBuffer.async_(lake=lake, max_off_policy_threshold=BOUNDS, poll_interval=0.05) as buf:
        for uid, gs, dataset in WITHIN:
            _finished(buf, uid, gs, dataset)
        batch = buf.sample(global_steps=STEP, partition="train", batch_size=len(WITHIN), timeout=5)
        assert sorted(batch.uids) == sorted(u for u, _, _ in WITHIN)
        buf.release(batch)
        for i in range(late_math):
            _finished(buf, f"late{i}", STEP - 1, "math")
    return lake


def _select_over_math_bound(lake: Path, n: int) -> list[str]:
    """The `late` math groups selected at STEP, group span 2, recording the default bound 3: what
    a buffer that gave math groups the "*" bound would have written (within the bound it
    recorded, over math's own)."""
    uids = [f"late{i}" for i in range(n)]
    _append(lake, "decisions", [{"partition": "train", "step": STEP, "call_id": 99, "poll": 0,
                                 "kind": "select", "uid": u, "group_span": 2, "batch_id": 99,
                                 "count": 1, "bound": 3, "strategy": "drop"} for u in uids])
    return uids


def _audit(lake: Path, *args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, ["audit", "--lake", str(lake), *args], env={"COLUMNS": "100"})
    return res.exit_code, res.output


def test_a_run_within_its_per_dataset_bounds_passes(tmp_path: Path) -> None:
    lake = _mapping_lake(tmp_path / "lake")
    code, out = _audit(lake)
    assert code == 0, out
    assert "pass  stale_bound_respected" in out and "12 passed, 0 failed, 0 skipped" in out
    stale = {a.name: a for a in run_audits(lake)}["stale_bound_respected"]
    assert (stale.params, stale.by_dataset) == ({"threshold": 3}, {"math": 1})


def test_an_explicit_threshold_holds_every_group_to_that_one_bound(tmp_path: Path) -> None:
    """`--threshold 2` on the same lake: the code group and the one without a dataset (group
    span 3) are over 2, whatever the mapping gave them; the math group (1) is not."""
    lake = _mapping_lake(tmp_path / "lake")
    code, out = _audit(lake, "--threshold", "2")
    assert code == 1, out
    stale = {a.name: a for a in run_audits(lake, threshold=2)}["stale_bound_respected"]
    assert stale.status == "FAIL" and stale.by_dataset == {}
    assert [(r["uid"], r["dataset"], r["bound"], r["group_span"]) for r in stale.rows] == [
        ("c", "code", 2, 3), ("n", None, 2, 3)]


def test_a_selection_over_its_own_datasets_bound_fails(tmp_path: Path) -> None:
    """A math group selected at group span 2 under math's bound 1 fails the audit, though it is
    within the default bound 3 its selection recorded (so `certificate_holds` passes it)."""
    lake = _mapping_lake(tmp_path / "lake", late_math=1)
    [late] = _select_over_math_bound(lake, 1)
    code, out = _audit(lake)
    assert code == 1, out
    assert out.splitlines()[-1] == "11 passed, 1 failed, 0 skipped: FAILED stale_bound_respected"
    stale = {a.name: a for a in run_audits(lake)}["stale_bound_respected"]
    assert [(r["uid"], r["dataset"], r["bound"], r["group_span"], r["strategy"])
            for r in stale.rows] == [(late, "math", 1, 2, "drop")]


def test_the_listing_command_under_per_dataset_bounds_runs_as_printed(tmp_path: Path) -> None:
    """More violating rows than shown: the printed `replaylake sql` command gives the bounds
    the audit joined inline, and lists exactly the rows the audit found."""
    lake = _mapping_lake(tmp_path / "lake", late_math=6)
    uids = _select_over_math_bound(lake, 6)
    code, out = _audit(lake)
    assert code == 1, out
    hint = re.search(r"\(\+1 more; all of them:\) replaylake (sql .*) 11 passed",
                     " ".join(out.split()))
    assert hint and "('math', 1)" in hint.group(1), out
    listed = CliRunner().invoke(app, [*shlex.split(hint.group(1)), "--format", "json"])
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.output)
    assert [(r["uid"], r["bound"]) for r in rows] == [(u, 1) for u in uids]


@pytest.mark.parametrize(("recorded", "threshold", "want"), [
    ({"max_off_policy_strategy": "drop", "max_off_policy_threshold": BOUNDS}, None,
     (3, {"math": 1})),
    ({"max_off_policy_strategy": "drop", "max_off_policy_threshold": 2}, None, (2, {})),
    ({"max_off_policy_strategy": "drop", "max_off_policy_threshold": None}, None, (None, {})),
    ({"max_off_policy_strategy": "drop", "max_off_policy_threshold": BOUNDS}, 5, (5, {})),
    ({"max_off_policy_strategy": "wait", "max_off_policy_threshold": 2}, None, (None, {})),
    ({"max_off_policy_strategy": "mask", "max_off_policy_threshold": 2}, None, (None, {})),
    # admit keeps the stale rule on as its safety net: its selections are bounded too
    ({"max_off_policy_strategy": "admit", "max_off_policy_threshold": 2}, None, (2, {})),
    (None, None, (None, {})),
])
def test_the_bounds_an_audit_holds_selections_to(recorded: dict | None, threshold: int | None,
                                                  want: tuple) -> None:
    assert audit_bounds(recorded, threshold) == want


def test_a_recorded_threshold_the_audit_cannot_read_names_the_way_out() -> None:
    with pytest.raises(ThresholdError, match=r"has no '\*' entry.*--threshold N"):
        audit_bounds({"max_off_policy_strategy": "drop", "max_off_policy_threshold": {"math": 1}},
                     None)
