"""How a what-if replay follows the recorded calls: each call's polls see what the recorded
call's polls saw (not what an earlier call left over), and the calls that handed out no batch
(a timeout, a refill_fn that raised, a process killed mid-call) are replayed with their
evictions."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jobs.cli import app
from pipeline import ReplayBuffer, SampleTimeout
from pipeline.analysis import connect
from pipeline.analysis.whatif.rerun import recorded, replay
from tests.analysis.test_whatif import cells, notes

ROOT = Path(__file__).resolve().parents[2]


def _rows(uid: str, version: int, rewards: list[float]) -> list[dict]:
    return [{"partition": "train", "uid": uid, "session_id": s, "min_global_steps": version,
             "max_global_steps": version, "reward": r, "prompt_ids": [1, 2],
             "response_ids": [3, 4]} for s, r in enumerate(rewards)]


def _finished(buf: ReplayBuffer, uid: str, step: int, version: int,
              rewards: tuple[float, float] = (0.0, 1.0)) -> None:
    """A group dispatched at ``step``, generated with weights ``version``, finished."""
    buf.register(partition="train", uids=[uid], global_steps=step, n=2)
    buf.put(_rows(uid, version, list(rewards)))
    buf.update_status(partition="train", uids=[uid], status="finished")


def _lag_run(lake: Path, threshold: int) -> None:
    """Two steps of the DAPO filter with a refill_fn. Under threshold 1 the step-2 call evicts
    `o` as stale, refills and polls twice; under 4 it takes `o` at its first poll. At step 3 a
    zero-variance group `z` arrives before the call: the filter evicts it at step 3."""
    asked, step = [0], [2]

    def refill(n: int) -> None:
        for _ in range(n):
            asked[0] += 1
            _finished(buf, f"r{asked[0]}", step[0], step[0] - 1)

    buf = ReplayBuffer.async_(lake=lake, max_off_policy_threshold=threshold,
                              filter_groups_metric="reward", refill_fn=refill,
                              poll_interval=0.001)
    with buf:
        _finished(buf, "o", 0, 0)
        _finished(buf, "p", 2, 1)
        _finished(buf, "q", 2, 1)
        buf.release(buf.sample(2, "train", 1, timeout=10))
        step[0] = 3
        _finished(buf, "z", 3, 2, rewards=(1.0, 1.0))
        _finished(buf, "w", 3, 2)
        buf.release(buf.sample(3, "train", 1, timeout=10))


def _decided(lake: Path) -> list[tuple]:
    """Every eviction and selection, per step, in the order taken."""
    return connect(lake).sql(
        "select step, kind, uid, reason from decisions where kind in ('evict', 'select') "
        "order by seq").fetchall()


def test_a_call_that_polls_less_than_recorded_leaves_the_next_call_its_own_arrivals(
        tmp_path: Path) -> None:
    _lag_run(tmp_path / "t1", threshold=1)
    _lag_run(tmp_path / "t4", threshold=4)
    got = replay(tmp_path / "t1", tmp_path / "replay", max_off_policy_threshold=4)
    live = _decided(tmp_path / "t4")
    assert (3, "evict", "z", "zero_variance") in live
    assert _decided(got.lake) == live
    assert got.batches == recorded(tmp_path / "t4").batches == [["o"], ["p"]]
    # its step-3 refill draws `r1`, which the recorded run asked for at step 2
    assert (got.refill_later, got.refill_earlier) == (1, 0)


def _timed_out_run(lake: Path) -> None:
    """A step-3 call that evicts `old` as stale and then times out (no refill_fn)."""
    with ReplayBuffer.async_(lake=lake, max_off_policy_threshold=1, filter_groups_metric=None,
                             poll_interval=0.001) as buf:
        _finished(buf, "a", 1, 0)
        buf.release(buf.sample(1, "train", 1, timeout=10))
        _finished(buf, "old", 1, 0)
        with pytest.raises(SampleTimeout):
            buf.sample(3, "train", 1, timeout=0.2)


def _failing_refill_run(lake: Path) -> None:
    """A step-2 call whose refill_fn raises after the call evicted a zero-variance group; the
    trainer retries the step and the retry's refill is served."""
    calls = [0]

    def refill(n: int) -> None:
        calls[0] += 1
        if calls[0] == 1:
            raise ConnectionError("the rollout side is down")
        for i in range(n):
            _finished(buf, f"r{i}", 2, 1)

    buf = ReplayBuffer.async_(lake=lake, max_off_policy_threshold=2,
                              filter_groups_metric="reward", refill_fn=refill,
                              poll_interval=0.001)
    with buf:
        _finished(buf, "a", 1, 0)
        buf.release(buf.sample(1, "train", 1, timeout=10))
        _finished(buf, "flat", 2, 1, rewards=(1.0, 1.0))
        _finished(buf, "b", 2, 1)
        with pytest.raises(ConnectionError):
            buf.sample(2, "train", 2, timeout=10)
        buf.release(buf.sample(2, "train", 2, timeout=10))


