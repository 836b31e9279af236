"""vLLM outputs -> trajectory rows: tokens, sampled log-probs, weight-version spans, finish reasons.

Outputs are built from vLLM 0.33-shaped classes (tests/support/vllm_shapes.py); `make test-vllm` runs
this same file against vLLM's real classes. Rows go through a real buffer over a real lake.
"""
from __future__ import annotations

import dataclasses
import math

import pytest

from pipeline import ReplayBuffer
from pipeline.adapters.vllm.outputs import (
    VllmOutputError,
    completion_row,
    completion_spans,
    finish_info,
    request_rows,
    sampled_logprobs,
)
from pipeline.lake.writer import read_table
from tests.support import vllm_shapes as shapes

OUT = shapes.Outputs()
PROMPT = [101, 102, 103]


def _stored(buf: ReplayBuffer, lake, rows: list[dict], uid: str = "g0") -> list[dict]:
    """Register ``uid``, put ``rows``, finish it, and read the rows back from the lake."""
    buf.register(partition="train", uids=[uid], global_steps=7)
    buf.put(rows)
    buf.update_status(partition="train", uids=[uid], status="running")
    buf.update_status(partition="train", uids=[uid], status="finished")
    table = read_table(lake, "trajectories")
    return [r for r in table.to_pylist() if r["uid"] == uid]


def test_finished_completion_becomes_a_row_the_buffer_stores(buf, lake):
    c = OUT.completion([5, 6, 7, 8, 9], logprobs=[-0.5, -0.25, -1.0, -2.0, -0.125],
                     spans=[("3", 0, 2), ("4", 2, 5)])
    row = completion_row(OUT.request(PROMPT, [c]), c, partition="train", uid="g0", session_id=0,
                         reward=1.0, reward_info={"acc": 1.0})
    (stored,) = _stored(buf, lake, [row])
    assert stored["prompt_ids"] == PROMPT
    assert stored["response_ids"] == [5, 6, 7, 8, 9]
    assert stored["rollout_log_probs"] == [-0.5, -0.25, -1.0, -2.0, -0.125]
    assert stored["version_spans"] == [{"version": 3, "n_tokens": 2}, {"version": 4, "n_tokens": 3}]
    assert (stored["min_global_steps"], stored["max_global_steps"]) == (3, 4)
    assert dict(stored["reward_info"]) == {"acc": 1.0} and stored["reward"] == 1.0


def test_flat_logprobs_give_the_same_log_probs_as_per_position_dicts():
    values = [-0.1, -2.5, -0.75]
    nested = OUT.completion([11, 12, 13], logprobs=values, top=3)
    flat = OUT.completion([11, 12, 13], logprobs=values, top=3, flat=True)
    assert sampled_logprobs(nested) == sampled_logprobs(flat) == values


def test_no_logprobs_requested_gives_null_rollout_log_probs():
    c = OUT.completion([1, 2], spans=[("0", 0, 2)])
    assert sampled_logprobs(c) is None
    assert completion_row(OUT.request(PROMPT, [c]), c, partition="train", uid="u", session_id=0,
                          reward=0.0)["rollout_log_probs"] is None


def test_a_position_without_the_sampled_token_is_refused():
    c = OUT.completion([1, 2], logprobs=[-1.0, -1.0])
    c.logprobs[1] = {999: c.logprobs[1][2]}
    with pytest.raises(VllmOutputError, match="position 1 has no logprob for its sampled token 2"):
        sampled_logprobs(c)


def test_neighbouring_spans_of_one_version_merge_into_one_run():
    c = OUT.completion([1, 2, 3, 4], spans=[("2", 0, 1), ("2", 1, 3), ("5", 3, 4)])
    assert completion_spans(c) == [(2, 3), (5, 1)]


def test_spans_that_leave_tokens_uncovered_are_refused():
    c = OUT.completion([1, 2, 3], spans=[("2", 0, 2)])
    with pytest.raises(VllmOutputError, match="cover 2 of 3 output tokens"):
        completion_spans(c)
    gap = OUT.completion([1, 2, 3], spans=[("2", 0, 1), ("3", 2, 3)])
    with pytest.raises(VllmOutputError, match="do not tile"):
        completion_spans(gap)


def test_text_version_labels_need_a_version_of_mapping():
    c = OUT.completion([1, 2], spans=[("step-4", 0, 2)])
    with pytest.raises(VllmOutputError, match="version_of="):
        completion_spans(c)
    assert completion_spans(c, version_of=lambda s: int(s.removeprefix("step-"))) == [(4, 2)]


def test_missing_spans_fall_back_to_global_steps_with_null_version_spans(buf, lake):
    c = OUT.completion([1, 2, 3], logprobs=[-1.0, -1.0, -1.0])
    row = completion_row(OUT.request(PROMPT, [c]), c, partition="train", uid="g0", session_id=0,
                         reward=0.5, global_steps=6)
    (stored,) = _stored(buf, lake, [row])
    assert (stored["min_global_steps"], stored["max_global_steps"]) == (6, 6)
    assert stored["version_spans"] is None


