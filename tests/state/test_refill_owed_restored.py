"""What a partition owes refill_fn lives in the decision rows: a restart owes what the buffer
owed before it, because restore replays the same rows through the same apply."""
from __future__ import annotations

import pytest

from pipeline import ReplayBuffer
from tests.support.policies import group


def _owed(buf: ReplayBuffer, partition: str = "train") -> tuple[int, list[str]]:
    part = buf._state.find(partition)
    return part.refill_owed, list(part.refill_replaces)


def _flaky(calls: list[int], fail: int):
    def refill(n: int) -> None:
        calls.append(n)
        if len(calls) <= fail:
            raise ConnectionError("rollout service unavailable")
    return refill


def test_a_restart_owes_the_prompts_of_a_refill_that_failed(tmp_path) -> None:
    calls: list[int] = []
    buf = ReplayBuffer.async_(lake=tmp_path, filter_groups_metric="reward",
                              refill_fn=_flaky(calls, fail=1), poll_interval=0.05)
    group(buf, "flat0", 1, [1.0, 1.0])
    group(buf, "flat1", 1, [0.0, 0.0])
    with pytest.raises(ConnectionError):
        buf.sample(1, "train", 1, timeout=5)
    live = _owed(buf)
    buf.close()
    assert live == (2, ["flat0", "flat1"])
    again = ReplayBuffer.async_(lake=tmp_path, filter_groups_metric="reward",
                                refill_fn=_flaky(calls, fail=0), poll_interval=0.05)
    assert _owed(again) == live
    group(again, "ok", 1, [0.0, 1.0])
    assert again.sample(1, "train", 1, timeout=5).uids == ["ok"]
    assert calls == [2, 2]                   # the restarted buffer asked for what it owed
    assert _owed(again) == (0, [])
    again.close()


def test_a_restart_owes_nothing_for_a_refill_that_was_served(tmp_path) -> None:
    calls: list[int] = []

    def refill(n: int) -> None:
        calls.append(n)
        for i in range(n):
            group(buf, f"new{i}", 1, [0.0, 1.0])

    buf = ReplayBuffer.async_(lake=tmp_path, filter_groups_metric="reward", refill_fn=refill,
                              poll_interval=0.05)
    group(buf, "flat", 1, [1.0, 1.0])
    assert buf.sample(1, "train", 1, timeout=5).uids == ["new0"]
    live = _owed(buf)
    buf.close()
    assert live == (0, []) and calls == [1]
    again = ReplayBuffer.async_(lake=tmp_path, filter_groups_metric="reward", refill_fn=refill,
                                poll_interval=0.05)
    assert _owed(again) == live
    again.close()


def test_a_refill_that_failed_twice_is_owed_once_after_a_restart(tmp_path) -> None:
    calls: list[int] = []
    buf = ReplayBuffer.async_(lake=tmp_path, filter_groups_metric="reward",
                              refill_fn=_flaky(calls, fail=2), poll_interval=0.05)
    group(buf, "flat", 1, [1.0, 1.0])
    for _ in range(2):
        with pytest.raises(ConnectionError):
            buf.sample(1, "train", 1, timeout=5)
    live = _owed(buf)
    buf.close()
    assert live == (1, ["flat"]) and calls == [1, 1]
    again = ReplayBuffer.async_(lake=tmp_path, filter_groups_metric="reward",
                                refill_fn=_flaky(calls, fail=0), poll_interval=0.05)
    assert _owed(again) == live
    again.close()
