"""Partial rollouts: aborted generations resume with the tokens so far, retries are bounded, and a
session that cannot finish fails its group in the buffer.

The engine is a scripted coroutine that answers each request with the next vLLM-shaped output of
its script (what vLLM returns when a weight update aborts a request), and records the prompt and
budget it was asked for. Groups are settled in a real buffer over a real lake.
"""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pipeline.adapters.vllm.resume import (
    GenerationFailed,
    RetryPolicy,
    generate_resumable,
    rollout_group,
)
from pipeline.errors import ConfigError
from pipeline.lake.writer import read_table
from tests.support import vllm_shapes as shapes

OUT = shapes.Outputs()
PROMPT = [1, 2, 3]
NO_WAIT = RetryPolicy(max_attempts=4, backoff_s=0.0)


class ScriptedEngine:
    """Answers request k with ``script[k]``: (tokens, logprobs, version label or None, finish)
    or an exception to raise; records every (prompt, max_tokens) it was asked."""

    def __init__(self, script: list[Any] | None = None,
                 by_resumed: dict[int, Any] | None = None):
        self.script = list(script or [])
        self.by_resumed = by_resumed     # answer by how many tokens the prompt already resumes
        self.calls: list[tuple[list[int], int]] = []

    async def __call__(self, prompt_ids: list[int], max_tokens: int) -> Any:
        self.calls.append((list(prompt_ids), max_tokens))
        if self.by_resumed is not None:
            step = self.by_resumed[len(prompt_ids) - len(PROMPT)]
        else:
            step = self.script[min(len(self.calls), len(self.script)) - 1]
        if isinstance(step, Exception):
            raise step
        tokens, lps, version, finish = step
        spans = None if version is None or not tokens else [(version, 0, len(tokens))]
        c = OUT.completion(tokens, logprobs=lps, spans=spans, finish_reason=finish)
        return OUT.request(prompt_ids, [c])


def _run(coro):
    return asyncio.run(coro)


def test_an_aborted_generation_resumes_with_its_tokens_and_the_remaining_budget():
    engine = ScriptedEngine([([7, 8, 9], [-0.1, -0.2, -0.3], "5", "abort"),
                             ([10, 11], [-0.4, -0.5], "6", "stop")])
    out = _run(generate_resumable(engine, PROMPT, 16, policy=NO_WAIT))
    assert engine.calls == [(PROMPT, 16), (PROMPT + [7, 8, 9], 13)]
    assert out.token_ids == [7, 8, 9, 10, 11]
    assert out.logprobs == [-0.1, -0.2, -0.3, -0.4, -0.5]
    assert out.spans == [(5, 3), (6, 2)]
    assert (out.finish_reason, out.attempts, out.aborts) == ("stop", 2, 1)


def test_retries_are_bounded_and_the_failure_says_why():
    engine = ScriptedEngine([([7], [-0.1], "1", "abort")])
    with pytest.raises(GenerationFailed, match="still 'abort' after 3 abort") as err:
        _run(generate_resumable(engine, PROMPT, 16, policy=RetryPolicy(3, backoff_s=0.0)))
    assert len(engine.calls) == 3
    assert (err.value.attempts, err.value.tokens) == (3, 3)


def test_backoff_grows_between_attempts_and_is_capped():
    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    engine = ScriptedEngine([([7], None, "1", "abort")])
    policy = RetryPolicy(max_attempts=5, backoff_s=0.5, factor=2.0, max_backoff_s=1.5)
    with pytest.raises(GenerationFailed):
        _run(generate_resumable(engine, PROMPT, 16, policy=policy, sleep=record))
    assert waits == [0.5, 1.0, 1.5, 1.5]          # no wait after the last attempt


def test_an_engine_that_keeps_raising_fails_the_session_with_the_error():
    engine = ScriptedEngine([ConnectionError("engine restarting")])
    with pytest.raises(GenerationFailed, match="ConnectionError: engine restarting") as err:
        _run(generate_resumable(engine, PROMPT, 8, policy=RetryPolicy(2, backoff_s=0.0)))
    assert isinstance(err.value.__cause__, ConnectionError)


def test_an_engine_error_then_success_keeps_going():
    engine = ScriptedEngine([ConnectionError("blip"), ([4, 5], [-1.0, -1.0], "2", "stop")])
    out = _run(generate_resumable(engine, PROMPT, 8, policy=NO_WAIT))
    assert out.token_ids == [4, 5] and out.attempts == 2


def test_an_abort_exactly_at_the_budget_ends_as_length():
    engine = ScriptedEngine([([7, 8], [-0.1, -0.2], "1", "abort")])
    out = _run(generate_resumable(engine, PROMPT, 2, policy=NO_WAIT))
    assert (out.finish_reason, len(engine.calls)) == ("length", 1)


