"""vLLM outputs (`RequestOutput` / `CompletionOutput`, vLLM 0.33) as trajectory rows for `put`.

Read by duck typing; vllm is never imported. The fields read, per completion:

- ``RequestOutput.prompt_token_ids`` -> ``prompt_ids``
- ``CompletionOutput.token_ids`` -> ``response_ids``
- ``CompletionOutput.logprobs`` (``list[dict[int, Logprob]]`` or ``FlatLogprobs``) -> the
  log-prob of each *sampled* token -> ``rollout_log_probs`` (null when logprobs were not asked)
- ``CompletionOutput.weight_versions`` (``list[WeightVersionSpan]``, each ``version: str`` label
  over output tokens ``[start, end)``; set on the final output only) -> ``version_spans`` as runs of
  ``(version, n_tokens)``, and their min / max -> ``min_global_steps`` / ``max_global_steps``.
  Labels are strings in vLLM; ``version_of`` turns one into the integer step (default: ``int``).
- ``CompletionOutput.finish_reason`` (``stop`` | ``length`` | ``abort`` | ``error`` |
  ``repetition``): an ``abort`` or ``error`` output is a partial generation and is refused here
  (resume it with `vllm_resume.generate_resumable`); ``length`` (truncated) can mask the response
  out of the loss (``mask_truncated=True``, DAPO's overlong filtering).
- ``CompletionOutput.stop_reason`` / ``finish_reason`` are returned by `finish_info`; the
  trajectory table has no column for them, so they are not stored in the lake.

When vLLM reported no spans (``weight_versions is None``: the engine never got a version label),
the caller's ``global_steps`` (the weight version the request was served with) is the fallback:
``min = max = global_steps`` and ``version_spans`` stays null, i.e. "not reported per token".
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from pipeline.errors import ReplayLakeError
from pipeline.ingest import STEP_LIMIT, STEP_RULE

PARTIAL_FINISH = ("abort", "error")
Spans = list[tuple[int, int]]   # runs of (version, n_tokens)


class VllmOutputError(ReplayLakeError, ValueError):
    """A vLLM output cannot become a trajectory row (partial, unlabelled, inconsistent)."""


class Dating(NamedTuple):
    """The caller's argument that dates a row vLLM reported no ``weight_versions`` for: its name
    as the caller writes it, and what to pass there (both said in the error when it is missing)."""

    name: str
    meaning: str


BY_GLOBAL_STEPS = Dating("global_steps=", "the weight version that served the request")


def default_version_of(label: Any) -> int:
    """vLLM's weight-version label as the integer step: ``"7"`` -> 7 (ints pass through)."""
    if isinstance(label, int) and not isinstance(label, bool):
        return label
    try:
        return int(str(label).strip())
    except ValueError:
        raise VllmOutputError(
            f"weight version label {label!r} is not an integer step; pass version_of= to map "
            "your labels to steps (e.g. lambda s: int(s.removeprefix('step-')))") from None


def finish_info(completion: Any) -> tuple[str | None, int | str | None]:
    """``(finish_reason, stop_reason)`` of a completion, as vLLM reports them."""
    reason = getattr(completion, "finish_reason", None)
    return (None if reason is None else str(reason)), getattr(completion, "stop_reason", None)


def sampled_logprobs(completion: Any) -> list[float] | None:
    """The log-prob of each sampled token, or None when the request did not ask for logprobs."""
    lps = getattr(completion, "logprobs", None)
    if lps is None:
        return None
    tokens = list(completion.token_ids)
    if len(lps) != len(tokens):
        raise VllmOutputError(f"completion {completion.index}: {len(lps)} logprob positions for "
                              f"{len(tokens)} tokens")
    if hasattr(lps, "start_indices"):          # FlatLogprobs: scan its flat lists, no dicts
        out = []
        for pos, tok in enumerate(tokens):
            lo, hi = lps.start_indices[pos], lps.end_indices[pos]
            hit = next((i for i in range(lo, hi) if lps.token_ids[i] == tok), None)
            if hit is None:
                raise _missing(completion, pos, tok)
            out.append(float(lps.logprobs[hit]))
        return out
    out = []
    for pos, (tok, position) in enumerate(zip(tokens, lps)):
        entry = None if position is None else position.get(tok)
        if entry is None:
            raise _missing(completion, pos, tok)
        out.append(float(entry.logprob))
    return out


