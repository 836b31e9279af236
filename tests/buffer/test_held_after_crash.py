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
