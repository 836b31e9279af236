"""Resuming a demo run: what `hand_back` gives the rollout workers and the trainer after a
restart (with and without sibling reuse), the waves a group's sessions are generated in, and the
run directories and settings a resume refuses. The whole kill-and-resume is the resume
harness's test (tests/jobs/dev/test_resume_harness.py)."""
from __future__ import annotations

import pytest

from jobs.demo.config import DemoConfig, RunDirError, make_run_dir, read_config, write_config
from jobs.demo.policy import dataset_index, prompt_of
from jobs.demo.resume import hand_back
from jobs.demo.rollout import _waves
from pipeline import ConfigError, ReplayBuffer
from tests.support.lake import traj


class Queue:
    """The rollout side as `hand_back` sees it: what it was asked to generate."""

    def __init__(self) -> None:
        self.items: list = []

    def requeue(self, items: list) -> None:
        self.items += items


def crashed(lake) -> int:
    """A run killed with batch 0 (step 1, checkpointed) and batch 1 (step 2, not) held, group
    `half` with sessions 0 and 2 of 4 stored and `none` with none; returns batch 1's id."""
    with ReplayBuffer.async_(lake=lake, max_off_policy_threshold=5) as buf:
        ids = {u: dataset_index([i + 1, 2]) for i, u in enumerate(("a", "b", "half", "none"))}
        for u in ids:
            buf.register(partition="train", uids=[u], global_steps=1, n=4, prompt_ids=[ids[u]])
        for u in ("a", "b"):
            buf.put([traj(u, s, reward=float(s % 2)) for s in range(4)])
            buf.update_status(partition="train", uids=[u], status="finished")
        buf.update_status(partition="train", uids=["half", "none"], status="running")
        buf.put([traj("half", s, reward=1.0, response=(5, 6, 7)) for s in (0, 2)])
        buf.sample(1, "train", 1, timeout=5)
        return buf.sample(2, "train", 1, timeout=5).batch_id


def test_with_reuse_only_the_missing_sessions_go_back_and_the_unsaved_batch_is_trained_first(lake):
    second = crashed(lake)
    q = Queue()
    with ReplayBuffer.async_(lake=lake, max_off_policy_threshold=5) as buf:
        back = hand_back(buf, q, n=4, done=1, reuse=True)
        assert q.items == [("half", [3, 2], [1, 3]), ("none", [4, 2], [0, 1, 2, 3])]
        assert (back.groups, back.sessions, back.kept, back.released) == (2, 6, 2, 1)
        assert back.held.batch_id == second and back.held.step == 2
        assert list(buf.held_batches("train")) == [second]     # batch 0 was in the checkpoint
        assert buf.lookup("train", "half").sessions == {0, 2}


def test_without_reuse_whole_groups_go_back(lake):
    crashed(lake)
    q = Queue()
    with ReplayBuffer.async_(lake=lake, max_off_policy_threshold=5) as buf:
        back = hand_back(buf, q, n=4, done=2, reuse=False)
        assert [(u, s) for u, _, s in q.items] == [("half", [0, 1, 2, 3]),
                                                   ("none", [0, 1, 2, 3])]
        assert (back.kept, back.released, back.held) == (0, 2, None)   # both checkpointed
        assert buf.lookup("train", "half").sessions == frozenset()


def test_waves_split_each_group_s_sessions_in_order():
    items = [("a", [1], [0, 1, 2, 3]), ("b", [2], [3]), ("c", [3], [])]
    assert _waves(items, 2) == [[("a", [1], 0), ("a", [1], 1), ("b", [2], 3)],
                                [("a", [1], 2), ("a", [1], 3)]]
    assert _waves(items, 1) == [[("a", [1], s) for s in range(4)] + [("b", [2], 3)]]


def test_a_prompt_comes_back_from_its_id_and_a_foreign_id_is_refused():
    assert prompt_of(dataset_index([0, 7, 3])) == [0, 7, 3]
    assert prompt_of(0) == [0] and prompt_of(1109) == [9, 9, 9]
    with pytest.raises(ValueError, match="1110"):
        prompt_of(1110)


def test_more_waves_than_sessions_are_refused():
    with pytest.raises(ConfigError, match="waves=9"):
        DemoConfig(n=8, waves=9)
    assert DemoConfig(n=8, waves=8).waves == 8


def test_a_resume_reads_the_run_s_own_configuration_and_refuses_other_directories(tmp_path):
    with pytest.raises(RunDirError, match="not a demo run directory"):
        read_config(tmp_path)
    run_dir = make_run_dir(tmp_path / "run")
    write_config(run_dir, DemoConfig(steps=7, batch_size=3), {"lake": "x"})
    cfg = read_config(run_dir)
    assert (cfg.steps, cfg.batch_size) == (7, 3)


def test_a_run_that_trained_all_its_steps_is_not_resumed(tmp_path):
    """Nothing is left to resume: refused with the run's step count, before anything is written
    (no new group dispatched, its summary not rewritten)."""
    from jobs.demo.main import run
    from jobs.demo.policy import Policy
    from jobs.demo.resume import checkpoint, restored_step
    from jobs.demo.trainer import Trainer
    run_dir = make_run_dir(tmp_path / "run")
    write_config(run_dir, DemoConfig(steps=3, batch_size=2), {"lake": str(run_dir / "lake")})
    trainer = Trainer(Policy(), 1e-3, 0.2, None)
    checkpoint(run_dir, trainer, 2)
    assert restored_step(run_dir) == 2       # one step short: a resume goes on (not run here)
    checkpoint(run_dir, trainer, 3)
    before = sorted(p.name for p in run_dir.iterdir())
    with pytest.raises(ConfigError, match=r"already trained all its 3 steps.*nothing to resume"):
        run(DemoConfig(), resume=run_dir, use_wandb=False)
    assert sorted(p.name for p in run_dir.iterdir()) == before
