"""The demo's task, policy and GRPO loss (jobs/demo/policy.py), on real tensors."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from jobs.demo.policy import (
    DIGIT0,
    SEP,
    Policy,
    dataset_index,
    generate,
    group_advantages,
    grpo_loss,
    prompt_ids,
    reward,
    sample_prompts,
    version_spans,
)


def test_reward_is_one_only_for_the_exact_reversal():
    assert reward([1, 2, 3], [3 + DIGIT0, 2 + DIGIT0, 1 + DIGIT0]) == 1.0
    assert reward([1, 2, 3], [1 + DIGIT0, 2 + DIGIT0, 3 + DIGIT0]) == 0.0
    assert reward([7], [7 + DIGIT0]) == 1.0
    assert prompt_ids([4, 0]) == [4 + DIGIT0, DIGIT0, SEP]


def test_every_prompt_of_the_task_has_its_own_dataset_index_shorter_prompts_first():
    every = [[d] for d in range(10)]
    every += [[a, b] for a in range(10) for b in range(10)]
    every += [[a, b, c] for a in range(10) for b in range(10) for c in range(10)]
    assert [dataset_index(p) for p in every] == list(range(1110))
    assert (dataset_index([9]), dataset_index([0, 0]), dataset_index([9, 9, 9])) == (9, 10, 1109)
    for wrong in ([], [1, 2, 3, 4]):
        with pytest.raises(ValueError, match="1 to 3 digits"):
            dataset_index(wrong)


def test_prompts_have_one_to_three_digits():
    prompts = sample_prompts(np.random.default_rng(0), 500)
    assert {len(p) for p in prompts} == {1, 2, 3}
    assert all(0 <= d <= 9 for p in prompts for d in p)


def test_version_spans_are_runs_of_the_versions_of_the_response_tokens():
    assert version_spans([4, 4, 5], 3) == [{"version": 4, "n_tokens": 2},
                                          {"version": 5, "n_tokens": 1}]
    assert version_spans([4, 5, 5], 1) == [{"version": 4, "n_tokens": 1}]
    assert version_spans([3, 3, 3], 2) == [{"version": 3, "n_tokens": 2}]


def test_generated_responses_have_the_prompt_length_and_the_versions_seen_per_token():
    torch.manual_seed(0)
    policy = Policy()
    prompts = [[1], [2, 3], [4, 5, 6]]
    seen = iter([7, 7, 8])                    # a weight update lands before the third token
    tokens, logps, versions, lengths = generate(policy, prompts, 4,
                                                before_token=lambda: next(seen),
                                                generator=torch.Generator().manual_seed(1))
    assert tokens.shape == (12, 3) and logps.shape == (12, 3)
    assert lengths.tolist() == [1] * 4 + [2] * 4 + [3] * 4
    assert versions == [7, 7, 8]
    assert ((tokens >= DIGIT0) & (tokens < DIGIT0 + 10)).all()
    assert (logps <= 0).all()


def test_teacher_forced_log_probs_equal_the_log_probs_of_generation():
    """The trainer's importance ratio is exactly 1 on-policy: the left-padded, state-frozen
    generation and the right-padded full-sequence pass compute the same log-probs."""
    torch.manual_seed(0)
    policy = Policy()
    prompts = [[5], [1, 9], [3, 0, 8]]
    tokens, logps, _, lengths = generate(policy, prompts, 2, before_token=lambda: 0,
                                         generator=torch.Generator().manual_seed(2))
    rows = []
    for i, m in enumerate(lengths.tolist()):
        rows.append(prompt_ids(prompts[i // 2]) + tokens[i, :m].tolist())
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
    with torch.no_grad():
        recomputed = policy.token_log_probs(ids)
    for i, m in enumerate(lengths.tolist()):
        start = len(prompt_ids(prompts[i // 2]))
        torch.testing.assert_close(recomputed[i, start:start + m],
                                   torch.from_numpy(logps[i, :m]), atol=1e-5, rtol=1e-5)


def test_group_advantages_normalise_within_each_group_with_the_sample_std():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    adv = group_advantages(np.array(["a", "a", "a", "b", "b", "b"]), rewards)
    for idx in ([0, 1, 2], [3, 4, 5]):
        r = rewards[idx].numpy()
        expected = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
        np.testing.assert_allclose(adv[idx].numpy(), expected, rtol=1e-5)


def _padded_batch(policy: Policy):
    ids = torch.tensor([[3, SEP, 3, 0], [4, 5, SEP, 5], [4, 5, SEP, 6]])
    mask = torch.tensor([[0, 0, 1, 0], [0, 0, 0, 1], [0, 0, 0, 1]])
    with torch.no_grad():
        logp = policy.token_log_probs(ids) * mask
    return {"input_ids": ids, "response_mask": mask, "rollout_log_probs": logp}


def test_grpo_loss_on_policy_has_ratio_one_and_a_gradient():
    torch.manual_seed(0)
    policy = Policy()
    batch = _padded_batch(policy)
    loss, stats = grpo_loss(policy, batch, torch.tensor([1.0, -0.5, 0.5]))
    loss.backward()
    assert stats["train/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert stats["train/ratio_std"] == pytest.approx(0.0, abs=1e-6)
    assert stats["train/clip_fraction"] == 0.0
    assert policy.head.weight.grad.abs().sum() > 0


def test_grpo_loss_clips_ratios_far_from_the_rollout_policy():
    torch.manual_seed(0)
    policy = Policy()
    batch = _padded_batch(policy)
    batch["rollout_log_probs"] = batch["rollout_log_probs"] - 1.0 * batch["response_mask"]
    _, stats = grpo_loss(policy, batch, torch.tensor([1.0, -0.5, 0.5]), clip=0.2)
    assert stats["train/ratio_mean"] == pytest.approx(float(np.e), rel=1e-4)
    assert stats["train/ratio_std"] == pytest.approx(0.0, abs=1e-4)     # every token alike
    assert stats["train/clip_fraction"] == 1.0


def test_the_ratio_spread_is_the_token_std_over_the_trained_tokens_only():
    torch.manual_seed(0)
    policy = Policy()
    batch = _padded_batch(policy)
    mask = batch["response_mask"].to(torch.float32)
    # half the rows one nat behind the trainer, the others on-policy: ratios e and 1
    shift = torch.zeros_like(mask)
    shift[::2] = 1.0
    batch["rollout_log_probs"] = batch["rollout_log_probs"] - shift * mask
    _, stats = grpo_loss(policy, batch, torch.tensor([1.0, -0.5, 0.5]))
    ratios = torch.exp(shift)[mask.bool()]
    assert stats["train/ratio_mean"] == pytest.approx(float(ratios.mean()), rel=1e-4)
    assert stats["train/ratio_std"] == pytest.approx(float(ratios.std(unbiased=False)), rel=1e-4)


@pytest.mark.parametrize("which", ["grpo", "tis"])
def test_a_row_zeroed_in_loss_mask_adds_nothing_to_the_loss(which):
    """`--strategy mask`: the batch's ``loss_mask`` zeroes the rows of a group trained over the
    staleness bound; the loss is then that of the other rows alone, whatever the masked row's
    advantage (and the token-mean does not count its tokens)."""
    from jobs.demo.trainer import tis_loss
    torch.manual_seed(0)
    policy = Policy()
    batch = _padded_batch(policy)
    batch["token_staleness"] = torch.zeros_like(batch["response_mask"])
    batch["rollout_log_probs"] = batch["rollout_log_probs"] - 0.1 * batch["response_mask"]

    def loss(tensors, adv):
        if which == "grpo":
            return float(grpo_loss(policy, tensors, adv)[0].detach())
        return float(tis_loss(policy, tensors, adv, 0.2, 2.0)[0].detach())

    masked = {**batch, "loss_mask": batch["response_mask"].clone()}
    masked["loss_mask"][0] = 0
    rest = {k: v[1:] for k, v in batch.items()}
    adv = torch.tensor([1.0, -0.5, 0.5])
    assert loss(masked, adv) == pytest.approx(loss(rest, adv[1:]), rel=1e-6)
    assert loss(masked, torch.tensor([-3.0, -0.5, 0.5])) == pytest.approx(loss(masked, adv))
    assert loss(batch, adv) != pytest.approx(loss(rest, adv[1:]))   # unmasked, row 0 counts


@pytest.mark.parametrize("which", ["grpo", "tis"])
def test_a_step_whose_every_row_is_masked_reports_no_ratio_figures(which):
    """A mean over zero trained tokens is no figure: such a step reports its loss (0) only, and
    the run's summary averages the steps that trained something (None when none did: JSON has
    no NaN), instead of counting that step as a ratio of 0."""
    from jobs.demo.trainer import StepInfo, ratio_summary, tis_loss, tis_summary
    torch.manual_seed(0)
    policy = Policy()
    batch = _padded_batch(policy)
    batch["token_staleness"] = torch.zeros_like(batch["response_mask"])
    batch["loss_mask"] = torch.zeros_like(batch["response_mask"])
    adv = torch.tensor([1.0, -0.5, 0.5])
    loss, stats = grpo_loss(policy, batch, adv) if which == "grpo" else \
        tis_loss(policy, batch, adv, 0.2, 2.0)
    assert stats == {"train/loss": 0.0} and float(loss) == 0.0
    summary = ratio_summary if which == "grpo" else (lambda h: tis_summary(h, 2.0))
    key = "ratio_mean" if which == "grpo" else "tis_weight_mean"
    masked_step = StepInfo(1, stats, {}, None)
    assert summary([masked_step])[key] is None
    trained = StepInfo(2, {f"train/{key}": 1.5, "train/ratio_std": 0.1}, {}, None)
    assert summary([masked_step, trained])[key] == 1.5
