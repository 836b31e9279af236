"""A rollout side that stops answering refills: the trainer's `sample(timeout=...)` goes on when
the refilled groups arrive late but in time, and otherwise fails within its deadline with a
`SampleTimeout` that names the cause (prompts asked of refill_fn that never arrived, or never
finished) -- it never hangs, not even on a refill_fn that does not return."""
from __future__ import annotations

import threading
import time

import pytest

from pipeline import SampleTimeout
from tests.support.policies import Background, Refiller, group, make

TIMEOUT = 0.5
SLACK = 1.5          # a poll interval, a lake-less commit and a loaded 2-core machine
# prompts asked for the one evicted zero-variance group: one in async, its credit 2 in sync DAPO
ASKED = {"async": 1, "sync": 2}


def _flat_then(preset: str, refill) -> object:
    """A buffer whose one group is zero-variance (evicted at the first poll, so one prompt is
    asked of ``refill``), in the async preset or in sync DAPO."""
    kw = {"filter_groups_metric": "reward"}
    if preset == "sync":
        kw.update(train_batch_size=1, gen_batch_size=1, max_inflight_gen_batches=4)
    buf = make(preset, refill, **kw)
    group(buf, "flat", 1, [1.0, 1.0])
    return buf


def _timed_sample(buf) -> tuple[BaseException | None, float]:
    start = time.monotonic()
    call = Background(lambda: buf.sample(1, "train", 1, timeout=TIMEOUT))
    try:
        call.result(timeout=TIMEOUT + SLACK)
        error = None
    except TimeoutError as exc:
        if not call.done:
            raise AssertionError(f"sample(timeout={TIMEOUT}) still running after "
                                 f"{TIMEOUT + SLACK}s") from exc
        error = exc
    return error, time.monotonic() - start


class Silent(Refiller):
    """Returns at once and registers nothing: the rollout side took the ask and went quiet."""

    def __call__(self, n: int) -> None:
        self.calls.append(n)


def _stalled(step: int = 1) -> Refiller:
    """Registers the asked prompts and never finishes their rollouts (left pending)."""
    return Refiller(step, finish=lambda i: None)


@pytest.mark.parametrize("preset", ["async", "sync"])
def test_a_refill_whose_groups_never_arrive_times_out_within_the_deadline(preset: str) -> None:
    ref = Silent(step=1)
    error, took = _timed_sample(_flat_then(preset, ref))
    assert isinstance(error, SampleTimeout) and took < TIMEOUT + SLACK
    assert ref.calls == [ASKED[preset]]         # asked once: no refill storm while waiting
    assert error.counts["pending"] == 0


@pytest.mark.parametrize("preset", ["async", "sync"])
def test_a_refill_whose_rollouts_never_finish_times_out_within_the_deadline(preset: str) -> None:
    ref = _stalled()
    error, took = _timed_sample(_flat_then(preset, ref))
    assert isinstance(error, SampleTimeout) and took < TIMEOUT + SLACK
    assert ref.calls == [ASKED[preset]] and error.counts["pending"] == ASKED[preset]


@pytest.mark.parametrize("preset", ["async", "sync"])
def test_groups_that_arrive_late_but_before_the_deadline_let_sample_go_on(preset: str) -> None:
    ref = Silent(step=1)
    buf = _flat_then(preset, ref)

    def answer_late() -> None:           # the rollout side answers 0.3 s after the ask
        while not ref.calls:
            time.sleep(0.01)
        time.sleep(0.3)
        group(buf, "late", 1, [0.0, 1.0])

    threading.Thread(target=answer_late, daemon=True).start()
    assert buf.sample(1, "train", 1, timeout=5).uids == ["late"]


@pytest.mark.parametrize("preset", ["async", "sync"])
def test_the_timeout_says_the_refilled_prompts_never_arrived(preset: str) -> None:
    error, _ = _timed_sample(_flat_then(preset, Silent(step=1)))
    assert f"asked refill_fn for {ASKED[preset]} new prompt(s)" in str(error)
    assert "none of them is in flight" in str(error)
    assert "never received" not in str(error)


def test_a_partition_whose_groups_were_all_evicted_is_not_said_to_have_received_none() -> None:
    buf = make("async", None, max_off_policy_threshold=2)
    group(buf, "old", 0, [0.0, 1.0])                       # stale at step 9: evicted
    with pytest.raises(SampleTimeout) as error:
        buf.sample(9, "train", 1, timeout=TIMEOUT)
    assert "never received a group" not in str(error.value)


@pytest.mark.parametrize("preset", ["async", "sync"])
def test_the_timeout_says_the_refilled_groups_are_still_in_flight(preset: str) -> None:
    error, _ = _timed_sample(_flat_then(preset, _stalled()))
    assert f"asked refill_fn for {ASKED[preset]} new prompt(s)" in str(error)
    assert f"{ASKED[preset]} group(s) still in flight" in str(error)


@pytest.mark.parametrize("preset", ["async", "sync"])
def test_a_refill_fn_that_blocks_cannot_hold_sample_past_its_timeout(preset: str) -> None:
    answered = threading.Event()
    calls: list[int] = []

    def blocking(n: int) -> None:          # the rollout side never answers the request
        calls.append(n)
        answered.wait(60)

    buf = _flat_then(preset, blocking)
    try:
        error, took = _timed_sample(buf)
        assert isinstance(error, SampleTimeout) and took < TIMEOUT + SLACK
        assert f"refill_fn({ASKED[preset]}) has not returned" in str(error)
    finally:
        answered.set()                     # let the refill thread (and a held sample) end


def test_after_a_blocked_refill_times_out_the_next_call_waits_for_that_ask_and_goes_on() -> None:
    answered = threading.Event()
    calls: list[int] = []

    def late(n: int) -> None:              # answers, but only when the test lets it
        calls.append(n)
        answered.wait(60)
        for i in range(n):
            group(buf, f"late{i}", 1, [0.0, 1.0])

    buf = _flat_then("async", late)
    try:
        error, _ = _timed_sample(buf)
        assert isinstance(error, SampleTimeout)
        error, _ = _timed_sample(buf)     # the ask is still running: nothing is asked again
        assert isinstance(error, SampleTimeout) and calls == [1]
    finally:
        answered.set()
    assert buf.sample(1, "train", 1, timeout=5).uids == ["late0"]
    assert calls == [1]