_KILLED = """
import os, signal, sys
from pipeline import ReplayBuffer
rows = lambda uid, v, rw: [{"partition": "train", "uid": uid, "session_id": s,
    "min_global_steps": v, "max_global_steps": v, "reward": r, "prompt_ids": [1, 2],
    "response_ids": [3, 4]} for s, r in enumerate(rw)]
def finished(uid, step, rw=(0.0, 1.0)):
    buf.register(partition="train", uids=[uid], global_steps=step, n=2)
    buf.put(rows(uid, step - 1, list(rw)))
    buf.update_status(partition="train", uids=[uid], status="finished")
def refill(n):
    if step == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    for i in range(n):
        finished(f"r{step}_{i}", step)
buf = ReplayBuffer.async_(lake=sys.argv[1], max_off_policy_threshold=2,
                          filter_groups_metric="reward", refill_fn=refill, poll_interval=0.001)
for step in (1, 2):
    finished(f"flat{step}", step, (1.0, 1.0))
    finished(f"g{step}", step)
    buf.release(buf.sample(step, "train", 2, timeout=10))
"""


def _killed_run(lake: Path) -> None:
    """A process killed inside refill_fn, after its step-2 call evicted a zero-variance group."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(_KILLED), str(lake)],
                          cwd=ROOT, capture_output=True, timeout=120)
    assert done.returncode == -9, done.stderr.decode()


@pytest.mark.parametrize("run", [_timed_out_run, _failing_refill_run, _killed_run],
                         ids=["timeout", "refill_fn raised", "killed"])
def test_a_call_that_evicted_and_handed_out_no_batch_is_replayed_with_its_evictions(
        tmp_path: Path, run: Callable[[Path], None]) -> None:
    lake = tmp_path / "lake"
    run(lake)
    res = CliRunner().invoke(app, ["whatif", "--lake", str(lake), "--out",
                                   str(tmp_path / "replay")])
    assert res.exit_code == 0, res.output
    got = cells(res.output)
    assert got["evicted"][0] != "0" and got["evicted"][0] == got["evicted"][1]
    assert res.output.splitlines()[0].startswith("replayed ")
    assert " and 1 that handed out no batch " in res.output.splitlines()[0]
    rec = connect(lake).sql("select step, kind, uid, reason from decisions "
                            "where kind <> 'release' order by seq").fetchall()
    assert connect(tmp_path / "replay" / "lake").sql(
        "select step, kind, uid, reason from decisions where kind <> 'release' "
        "order by seq").fetchall() == rec


def test_other_settings_name_the_calls_that_handed_out_no_batch(tmp_path: Path) -> None:
    _timed_out_run(tmp_path / "lake")
    res = CliRunner().invoke(app, ["whatif", "--lake", str(tmp_path / "lake"), "--threshold",
                                   "none", "--out", str(tmp_path / "replay")])
    assert res.exit_code == 0, res.output
    assert cells(res.output)["evicted"] == ("1", "0")
    said = [n for n in notes(res.output) if n.startswith("calls without a batch")]
    assert len(said) == 1 and "1 recorded call(s) (step 3)" in said[0]


def test_a_call_that_polls_past_its_recorded_release_releases_its_batch_at_once(
        tmp_path: Path) -> None:
    from pipeline.analysis.whatif.record import Record
    from tests.support.sql_runs import shared_run
    lake = shared_run("async").lake
    # the wait gate holds calls past their recorded polls, and past their batches' releases
    got = replay(lake, tmp_path, max_off_policy_strategy="wait", max_off_policy_threshold=1)
    assert got.waited and got.unfilled
    with Record(lake) as record:
        calls, released = record.calls()
    handed = [c for c in calls if c.selected]
    assert len(got.batches) == len(handed)       # one per recorded batch, [] where unfilled
    assert sum(b == [] for b in got.batches) == len(got.unfilled)
    want = sum(bool(b) and (c.partition, c.batch_id) in released
               for b, c in zip(got.batches, handed))
    assert want > 0
    assert connect(got.lake).sql("select count(distinct batch_id) from decisions "
                                 "where kind = 'release'").fetchall() == [(want,)]
