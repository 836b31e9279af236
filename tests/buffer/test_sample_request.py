"""`sample(request=...)`: a call named by its caller and sent again, because its caller never
received the answer (its process, or the buffer's, died with the call in flight), returns the batch
the lost attempt chose, with the metrics it reported, instead of choosing a second one while the
first stays held forever."""
from __future__ import annotations

import signal
import subprocess
import sys

import pyarrow.compute as pc
import pytest

from jobs.audit import run_audits
from pipeline import ConfigError, ReplayBuffer, SampleTimeout
from pipeline.lake import read_table
from tests.support.lake import ROOT, python_env, write_script
from tests.support.policies import group

TRAINER = """
    import sys
    from pipeline import ReplayBuffer
    from tests.support.lake import write_apart
    from tests.support.policies import group
    if sys.argv[2:] == ["apart"]:         # as replaylake wrote before 2026-12
        write_apart()

    def refill(n):                        # the prompts asked for stay pending (in flight)
        for _ in range(n):
            made.append(f"r{len(made)}")
            buf.register(partition="train", uids=[made[-1]], global_steps=3)

    made = []
    buf = ReplayBuffer.async_(lake=sys.argv[1], filter_groups_metric="reward", refill_fn=refill,
                              max_off_policy_threshold=2)
    group(buf, "old", 0, [0.0, 1.0])      # group span 4 at step 3: stale
    group(buf, "z", 1, [1.0, 1.0])        # zero variance
    group(buf, "a", 1, [0.0, 1.0])        # span 3: stale
    group(buf, "y", 1, [0.5, 0.5])        # zero variance and stale
    group(buf, "b", 2, [0.0, 1.0])
    group(buf, "c", 2, [0.0, 1.0])
    group(buf, "d", 2, [0.0, 1.0])
    batch = buf.sample(3, "train", 2, request="step-3")
    print(batch.batch_id, batch.uids, flush=True)
"""
# the sample's writes: its evictions with their refill (decisions 1), then its selection with
# the batch's metric rows (decisions 2, metrics 1: one write, whose commit record comes last)
AFTER_SELECTION, IN_SELECTION = "decisions.acked:2", "metrics.sum_written:1"


def _open(lake) -> ReplayBuffer:
    return ReplayBuffer.async_(lake=lake, filter_groups_metric="reward", refill_fn=lambda n: None,
                               max_off_policy_threshold=2)


def _run(tmp_path, name: str, kill_at: str | None, *args: str):
    script, lake = write_script(tmp_path, "trainer.py", TRAINER), tmp_path / name
    env = python_env(**({"REPLAYLAKE_KILL_AT": kill_at} if kill_at else {}))
    return subprocess.run([sys.executable, str(script), str(lake), *args], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=120), lake


def _metric_rows(lake, batch_id: int) -> int:
    return read_table(lake, "metrics", keep=lambda t: pc.equal(t["batch_id"], batch_id)).num_rows


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The batch the untouched run's `sample` returned, as its caller received it."""
    proc, lake = _run(tmp_path_factory.mktemp("reference"), "lake", None)
    assert proc.returncode == 0, proc.stderr
    with _open(lake) as buf:
        return buf.sample(3, "train", 2, request="step-3")


@pytest.mark.parametrize("kill_at,apart", [(AFTER_SELECTION, False), (IN_SELECTION, False),
                                           ("decisions.acked:2", True), ("metrics.acked:1", True)])
