"""What-if replays of runs with several training partitions: each partition's refill draws the
groups its own recorded refills registered, and the approximations blame the recorded
refill_fn's timing only where its groups were registered after the run had moved on."""
from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from jobs.cli import app
from pipeline import ReplayBuffer
from pipeline.analysis import connect
from pipeline.analysis.whatif.rerun import recorded, replay
from tests.analysis.test_whatif import notes

LATE_NOTE = "returned before registering"


def _group(buf: ReplayBuffer, partition: str, uid: str, step: int, rewards: tuple[float, ...],
           version: int) -> None:
    """A group of ``partition`` dispatched at ``step``, generated with weights ``version``,
    finished."""
    buf.register(partition=partition, uids=[uid], global_steps=step, n=len(rewards))
    buf.put([{"partition": partition, "uid": uid, "session_id": s, "min_global_steps": version,
              "max_global_steps": version, "reward": r, "prompt_ids": [1, 2],
              "response_ids": [3, 4, 5]} for s, r in enumerate(rewards)])
    buf.update_status(partition=partition, uids=[uid], status="finished")


def _two_partitions_run(lake: Path) -> None:
    """Two training partitions under drop with threshold 2 and the DAPO filter; refill_fn
    registers each new group in the partition that asked before it returns. At step 3 `train`
    evicts `t-old` as stale (kept under threshold 3) and refills with `train-r1`; `math` evicts
    `m-zv` (zero variance, under any threshold) and refills with `math-r2`."""
    asking = {"partition": "train", "step": 3}
    made = [0]

    def refill(n: int) -> None:
        for _ in range(n):
            made[0] += 1
            part, step = asking["partition"], asking["step"]
            _group(buf, part, f"{part}-r{made[0]}", step, (0.0, 1.0), version=step)

    buf = ReplayBuffer.async_(lake=lake, max_off_policy_threshold=2, filter_groups_metric="reward",
                              refill_fn=refill, poll_interval=0.001)
    with buf:
        _group(buf, "train", "t-old", 1, (0.0, 1.0), version=1)
        _group(buf, "train", "t-ok", 3, (0.0, 1.0), version=2)
        _group(buf, "math", "m-zv", 3, (1.0, 1.0), version=2)
        _group(buf, "math", "m-ok", 3, (0.0, 1.0), version=2)
        for step in (3, 4):
            for part in ("train", "math"):
                asking.update(partition=part, step=step)
                buf.release(buf.sample(step, part, 1, timeout=10))


def _groups(lake: Path) -> set[tuple[str, str]]:
    return set(connect(lake).sql("select partition, uid from groups").fetchall())


def test_each_partitions_refill_draws_its_own_recorded_refill_groups(tmp_path: Path) -> None:
    _two_partitions_run(tmp_path / "rec")
    assert recorded(tmp_path / "rec").batches == [["t-ok"], ["m-ok"], ["train-r1"], ["math-r2"]]
    assert replay(tmp_path / "rec", tmp_path / "same").batches == \
        recorded(tmp_path / "rec").batches
    # threshold 3 keeps `t-old`, so train asks for no refill; math's refill is as recorded
    got = replay(tmp_path / "rec", tmp_path / "t3", max_off_policy_threshold=3)
    assert got.batches == [["t-old"], ["m-ok"], ["t-ok"], ["math-r2"]]
    assert got.unfilled == [] and got.refill_shortfall == 0
    # train's refill group was never asked for, and is not in the replay
    assert (got.refill_undrawn, got.refill_late) == (1, 0)
    assert ("train", "train-r1") not in _groups(got.lake)


def test_refills_registered_right_after_the_ask_are_not_blamed_on_refill_fn_timing(
        tmp_path: Path) -> None:
    _two_partitions_run(tmp_path / "rec")
    res = CliRunner().invoke(app, ["whatif", "--lake", str(tmp_path / "rec"), "--threshold", "3",
                                   "--out", str(tmp_path / "t3")])
    assert res.exit_code == 0, res.output
    assert "identical batches: 2 of 4; unfilled steps: none" in " ".join(res.output.split())
    said = notes(res.output)
    assert "refills: 1 group(s) the recorded refills registered were never asked for by the " \
           "replay, so they are not in it" in said
    assert not [n for n in said if LATE_NOTE in n]


def _late_refill_run(lake: Path) -> None:
    """A refill_fn that hands the ask on and returns: the group it asked for (`r1`) is
    registered after the call chose its batch, and after the trainer registered `b`."""
    asked: list[int] = []
    buf = ReplayBuffer.async_(lake=lake, max_off_policy_threshold=2, filter_groups_metric="reward",
                              refill_fn=asked.append, poll_interval=0.001)
    with buf:
        _group(buf, "train", "z", 1, (1.0, 1.0), version=0)
        _group(buf, "train", "a", 1, (0.0, 1.0), version=0)
        buf.release(buf.sample(1, "train", 1, timeout=10))
        assert asked == [1]
        _group(buf, "train", "b", 2, (0.0, 1.0), version=1)
        _group(buf, "train", "r1", 1, (0.0, 1.0), version=1)
        buf.release(buf.sample(2, "train", 1, timeout=10))


def test_refills_registered_after_the_run_moved_on_are_named_as_a_guess(tmp_path: Path) -> None:
    _late_refill_run(tmp_path / "rec")
    got = replay(tmp_path / "rec", tmp_path / "off", filter_groups_metric=None)
    assert (got.refill_undrawn, got.refill_late) == (1, 1)
    res = CliRunner().invoke(app, ["whatif", "--lake", str(tmp_path / "rec"), "--filter-metric",
                                   "none", "--out", str(tmp_path / "cli")])
    assert res.exit_code == 0, res.output
    late = [n for n in notes(res.output) if LATE_NOTE in n]
    assert len(late) == 1 and "1 of them were registered only after the run's next decision" \
        in late[0]