def _missing(completion: Any, pos: int, tok: int) -> VllmOutputError:
    return VllmOutputError(f"completion {completion.index}: position {pos} has no logprob for "
                           f"its sampled token {tok}")


def _version(version_of: Callable[[Any], int], label: Any, completion: Any) -> int:
    """``version_of(label)``; what it raises becomes a `VllmOutputError` naming the label."""
    try:
        return version_of(label)
    except VllmOutputError:
        raise
    except Exception as exc:
        raise VllmOutputError(f"completion {completion.index}: version_of({label!r}) raised "
                              f"{type(exc).__name__}: {exc}") from exc


def merge_runs(runs: Iterable[tuple[int, int]]) -> Spans:
    """Concatenate ``(version, n_tokens)`` runs, joining neighbours of one version, dropping 0s."""
    out: Spans = []
    for version, n in runs:
        if n <= 0:
            continue
        if out and out[-1][0] == version:
            out[-1] = (version, out[-1][1] + n)
        else:
            out.append((version, n))
    return out


def completion_spans(completion: Any, *, version_of: Callable[[Any], int] = default_version_of
                     ) -> Spans | None:
    """vLLM's ``weight_versions`` as runs of ``(version, n_tokens)``; None when not reported.

    The spans must tile the output tokens ``[0, len(token_ids))`` without gaps or overlaps."""
    spans = getattr(completion, "weight_versions", None)
    if spans is None:
        return None
    n_tokens = len(completion.token_ids)
    at, runs = 0, []
    for span in spans:
        if span.start != at or span.end < span.start:
            raise VllmOutputError(f"completion {completion.index}: weight_versions do not tile "
                                  f"the output tokens (span {span!r} after token {at})")
        runs.append((_version(version_of, span.version, completion), span.end - span.start))
        at = span.end
    if at != n_tokens:
        raise VllmOutputError(f"completion {completion.index}: weight_versions cover {at} of "
                              f"{n_tokens} output tokens")
    return merge_runs(runs)


def versions_row(spans: Spans | None, n_tokens: int, global_steps: int | None,
                 where: str, *, dating: Dating = BY_GLOBAL_STEPS) -> dict[str, Any]:
    """``min/max_global_steps`` and ``version_spans`` columns from spans or the fallback step;
    a version or step outside the steps ingest takes is refused here, naming the completion.
    ``dating`` names the caller's argument that gave ``global_steps`` (said when it is missing)."""
    if spans:
        versions = [v for v, _ in spans]
        _check_steps(where, "weight version", versions)
        return {"min_global_steps": min(versions), "max_global_steps": max(versions),
                "version_spans": [{"version": v, "n_tokens": n} for v, n in spans]}
    if global_steps is None:
        what = ("empty response and no " if spans is not None and n_tokens == 0
                else "vLLM reported no weight_versions and no ")
        raise VllmOutputError(f"{where}: {what}{dating.name} to date it; pass {dating.name} "
                              f"({dating.meaning})")
    _check_steps(where, dating.name, [int(global_steps)])
    return {"min_global_steps": int(global_steps), "max_global_steps": int(global_steps),
            "version_spans": None}


def _check_steps(where: str, what: str, steps: list[int]) -> None:
    bad = next((v for v in steps if not 0 <= v < STEP_LIMIT), None)
    if bad is not None:
        sep = "" if what.endswith("=") else " "
        raise VllmOutputError(f"{where}: {what}{sep}{bad} {STEP_RULE}; map your labels to "
                              "trainer steps with version_of=")


def trajectory_row(*, partition: str, uid: str, session_id: int, prompt_ids: Sequence[int],
                   response_ids: Sequence[int], logprobs: Sequence[float] | None,
                   spans: Spans | None, finish_reason: str | None, reward: float | None,
                   reward_info: Mapping[str, float] | None = None, index: int = 0,
                   global_steps: int | None = None, mask_truncated: bool = False,
                   dating: Dating = BY_GLOBAL_STEPS) -> dict[str, Any]:
    """One row of the trajectory input schema (shared by plain conversion and resumed sessions);
    ``dating`` names the caller's argument that gave ``global_steps``."""
    where = f"{partition}/{uid} session {session_id}"
    if finish_reason in PARTIAL_FINISH:
        raise VllmOutputError(f"{where}: the generation ended with finish_reason="
                              f"{finish_reason!r} (partial); resume it with generate_resumable "
                              "instead of storing it")
    row: dict[str, Any] = {
        "partition": partition, "uid": uid, "session_id": int(session_id), "index": int(index),
        "reward": None if reward is None else float(reward), "prompt_ids": list(prompt_ids),
        "response_ids": list(response_ids),
        "rollout_log_probs": None if logprobs is None else list(logprobs),
        **versions_row(spans, len(response_ids), global_steps, where, dating=dating),
    }
    if reward_info is not None:
        row["reward_info"] = dict(reward_info)
    if mask_truncated and finish_reason == "length":
        row["response_mask"] = [0] * len(response_ids)
    return row


