"""refill_fn learns which partition its prompts are for when it takes a `partition` keyword;
verl's plain refill_fn(n) is called as before."""
from __future__ import annotations

import pytest

from pipeline import ReplayBuffer
from tests.support.policies import group


def _two_partitions(refill_fn) -> ReplayBuffer:
    """A stale group in each of `math` and `code` (T=2, sampled at step 5): both evict and ask."""
    buf = ReplayBuffer.async_(max_off_policy_threshold=2, refill_fn=refill_fn, poll_interval=0.05)
    for p in ("math", "code"):
        group(buf, f"{p}-old", 1, [0.0, 1.0], partition=p)
        group(buf, f"{p}-ok", 5, [0.0, 1.0], partition=p)
    for p in ("math", "code"):
        buf.sample(5, p, 1, timeout=5)
    return buf


def test_a_refill_fn_taking_partition_is_told_which_one_asks() -> None:
    asked: list[tuple[int, str]] = []

    def refill(n: int, partition: str) -> None:
        asked.append((n, partition))

    _two_partitions(refill)
    assert asked == [(1, "math"), (1, "code")]


@pytest.mark.parametrize("kind", ["plain", "kwargs", "builtin"])
def test_other_refill_fns_are_called_as_they_take_it(kind) -> None:
    asked: list = []
    if kind == "plain":                                  # verl's form: refill_fn(n)
        def refill(n):
            asked.append(n)
    elif kind == "kwargs":
        def refill(n, **kw):
            asked.append((n, kw))
    else:                                                # no readable signature needed
        refill = asked.append
    buf = _two_partitions(refill)
    assert buf.config.refill_takes_partition is (kind == "kwargs")   # read once, with the config
    want = {"plain": [1, 1], "builtin": [1, 1],
            "kwargs": [(1, {"partition": "math"}), (1, {"partition": "code"})]}[kind]
    assert asked == want
