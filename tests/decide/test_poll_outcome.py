"""A poll decides its refill before its evictions are written (both go in one write), so the
refill policy sees the outcome predicted from the evictions; it must be exactly what memory holds
once the write is applied: sampleable and in-flight groups, every kind of evicted group among
them (zero variance, stale), with groups in flight beside them."""
from __future__ import annotations

from pipeline import ReplayBuffer
from pipeline.decide import evaluate as decide
from pipeline.decide.policies import PollContext
from pipeline.decide.poll import _eviction_rows, _outcome
from tests.support.lake import add_group


def test_the_outcome_a_refill_sees_is_memory_after_the_evictions_are_applied():
    buf = ReplayBuffer.async_(filter_groups_metric="reward", max_off_policy_threshold=1,
                              refill_fn=lambda n: None)
    add_group(buf, "flat", 3, [1.0, 1.0])              # zero variance
    add_group(buf, "good", 3, [0.0, 1.0])
    add_group(buf, "stale_done", 0, [0.0, 1.0])
    buf.register(partition="train", uids=["old_run", "old_pending"], global_steps=0)
    buf.update_status(partition="train", uids=["old_run"], status="running")
    buf.register(partition="train", uids=["fresh_run"], global_steps=3)
    state, cfg = buf._state, buf.config.for_partition("train")
    part = state.part("train")
    before = (part.candidates.alive_count, len(part.inflight))
    with state.locked():
        ev = decide.evaluate(part, cfg.rules, 3, cfg.filter_metric)
        predicted = _outcome(part, ev)
        as_if_none = _outcome(part, None)
        evicted = set(ev.uids)
        assert evicted == {"flat", "stale_done"}     # (the rules judge finished groups only)
        assert (as_if_none.sampleable, as_if_none.inflight) == before
        state.write_poll(part, _eviction_rows(PollContext(3, "train", 1), 0, 0, ev), None,
                         step=3)
    assert (predicted.sampleable, predicted.inflight) == (part.candidates.alive_count,
                                                          len(part.inflight))
    assert predicted.sampleable == before[0] - 2 and predicted.inflight == before[1] == 3
    assert predicted.evicted == len(evicted) and sorted(predicted.uids) == sorted(evicted)
    buf.close()
