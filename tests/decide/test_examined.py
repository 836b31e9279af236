"""The rules' memory within a step (`pipeline.decide.evaluate.Examined`): a group examined once
at a step is not evaluated again at that step with the same configuration, and every outcome
is the one a fresh evaluation gives (another step, another threshold, a group at its bound)."""
from __future__ import annotations

import pytest

from pipeline import ReplayBuffer
from pipeline.decide import evaluate
from tests.support.lake import add_group


@pytest.fixture
def examined_rows(monkeypatch):
    """The rows each rule evaluation of the test hands polars (uids, in order)."""
    seen: list[list[str]] = []
    real = evaluate._examine

    def spy(rows, *args, **kwargs):
        seen.append([r[1] for r in rows])
        return real(rows, *args, **kwargs)

    monkeypatch.setattr(evaluate, "_examine", spy)
    return seen


def _async(**kw) -> ReplayBuffer:
    return ReplayBuffer.async_(max_off_policy_threshold=2, poll_interval=0.01, **kw)


def test_a_sample_after_a_count_at_the_same_step_evaluates_no_rule_again(examined_rows):
    buf = _async()
    for i, gs in enumerate((4, 4, 5, 5)):
        add_group(buf, f"g{i}", gs, [0.0, 1.0])
    assert buf.get_sampleable_count(5, "train") == 4
    assert examined_rows == [["g0", "g1", "g2", "g3"]]
    assert buf.dispatch_capacity(5, "train", batch_size=2) >= 0
    batch = buf.sample(5, "train", 2)
    assert batch.uids == ["g0", "g1"]
    assert examined_rows == [["g0", "g1", "g2", "g3"]]     # nothing evaluated again
    add_group(buf, "late", 5, [0.0, 1.0])
    assert buf.sample(5, "train", 2).uids == ["g2", "g3"]
    assert examined_rows[1:] == [["late"]]                 # only the group not yet seen


def test_the_next_step_evaluates_again_and_evicts_what_went_stale_there(examined_rows):
    """Group span = step - dispatch + 1; threshold 2: dispatched at 4, the group is at its
    bound at step 5 (kept) and over it at step 6 (evicted). The memory of step 5 must not
    answer for step 6."""
    buf = _async()
    add_group(buf, "old", 4, [0.0, 1.0])
    add_group(buf, "new", 6, [0.0, 1.0])
    assert buf.get_sampleable_count(5, "train") == 2       # span 2 at step 5: kept
    assert buf.get_sampleable_count(6, "train") == 1       # span 3 at step 6: stale
    batch = buf.sample(6, "train", 1)
    assert batch.uids == ["new"]
    assert batch.metrics["training/off_policy/evicted_samples"] == 1
    assert examined_rows[0] == ["old", "new"] and examined_rows[1] == ["old", "new"]


def test_a_memory_never_answers_for_another_configuration():
    """Two buffers with other thresholds examine the same groups at the same step: each gets
    its own outcome (the memory is keyed by the rules in use, not only the step)."""
    for threshold, expected in ((1, 1), (2, 2)):
        buf = ReplayBuffer.async_(max_off_policy_threshold=threshold)
        add_group(buf, "a", 4, [0.0, 1.0])
        add_group(buf, "b", 5, [0.0, 1.0])
        assert buf.get_sampleable_count(5, "train") == expected
        assert buf.get_sampleable_count(5, "train") == expected


def test_the_memory_holds_only_what_the_latest_poll_examined(examined_rows):
    """A trainer that stays at one step long keeps in the memory only the rows its latest
    evaluation handed the rules, not every group it ever examined there; and a row examined
    again (fresh, not yet settled) is still answered from it."""
    buf = _async()
    step = 10
    for round_ in range(6):
        for i in range(256):
            add_group(buf, f"r{round_}-{i}", step, [0.0, 1.0])
        assert buf.get_sampleable_count(step, "train") == 256
        buf.release(buf.sample(step, "train", 256))
    part = buf._state.part("train")
    assert part.candidates.alive_count == 0
    assert sorted(part.examined.rows) == sorted(f"r5-{i}" for i in range(256))
    # each round's groups were evaluated once (by the count), not again by the sample
    assert [len(rows) for rows in examined_rows] == [256] * 6