def completion_row(request_output: Any, completion: Any, *, partition: str, uid: str,
                   session_id: int, reward: float | None,
                   reward_info: Mapping[str, float] | None = None,
                   index: int = 0, global_steps: int | None = None,
                   version_of: Callable[[Any], int] = default_version_of,
                   mask_truncated: bool = False) -> dict[str, Any]:
    """One finished `CompletionOutput` of ``request_output`` as a trajectory row. A completion
    without a finish reason (streamed, not finished yet: with n > 1 a request streams its
    finished children while others run) and a request without prompt token ids are refused:
    either would be stored as a whole trajectory it is not."""
    where = f"{partition}/{uid} session {session_id}"
    if getattr(completion, "finish_reason", "") is None:
        raise VllmOutputError(f"{where}: the completion has no finish_reason (a streamed output "
                              "that has not finished); store it once it has finished")
    if request_output.prompt_token_ids is None:
        raise VllmOutputError(f"{where}: RequestOutput.prompt_token_ids is None (a prompt given "
                              "as text or embeddings vLLM did not tokenize into the output?); "
                              "the trajectory needs the prompt's token ids")
    try:         # their errors name the completion; the row's name goes in front
        logprobs = sampled_logprobs(completion)
        spans = completion_spans(completion, version_of=version_of)
    except VllmOutputError as exc:
        raise VllmOutputError(f"{where}: {exc}") from exc.__cause__
    return trajectory_row(
        partition=partition, uid=uid, session_id=session_id,
        prompt_ids=list(request_output.prompt_token_ids),
        response_ids=list(completion.token_ids), logprobs=logprobs, spans=spans,
        finish_reason=finish_info(completion)[0], reward=reward, reward_info=reward_info,
        index=index, global_steps=global_steps, mask_truncated=mask_truncated)


def request_rows(request_output: Any, *, partition: str, uid: str,
                 rewards: Sequence[float | None],
                 reward_infos: Sequence[Mapping[str, float] | None] | None = None,
                 first_session: int = 0, global_steps: int | None = None,
                 version_of: Callable[[Any], int] = default_version_of,
                 mask_truncated: bool = False) -> list[dict[str, Any]]:
    """Every completion of a request (``SamplingParams(n=...)``: the group's sessions) as rows;
    completion ``i`` (vLLM's ``index``) becomes session ``first_session + i``.

    ``rewards[k]`` (and ``reward_infos[k]``) belong to ``request_output.outputs[k]`` (None: not
    scored yet, stored as null): give them in
    the order of ``outputs`` (``[score(c) for c in out.outputs]``), whatever the ``index`` of each
    completion there -- a streamed request with ``n > 1`` lists its completions in the order they
    arrived, not by ``index``. The rows come back sorted by session."""
    outs = list(request_output.outputs)
    _check_count(partition, uid, "rewards", len(rewards), len(outs))
    if reward_infos is None:
        infos: list[Mapping[str, float] | None] = [None] * len(outs)
    else:
        infos = list(reward_infos)
        _check_count(partition, uid, "reward_infos", len(infos), len(outs))
    scored = sorted(zip(outs, rewards, infos), key=lambda item: item[0].index)
    return [completion_row(request_output, c, partition=partition, uid=uid,
                           session_id=first_session + c.index, reward=r, reward_info=info,
                           global_steps=global_steps, version_of=version_of,
                           mask_truncated=mask_truncated)
            for c, r, info in scored]


def _check_count(partition: str, uid: str, name: str, given: int, completions: int) -> None:
    """A per-completion list must hold one entry per completion of the request."""
    if given != completions:
        raise VllmOutputError(f"{partition}/{uid}: {given} {name} for {completions} completions; "
                              f"give one per entry of request_output.outputs, in that order")
