"""After `kill -9`, the batch the trainer was holding comes back as `sampled`; reissue can
release it (the trainer resumes from an earlier checkpoint) or keep it for the trainer."""
from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from pipeline import ReplayBuffer
from tests.support.lake import ROOT, python_env, write_script

HOLDER = """
    import os, signal, sys
    from pipeline import ReplayBuffer
    buf = ReplayBuffer.sync(lake=sys.argv[1])
    for uid in ("a", "b"):
        buf.register(partition="train", uids=[uid], global_steps=1)
        buf.put([{"partition": "train", "uid": uid, "session_id": s, "min_global_steps": 0,
                  "max_global_steps": 0, "reward": float(s), "prompt_ids": [1],
                  "response_ids": [2]} for s in range(2)])
        buf.update_status(partition="train", uids=[uid], status="finished")
    buf.register(partition="train", uids=["c"], global_steps=2)
    batch = buf.sample(1, "train", 1)          # the trainer holds batch 0 (group a)
    print("holding", batch.batch_id, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def _crash(tmp_path):
    script, lake = write_script(tmp_path, "holder.py", HOLDER), tmp_path / "lake"
    proc = subprocess.run([sys.executable, str(script), str(lake)], cwd=ROOT, capture_output=True,
                          text=True, env=python_env(), timeout=60)
    assert proc.stdout.strip() == "holding 0" and proc.returncode == -signal.SIGKILL, proc.stderr
    return lake


@pytest.mark.parametrize("release_held", [True, False])
def test_the_held_batch_is_restored_and_reissue_releases_it_on_request(tmp_path, release_held):
    lake = _crash(tmp_path)
    with ReplayBuffer.sync(lake=lake) as buf:
        assert buf.counts("train")["sampled"] == 1
        assert buf.held_batches("train") == {0: [("a", 0, 0), ("a", 1, 0)]}
        assert buf.reissue(3, release_held=release_held) == {"train": ["c"]}
        assert buf.counts("train")["sampled"] == (0 if release_held else 1)
        assert buf.sample(3, "train", 1, timeout=5).uids == ["b"]    # a is never handed out again


@pytest.mark.parametrize("strategy", ["mask", "drop"])
def test_a_held_validation_batch_comes_back_as_sample_returned_it(tmp_path, strategy):
    """A validation partition masks nothing and records no bound: its held batch, rebuilt after
    a reopen, must too (it was rebuilt with the training settings: under mask every row came
    back masked, under drop with the training bound and a failing certificate)."""
    from tests.support.policies import group
    kw = dict(lake=tmp_path, max_off_policy_threshold=1, max_off_policy_strategy=strategy)
    buf = ReplayBuffer.async_(**kw)
    group(buf, "v-old", 0, [0.0, 1.0], partition="val")      # group span 4 at step 3
    live = buf.sample(3, "val", 1)
    buf.close()
    again = ReplayBuffer.async_(**kw)
    held = again.held_batch(live.batch_id)
    assert (held.bound, held.strategy) == (live.bound, live.strategy) == (None, None)
    assert held.table.column("is_stale").to_pylist() == [False, False]
    assert held.certificate.holds
    assert held.off_policy_metrics == live.off_policy_metrics
    again.close()


def test_partitions_lists_only_those_that_hold_or_held_a_group(tmp_path):
    """A partition only named (a sample of a misspelt id that timed out) is not listed: a restart
    would not know it, and the live and the restored buffer must list the same."""
    from pipeline import SampleTimeout
    from tests.support.policies import group
    buf = ReplayBuffer.async_(lake=tmp_path)
    group(buf, "a", 1, [0.0, 1.0])
    with pytest.raises(SampleTimeout):
        buf.sample(1, "trian", 1, timeout=0.1)
    assert buf.partitions() == ["train"]
    buf.release(buf.sample(1, "train", 1))
    buf.close()
    again = ReplayBuffer.async_(lake=tmp_path)
    assert again.partitions() == ["train"]          # its groups all released: it held one
    again.close()


@pytest.mark.parametrize("threshold, reopened", [(1, 8), ({"math": 1, "*": 5}, {"math": 1, "*": 5})],
                         ids=["mask, threshold changed on reopen", "per-dataset bounds"])
def test_a_held_batch_keeps_what_its_selection_recorded(tmp_path, threshold, reopened):
    """The held batch is rebuilt from its selection's rows (masked groups, each group's bound,
    the strategy), never from the reopened configuration: a looser threshold unmasked rows the
    lake records as masked, and per-dataset bounds came back as the loosest for every group."""
    from tests.support.policies import group
    strategy = "mask" if isinstance(threshold, int) else "drop"
    buf = ReplayBuffer.async_(lake=tmp_path, max_off_policy_threshold=threshold,
                              max_off_policy_strategy=strategy)
    group(buf, "t1", 1 if strategy == "mask" else 3, [0.0, 1.0], dataset="math")
    live = buf.sample(3, "train", 1)
    buf.close()
    again = ReplayBuffer.async_(lake=tmp_path, max_off_policy_threshold=reopened,
                                max_off_policy_strategy=strategy,
                                allow_changes=("max_off_policy_threshold",))
    held = again.held_batch(live.batch_id)
    assert (held.bound, held.strategy, held.masked, held.group_bounds) == \
        (live.bound, live.strategy, live.masked, live.group_bounds)
    assert held.table.equals(live.table)
    assert held.off_policy_metrics == live.off_policy_metrics
    assert held.certificate.holds == live.certificate.holds
    again.close()