def test_the_call_sent_again_after_a_crash_gets_the_batch_the_lost_attempt_chose(
        tmp_path, reference, kill_at, apart):
    proc, lake = _run(tmp_path, "lake", kill_at, *(["apart"] if apart else []))
    assert proc.returncode == -signal.SIGKILL and proc.stdout == "", proc.stderr   # never answered
    buf = _open(lake)
    # killed in the middle of the selection's write: nothing of it is in the lake (the retry
    # chooses again, the same groups); after it: the selection and all of its metric rows
    chosen = [] if kill_at == IN_SELECTION else [reference.batch_id]
    assert list(buf.held_batches("train")) == chosen
    # only a lake written the earlier way holds a selection without its metric rows
    assert _metric_rows(lake, reference.batch_id) == (
        0 if kill_at == IN_SELECTION or (apart and kill_at.startswith("decisions")) else
        len(reference.metrics))
    got = buf.sample(3, "train", 2, request="step-3", timeout=5)
    assert (got.batch_id, got.step, got.uids) == (reference.batch_id, 3, ["b", "c"])
    assert got.table.drop_columns(["ts"]).equals(reference.table.drop_columns(["ts"]))
    assert got.eviction_metrics == reference.eviction_metrics != {}
    assert got.off_policy_metrics == reference.off_policy_metrics
    assert got.filtered_reward_counts == reference.filtered_reward_counts == {1.0: 1, 0.5: 1}
    assert _metric_rows(lake, got.batch_id) == len(reference.metrics)   # written once
    assert buf.sample(3, "train", 2, request="step-3").batch_id == got.batch_id   # still held
    buf.release(got)
    nxt = buf.sample(3, "train", 1, request="step-3, second batch", timeout=5)
    assert nxt.uids == ["d"] and nxt.eviction_metrics == {}     # nothing reported twice
    buf.release(nxt)
    buf.close()
    assert not [a.name for a in run_audits(lake) if a.status == "FAIL"]


def test_a_request_of_a_held_batch_returns_it_in_the_same_process_and_a_new_one_after_release():
    buf = ReplayBuffer.sync(poll_interval=0.01)
    for uid in ("a", "b", "c"):
        group(buf, uid, 1, [0.0, 1.0])
    first = buf.sample(1, "train", 1, request="k")
    again = buf.sample(1, "train", 1, request="k")
    assert (again.batch_id, again.uids) == (first.batch_id, ["a"])
    assert again.table.drop_columns(["ts"]).equals(first.table.drop_columns(["ts"]))
    assert again.metrics == first.metrics
    other = buf.sample(1, "train", 1, request="other")
    assert other.uids == ["b"]
    buf.release(first)
    assert buf.sample(1, "train", 1, request="k").uids == ["c"]   # a released key names no batch


def test_evictions_after_the_batch_are_reported_by_the_next_batch_not_by_the_retry():
    buf = ReplayBuffer.async_(max_off_policy_threshold=1, poll_interval=0.01)
    group(buf, "a", 1, [0.0, 1.0])
    first = buf.sample(1, "train", 1, request="k")
    assert first.eviction_metrics == {}
    group(buf, "old", 0, [0.0, 1.0])                   # stale at step 1: evicted by the next call
    with pytest.raises(SampleTimeout):
        buf.sample(1, "train", 1, timeout=0.05)
    again = buf.sample(1, "train", 1, request="k")
    assert again.batch_id == first.batch_id and again.eviction_metrics == {}
    group(buf, "b", 1, [0.0, 1.0])
    later = buf.sample(1, "train", 1)
    assert later.uids == ["b"] and later.eviction_metrics["training/off_policy/evicted_samples"] == 1


@pytest.mark.parametrize("call, named", [
    (dict(global_steps=2, batch_size=1), "global_steps=2, batch_size=1"),
    (dict(global_steps=1, batch_size=2), "global_steps=1, batch_size=2"),
])
def test_the_request_of_a_held_batch_with_other_arguments_is_refused(call, named):
    buf = ReplayBuffer.sync(poll_interval=0.01)
    for uid in ("a", "b", "c"):
        group(buf, uid, 1, [0.0, 1.0])
    held = buf.sample(1, "train", 1, request="k")
    with pytest.raises(ConfigError, match=rf"^sample\({named}\): request='k' names held batch "
                       rf"{held.batch_id} of partition 'train', chosen at global_steps=1 with 1 "
                       "group"):
        buf.sample(partition="train", request="k", timeout=1, **call)
    assert buf.counts("train")["sampled"] == 1                # nothing chosen by the refusal