def test_missing_spans_without_global_steps_are_refused():
    c = OUT.completion([1, 2, 3])
    with pytest.raises(VllmOutputError, match="no weight_versions and no global_steps"):
        completion_row(OUT.request(PROMPT, [c]), c, partition="train", uid="g0", session_id=0,
                       reward=0.0)


@pytest.mark.parametrize("reason", ["abort", "error"])
def test_partial_generations_are_refused_as_rows(reason):
    c = OUT.completion([1, 2], spans=[("1", 0, 2)], finish_reason=reason)
    with pytest.raises(VllmOutputError, match=f"finish_reason='{reason}'"):
        completion_row(OUT.request(PROMPT, [c]), c, partition="train", uid="g0", session_id=0,
                       reward=0.0)


def test_a_completion_still_streaming_is_refused_as_a_row():
    """A streamed completion without a finish reason yet (its weight versions come with the
    final output) is not a whole trajectory; it was stored as one."""
    c = OUT.completion([1], spans=[("1", 0, 1)], finish_reason=None)
    with pytest.raises(VllmOutputError, match="train/g0 session 0: the completion has no "
                                              "finish_reason"):
        completion_row(OUT.request(PROMPT, [c]), c, partition="train", uid="g0", session_id=0,
                       reward=0.0)


def test_a_request_without_prompt_token_ids_is_refused_not_stored_promptless():
    c = OUT.completion([1, 2], spans=[("1", 0, 2)], finish_reason="stop")
    req = OUT.k.RequestOutput(request_id="req-0", prompt=None, prompt_token_ids=None,
                              prompt_logprobs=None, outputs=[c], finished=True)
    with pytest.raises(VllmOutputError, match="prompt_token_ids is None"):
        completion_row(req, c, partition="train", uid="g0", session_id=0, reward=0.0)


def test_truncated_response_is_masked_out_of_the_loss_only_when_asked():
    c = OUT.completion([1, 2, 3], spans=[("1", 0, 3)], finish_reason="length")
    req = OUT.request(PROMPT, [c])
    kept = completion_row(req, c, partition="train", uid="g", session_id=0, reward=0.0)
    masked = completion_row(req, c, partition="train", uid="g", session_id=0, reward=0.0,
                            mask_truncated=True)
    assert "response_mask" not in kept
    assert masked["response_mask"] == [0, 0, 0]


def test_finish_and_stop_reason_are_reported_as_vllm_sets_them():
    c = OUT.completion([1, 2], spans=[("1", 0, 2)], finish_reason="stop", stop_reason=128001)
    assert finish_info(c) == ("stop", 128001)


def test_request_with_n_completions_gives_one_session_per_completion(buf, lake):
    outs = [OUT.completion([10 + i] * (i + 1), index=i, logprobs=[-0.5] * (i + 1),
                         spans=[(str(3 + i % 2), 0, i + 1)]) for i in (2, 0, 1)]
    rows = request_rows(OUT.request(PROMPT, outs), partition="train", uid="g0",
                        rewards=[1.0, 0.0, 1.0])       # in the order of outputs: index 2, 0, 1
    assert [r["session_id"] for r in rows] == [0, 1, 2]
    stored = sorted(_stored(buf, lake, rows), key=lambda r: r["session_id"])
    assert [r["response_ids"] for r in stored] == [[10], [11, 11], [12, 12, 12]]
    assert [r["max_global_steps"] for r in stored] == [3, 4, 3]
    assert [r["reward"] for r in stored] == [0.0, 1.0, 1.0]


def test_a_completion_not_scored_yet_is_stored_with_a_null_reward(buf, lake):
    outs = [OUT.completion([10 + i], index=i, spans=[("3", 0, 1)]) for i in range(2)]
    rows = request_rows(OUT.request(PROMPT, outs), partition="train", uid="g0",
                        rewards=[1.0, None])
    stored = sorted(_stored(buf, lake, rows), key=lambda r: r["session_id"])
    assert [r["reward"] for r in stored] == [1.0, None]


def test_request_rows_refuse_a_reward_count_that_differs_from_the_completions():
    outs = [OUT.completion([1], index=i, spans=[("1", 0, 1)]) for i in range(2)]
    with pytest.raises(VllmOutputError, match="1 rewards for 2 completions"):
        request_rows(OUT.request(PROMPT, outs), partition="train", uid="g0", rewards=[1.0])


def test_request_rows_refuse_a_reward_info_count_that_differs_from_the_completions():
    outs = [OUT.completion([1], index=i, spans=[("1", 0, 1)]) for i in range(2)]
    with pytest.raises(VllmOutputError, match="g0: 1 reward_infos for 2 completions"):
        request_rows(OUT.request(PROMPT, outs), partition="train", uid="g0", rewards=[1.0, 0.0],
                     reward_infos=[{"acc": 1.0}])


