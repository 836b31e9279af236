"""Calls without a timeout share one refill ask: while `refill_fn` runs for one call, another
call of the partition owes what it wants instead of asking for the same prompts again (it asked
twice, and each served ask was subtracted, so the owed count went negative and refill_fn was
then called with -2, again and again)."""
from __future__ import annotations

import threading
import time

import pytest

from pipeline import ReplayBuffer, SampleTimeout
from pipeline.lake import read_table
from tests.support.policies import group


@pytest.mark.parametrize("second", ["sample", "wait_for_sampleable"])
def test_a_second_call_during_a_running_ask_asks_nothing_again(tmp_path, second):
    calls: list[int] = []
    answered = threading.Event()

    def refill(n: int) -> None:       # the rollout side answers slowly, registering nothing
        calls.append(n)
        answered.wait(5)

    buf = ReplayBuffer.async_(lake=tmp_path, max_off_policy_threshold=1, refill_fn=refill,
                              poll_interval=0.02)
    group(buf, "a", 0, [0.0, 1.0])
    group(buf, "b", 0, [0.0, 1.0])          # both stale at step 5: evicted, 2 prompts owed
    outcomes: list[str] = []

    def call(fn, **kw) -> None:
        try:
            fn(5, "train", 1, **kw)
        except SampleTimeout:
            outcomes.append("timed out")

    first = threading.Thread(target=call, args=(buf.sample,), kwargs={"timeout": None},
                             daemon=True)
    first.start()
    while not calls:
        time.sleep(0.01)
    other = threading.Thread(target=call, args=(getattr(buf, second),),
                             kwargs={"timeout": 0.5}, daemon=True)
    other.start()
    other.join(10)
    assert outcomes == ["timed out"] and calls == [2]     # it waited for the ask, asked nothing
    group(buf, "c", 5, [0.0, 1.0])          # the rollout side answers
    answered.set()
    first.join(10)
    assert not first.is_alive() and calls == [2]
    refills = [r for r in read_table(tmp_path, "decisions").to_pylist()
               if r["kind"].startswith("refill")]
    assert [(r["kind"], r["count"]) for r in refills] == [("refill", 2)]
    buf.close()


def test_a_call_made_by_refill_fn_itself_does_not_wait_for_the_ask_it_runs_in():
    """refill_fn that looks at the buffer with a waiting call of its own (odd, but it must not
    hang on its own ask): the inner call owes and times out, the outer call goes on."""
    inner: list[str] = []

    def refill(n: int) -> None:
        try:
            buf.wait_for_sampleable(5, "train", 1, timeout=0.2)
        except SampleTimeout:
            inner.append("timed out")
        group(buf, "c", 5, [0.0, 1.0])

    buf = ReplayBuffer.async_(max_off_policy_threshold=1, refill_fn=refill, poll_interval=0.02)
    group(buf, "a", 0, [0.0, 1.0])
    assert buf.sample(5, "train", 1, timeout=None).uids == ["c"]
    assert inner == ["timed out"]