@pytest.mark.parametrize("request_key", ["", 7, b"k", "x" * 201])
def test_a_request_that_is_not_a_short_string_is_refused(request_key):
    buf = ReplayBuffer.sync()
    with pytest.raises(ConfigError, match=r"^sample: request=.* must be a non-empty str of at "
                       "most 200 characters"):
        buf.sample(1, "train", 1, request=request_key)


def test_the_request_is_in_the_lake_beside_the_selection(tmp_path):
    with ReplayBuffer.sync(lake=tmp_path) as buf:
        group(buf, "a", 1, [0.0, 1.0])
        group(buf, "b", 1, [0.0, 1.0])
        buf.release(buf.sample(1, "train", 1, request="step-1"))
        buf.release(buf.sample(1, "train", 1))
    rows = read_table(tmp_path, "decisions").to_pylist()
    assert [(r["kind"], r["uid"], r["request"]) for r in rows] == [
        ("select", "a", "step-1"), ("release", "a", None), ("select", "b", None),
        ("release", "b", None)]


def _interrupted_after_choosing(monkeypatch, buf: ReplayBuffer, **call) -> None:
    """A `sample` that Ctrl-C stops right after its selection is written (a lake kill point
    set to interrupt)."""
    from pipeline.lake import kill
    with monkeypatch.context() as env:
        env.setenv(kill.ENV, "decisions.acked:1")
        env.setenv(kill.HOW_ENV, "interrupt")
        kill.arm()
        with pytest.raises(KeyboardInterrupt):
            buf.sample(1, "train", **call)
    kill.arm()                   # disarmed: the variables are gone


def test_a_batch_chosen_under_a_request_waits_for_that_request_not_another_call(tmp_path,
                                                                              monkeypatch):
    """Interrupted after choosing: a call with another request (or another batch size) at the
    same step got that batch, and the original request then got it again: one batch, two
    calls, trained twice."""
    buf = ReplayBuffer.sync(lake=tmp_path, poll_interval=0.01)
    for uid in "abcd":
        group(buf, uid, 1, [0.0, 1.0])
    _interrupted_after_choosing(monkeypatch, buf, batch_size=2, request="step-1/a")
    other = buf.sample(1, "train", 1, request="step-1/b")
    assert other.uids == ["c"]
    mine = buf.sample(1, "train", 2, request="step-1/a")
    assert (mine.batch_id, mine.uids) == (0, ["a", "b"])
    assert sorted(buf.held_batches("train")) == [0, 1]
    buf.close()


def test_a_batch_chosen_without_a_request_goes_to_the_retry_and_the_key_then_names_it(
        tmp_path, monkeypatch):
    buf = ReplayBuffer.sync(lake=tmp_path, poll_interval=0.01)
    for uid in "abc":
        group(buf, uid, 1, [0.0, 1.0])
    _interrupted_after_choosing(monkeypatch, buf, batch_size=1)
    got = buf.sample(1, "train", 1, request="k")            # the cell run again, now named
    assert (got.batch_id, got.uids) == (0, ["a"])
    assert buf.sample(1, "train", 1, request="k").batch_id == 0     # the key names it now
    with pytest.raises(SampleTimeout):                      # another size is another call
        buf.sample(1, "train", 3, timeout=0.1)
    buf.close()


def test_a_retry_sent_while_the_first_attempt_still_waits_gets_the_same_batch():
    """The caller that died left its call waiting in the buffer's process (a Ray actor, say);
    its retry waits beside it: both end with the one batch chosen under the key."""
    import threading
    buf = ReplayBuffer.sync(poll_interval=0.01)
    got: list[int] = []
    calls = [threading.Thread(target=lambda: got.append(
        buf.sample(1, "train", 1, request="step-1", timeout=30).batch_id), daemon=True)
        for _ in range(2)]
    for t in calls:
        t.start()
    group(buf, "a", 1, [0.0, 1.0])
    group(buf, "b", 1, [0.0, 1.0])
    for t in calls:
        t.join(30)
    assert got == [0, 0] and list(buf.held_batches("train")) == [0]
