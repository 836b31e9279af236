"""Partial rollouts with vLLM: resume aborted generations, with bounded retries, then fail the group.

A weight update aborts the requests in flight (vLLM returns them with ``finish_reason="abort"``
and the tokens generated so far). `generate_resumable` resumes such a session: the next request's
prompt is the original prompt plus the tokens so far and its ``max_tokens`` is what is left of the
budget; tokens, sampled log-probs and weight-version spans of all attempts are merged. Attempts are
bounded (`RetryPolicy.max_attempts`, exponential backoff between them): verl resubmits aborted
generations forever, which hangs a run whose weights update faster than a long response can
finish. After the last attempt the session raises `GenerationFailed` with the reason, and
`rollout_group` moves the whole group to ``failure`` (the async preset then evicts it and asks
for a replacement prompt).

``generate(prompt_token_ids, max_tokens)`` is the caller's coroutine around its engine (e.g.
vLLM's ``AsyncLLM.generate`` with ``SamplingParams(n=1, max_tokens=max_tokens, logprobs=0)``,
returning the final `RequestOutput`); this module never imports vllm.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.adapters.vllm.outputs import (
    PARTIAL_FINISH,
    Dating,
    Spans,
    completion_spans,
    default_version_of,
    finish_info,
    merge_runs,
    sampled_logprobs,
    trajectory_row,
)
from pipeline.errors import ConfigError, ReplayLakeError

Generate = Callable[[list[int], int], Awaitable[Any]]
BY_CURRENT_VERSION = Dating("current_version=", "a callable returning the weight version each "
                            "attempt starts with")


class GenerationFailed(ReplayLakeError, RuntimeError):
    """A session could not be completed within the retry budget; ``reason`` says why."""

    def __init__(self, reason: str, *, attempts: int, tokens: int):
        self.reason, self.attempts, self.tokens = reason, attempts, tokens
        super().__init__(f"{reason} (after {attempts} attempt(s), {tokens} token(s) kept)")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to resume: at most ``max_attempts`` requests per session;
    before attempt k+1 wait ``min(max_backoff_s, backoff_s * factor**(k-1))`` seconds."""

    max_attempts: int = 4
    backoff_s: float = 0.5
    factor: float = 2.0
    max_backoff_s: float = 8.0

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) \
                or self.max_attempts < 1:
            raise ConfigError(f"max_attempts={self.max_attempts!r} must be an int >= 1")
        for name in ("backoff_s", "factor", "max_backoff_s"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be >= 0")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        return min(self.max_backoff_s, self.backoff_s * self.factor ** (attempt - 1))


@dataclass
class ResumedCompletion:
    """The merged result of one session's attempts. ``start_version``: what
    ``current_version()`` named at the last attempt's start (None without it); it dates a session
    that ends with no tokens, which has no span to carry a version."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = field(default_factory=list)
    spans: Spans | None = field(default_factory=list)   # None: some attempt is undated
    start_version: int | None = None
    finish_reason: str | None = None
    stop_reason: Any = None
    attempts: int = 0
    aborts: int = 0

    def add(self, completion: Any, version_of: Callable[[Any], int],
            fallback: int | None) -> None:
        """Append one attempt's output (its tokens follow the tokens so far)."""
        tokens = list(completion.token_ids)
        lps = sampled_logprobs(completion)
        self.logprobs = None if lps is None or self.logprobs is None else self.logprobs + lps
        runs = completion_spans(completion, version_of=version_of)
        if runs is None and fallback is not None:
            # the attempt's start version dates all its tokens: a weight update aborts it
            runs = [(int(fallback), len(tokens))]
        if runs is None:
            self.spans = None
        elif self.spans is not None:
            self.spans = merge_runs([*self.spans, *runs])
        self.token_ids += tokens
        self.start_version = None if fallback is None else int(fallback)
        self.finish_reason, self.stop_reason = finish_info(completion)


async def generate_resumable(generate: Generate, prompt_ids: Sequence[int], max_tokens: int, *,
                             policy: RetryPolicy | None = None,
                             version_of: Callable[[Any], int] = default_version_of,
                             current_version: Callable[[], int | None] | None = None,
                             sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep
                             ) -> ResumedCompletion:
    """Generate one session, resuming after aborts, within ``policy``'s attempts.

    ``current_version()`` (optional) names the weight version at each attempt's start; it dates
    the tokens of attempts for which vLLM reported no ``weight_versions`` (exact, because a weight
    update aborts the attempt), and an empty response (min = max = that version). A session with
    undated tokens fails when it becomes a row.
    Raises `GenerationFailed` when the attempts run out (still aborted, or ``generate`` kept
    raising)."""
    policy = policy or RetryPolicy()
    prompt = list(prompt_ids)
    out = ResumedCompletion()
    last_error: BaseException | None = None
    for attempt in range(1, policy.max_attempts + 1):
        out.attempts = attempt
        fallback = current_version() if current_version is not None else None
        try:
            result = await generate(prompt + out.token_ids, max_tokens - len(out.token_ids))
        except asyncio.CancelledError:
            raise
        except Exception as exc:   # the engine went away mid-update: retry like an abort
            last_error = exc
        else:
            last_error = None
            outs = list(result.outputs)
            if len(outs) != 1:
                raise GenerationFailed(f"generate returned {len(outs)} completions; resuming "
                                       "needs n=1 per request", attempts=attempt,
                                       tokens=len(out.token_ids))
            out.add(outs[0], version_of, fallback)
            if out.finish_reason not in PARTIAL_FINISH:
                return out
            out.aborts += 1
            if len(out.token_ids) >= max_tokens:      # aborted exactly at the budget: done
                out.finish_reason = "length"
                return out
        if attempt < policy.max_attempts:
            await sleep(policy.delay(attempt))
    why = (f"generate raised {type(last_error).__name__}: {last_error}" if last_error is not None
           else f"generation still {out.finish_reason!r} after {out.aborts} abort(s)")
    raise GenerationFailed(f"gave up resuming: {why}", attempts=out.attempts,
                           tokens=len(out.token_ids)) from last_error


@dataclass
class GroupResult:
    """What `rollout_group` did: the group's final status, the rows it put, and why sessions
    failed (session id -> reason)."""

    uid: str
    status: str
    rows: list[dict[str, Any]]
    failures: dict[int, str]


async def rollout_group(buffer: Any, *, partition: str, uid: str, prompt_ids: Sequence[int],
                        n: int, generate: Generate, reward_fn: Callable[..., Any],
                        max_tokens: int, policy: RetryPolicy | None = None,
                        version_of: Callable[[Any], int] = default_version_of,
                        current_version: Callable[[], int | None] | None = None,
                        mask_truncated: bool = False) -> GroupResult:
    """Run the ``n`` sessions of a registered group and settle it in ``buffer``.

    Marks the group ``running``, generates every session (resuming aborts), puts the rows of the
    sessions that completed, then moves the group to ``finished`` — or to ``failure`` when any
    session failed (a group is terminal only after all its sessions settled). ``reward_fn(
    prompt_ids, response_ids)`` returns a reward or ``(reward, reward_info)``. ``buffer`` is a
    `ReplayBuffer` or a `RayReplayBuffer` (its blocking calls run in a worker thread).
    Tokens vLLM reported no ``weight_versions`` for, and empty responses, are dated with
    ``current_version()`` (see `generate_resumable`); without it such a session fails."""
    await asyncio.to_thread(buffer.update_status, partition=partition, uids=[uid],
                            status="running")
    results = await asyncio.gather(*(
        generate_resumable(generate, prompt_ids, max_tokens, policy=policy,
                           version_of=version_of, current_version=current_version)
        for _ in range(n)), return_exceptions=True)
    rows, failures = [], {}
    for session, res in enumerate(results):
        if isinstance(res, BaseException):
            if not isinstance(res, Exception):
                raise res
            failures[session] = str(res)
            continue
        try:
            scored = reward_fn(list(prompt_ids), res.token_ids)
            reward, info = scored if isinstance(scored, tuple) else (scored, None)
            rows.append(trajectory_row(
                partition=partition, uid=uid, session_id=session, prompt_ids=prompt_ids,
                response_ids=res.token_ids, logprobs=res.logprobs, spans=res.spans,
                finish_reason=res.finish_reason, reward=reward, reward_info=info,
                global_steps=None if res.token_ids else res.start_version,
                mask_truncated=mask_truncated, dating=BY_CURRENT_VERSION))
        except Exception as exc:
            failures[session] = f"{type(exc).__name__}: {exc}"
    if rows:
        await asyncio.to_thread(buffer.put, rows)
    status = "failure" if failures else "finished"
    await asyncio.to_thread(buffer.update_status, partition=partition, uids=[uid], status=status)
    return GroupResult(uid, status, rows, failures)