def _scored_by_length(buf, lake, req) -> list[dict]:
    """``req``'s rows, each completion scored by its length in the order of ``req.outputs`` (as
    docs/vllm.md scores them), stored and read back by session."""
    rewards = [float(len(c.token_ids)) for c in req.outputs]
    infos = [{"len": float(len(c.token_ids))} for c in req.outputs]
    rows = request_rows(req, partition="train", uid="g0", rewards=rewards, reward_infos=infos)
    assert [r["session_id"] for r in rows] == sorted(r["session_id"] for r in rows)
    return sorted(_stored(buf, lake, rows), key=lambda r: r["session_id"])


def test_each_reward_stays_with_its_completion_when_outputs_are_not_in_index_order(buf, lake):
    outs = [OUT.completion([20 + i] * (i + 1), index=i, spans=[("3", 0, i + 1)]) for i in (1, 2, 0)]
    stored = _scored_by_length(buf, lake, OUT.request(PROMPT, outs))
    assert [r["response_ids"] for r in stored] == [[20], [21, 21], [22, 22, 22]]
    assert [r["reward"] for r in stored] == [1.0, 2.0, 3.0]
    assert [dict(r["reward_info"]) for r in stored] == [{"len": 1.0}, {"len": 2.0}, {"len": 3.0}]


@pytest.mark.skipif(not shapes.REAL, reason="needs vllm 0.33 (its RequestOutput.add): runs in the "
                    "session of vLLM's real classes (test_vllm_real_classes.py; make test-vllm)")
def test_rewards_follow_a_streamed_request_whose_completions_arrive_out_of_index_order(buf, lake):
    def chunk(index: int, tokens: list[int]) -> object:
        done = OUT.completion(tokens, index=index, spans=[("2", 0, len(tokens))])
        return OUT.k.RequestOutput(request_id="r", prompt=None, prompt_token_ids=PROMPT,
                                   prompt_logprobs=None, outputs=[done], finished=False)

    streamed = chunk(1, [9, 9])               # AsyncLLM with n=2: child 1 finishes first,
    streamed.add(chunk(0, [5]), aggregate=True)   # and add() appends child 0 after it
    assert [c.index for c in streamed.outputs] == [1, 0]
    stored = _scored_by_length(buf, lake, streamed)
    assert [(r["response_ids"], r["reward"]) for r in stored] == [([5], 1.0), ([9, 9], 2.0)]


def test_log_probs_survive_the_float32_column_within_float32_precision(buf, lake):
    values = [-1.2345678901, -0.000123456789]
    c = OUT.completion([1, 2], logprobs=values, spans=[("0", 0, 2)])
    row = completion_row(OUT.request(PROMPT, [c]), c, partition="train", uid="g0", session_id=0,
                         reward=0.0)
    (stored,) = _stored(buf, lake, [row])
    assert all(math.isclose(a, b, rel_tol=1e-6)
               for a, b in zip(stored["rollout_log_probs"], values))


@pytest.mark.skipif(not shapes.REAL, reason="needs vllm 0.33: runs in the session of vLLM's "
                    "real classes (test_vllm_real_classes.py; make test-vllm)")
def test_vllm_shapes_match_vllm_field_for_field():
    import vllm
    from vllm import logprobs as real_lp
    from vllm import outputs as real

    assert vllm.__version__.startswith("0.33")
    for ours, theirs in ((shapes.CompletionOutput, real.CompletionOutput),
                         (shapes.WeightVersionSpan, real.WeightVersionSpan),
                         (shapes.Logprob, real_lp.Logprob),
                         (shapes.FlatLogprobs, real_lp.FlatLogprobs)):
        assert [f.name for f in dataclasses.fields(ours)] == \
            [f.name for f in dataclasses.fields(theirs)], theirs
    import inspect
    assert list(inspect.signature(shapes.RequestOutput).parameters) == \
        [p for p in inspect.signature(real.RequestOutput).parameters if p != "kwargs"]


def test_every_refusal_of_a_completion_row_names_its_partition_uid_and_session():
    """Log-probs, spans and version labels were refused naming only the completion's index."""
    lost = OUT.completion([1, 2], logprobs=[-1.0, -1.0])
    lost.logprobs[1] = {999: lost.logprobs[1][2]}
    short = OUT.completion([1, 2, 3], spans=[("2", 0, 2)])
    text = OUT.completion([1, 2], spans=[("step-4", 0, 2)])
    for c, why in [(lost, "position 1 has no logprob"), (short, "cover 2 of 3 output tokens"),
                   (text, "label 'step-4' is not an integer step")]:
        with pytest.raises(VllmOutputError, match=rf"^train/g7 session 3: .*{why}"):
            completion_row(OUT.request(PROMPT, [c]), c, partition="train", uid="g7",
                           session_id=3, reward=0.0)


def test_a_version_of_that_raises_is_a_vllm_output_error_naming_the_label():
    c = OUT.completion([1, 2], spans=[("step-4", 0, 2)])
    with pytest.raises(VllmOutputError, match=r"^train/g7 session 0: completion 0: "
                       r"version_of\('step-4'\) raised KeyError: 'step-4'") as err:
        completion_row(OUT.request(PROMPT, [c]), c, partition="train", uid="g7", session_id=0,
                       reward=0.0, version_of={}.__getitem__)
    assert isinstance(err.value.__cause__, KeyError)