def test_current_version_dates_attempts_for_which_vllm_reported_no_spans():
    versions = iter([3, 4])
    engine = ScriptedEngine([([7, 8], None, None, "abort"), ([9], None, None, "stop")])
    out = _run(generate_resumable(engine, PROMPT, 8, policy=NO_WAIT,
                                  current_version=lambda: next(versions)))
    assert out.spans == [(3, 2), (4, 1)] and out.logprobs is None


def test_retry_policy_rejects_a_zero_attempt_budget():
    with pytest.raises(ConfigError, match="max_attempts=0"):
        RetryPolicy(max_attempts=0)


def _group_events(lake, uid: str) -> list[str]:
    ev = read_table(lake, "group_events").to_pylist()
    return [e["event"] for e in sorted(ev, key=lambda e: e["seq"]) if e["uid"] == uid]


def test_rollout_group_finishes_a_group_whose_sessions_all_complete(buf, lake):
    engine = ScriptedEngine(by_resumed={0: ([7, 8], [-0.1, -0.2], "4", "abort"),
                                        2: ([9], [-0.3], "5", "stop")})
    buf.register(partition="train", uids=["g0"], global_steps=5, n=2)
    res = _run(rollout_group(buf, partition="train", uid="g0", prompt_ids=PROMPT, n=2,
                             generate=engine, reward_fn=lambda p, r: (1.0, {"acc": 1.0}),
                             max_tokens=8, policy=NO_WAIT))
    assert (res.status, res.failures) == ("finished", {})
    assert _group_events(lake, "g0") == ["registered", "running", "finished"]
    rows = read_table(lake, "trajectories").to_pylist()
    assert sorted(r["session_id"] for r in rows) == [0, 1]
    assert {(r["min_global_steps"], r["max_global_steps"]) for r in rows} == {(4, 5)}
    assert all(r["response_ids"] == [7, 8, 9] and r["prompt_ids"] == PROMPT for r in rows)


def test_rollout_group_moves_the_group_to_failure_when_a_session_gives_up(buf, lake):
    good = ([7], [-0.1], "1", "stop")
    aborted = ([8], [-0.2], "1", "abort")
    # one coroutine per session interleaves on one engine: give every request an abort except
    # the first, so session 0 finishes and session 1 exhausts its attempts
    engine = ScriptedEngine([good] + [aborted] * 10)
    buf.register(partition="train", uids=["g1"], global_steps=2, n=2)
    res = _run(rollout_group(buf, partition="train", uid="g1", prompt_ids=PROMPT, n=2,
                             generate=engine, reward_fn=lambda p, r: 0.0, max_tokens=8,
                             policy=RetryPolicy(3, backoff_s=0.0)))
    assert res.status == "failure"
    assert list(res.failures) == [1] and "gave up resuming" in res.failures[1]
    assert len(engine.calls) == 1 + 3
    assert _group_events(lake, "g1") == ["registered", "running", "failure"]
    assert buf.counts("train")["failure"] == 1
    assert [r["session_id"] for r in read_table(lake, "trajectories").to_pylist()] == [0]


def test_rollout_group_dates_an_empty_response_with_current_version(buf, lake):
    engine = ScriptedEngine([([], None, None, "stop")])      # no tokens, no weight_versions
    buf.register(partition="train", uids=["g2"], global_steps=3, n=1)
    res = _run(rollout_group(buf, partition="train", uid="g2", prompt_ids=PROMPT, n=1,
                             generate=engine, reward_fn=lambda p, r: 0.0, max_tokens=8,
                             policy=NO_WAIT, current_version=lambda: 2))
    assert (res.status, res.failures) == ("finished", {})
    (row,) = read_table(lake, "trajectories").to_pylist()
    assert row["response_ids"] == [] and row["version_spans"] is None
    assert (row["min_global_steps"], row["max_global_steps"]) == (2, 2)


def test_rollout_group_without_versions_says_to_pass_current_version(buf, lake):
    engine = ScriptedEngine([([7], [-0.1], None, "stop")])   # the engine reports no versions
    buf.register(partition="train", uids=["g3"], global_steps=3, n=1)
    res = _run(rollout_group(buf, partition="train", uid="g3", prompt_ids=PROMPT, n=1,
                             generate=engine, reward_fn=lambda p, r: 0.0, max_tokens=8,
                             policy=NO_WAIT))
    assert res.status == "failure"
    assert "no weight_versions and no current_version=" in res.failures[0]
    assert "pass current_version=" in res.failures[0]
    assert "global_steps" not in res.failures[0]        # rollout_group takes no global_steps=
