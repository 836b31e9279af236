"""The demo's task and policy: reverse 1-3 random digits with a tiny GRU, and its GRPO loss.

Why this task: it has a verifiable 0/1 reward (an exact match), a random policy already solves it
now and then (~6 % of the time, mostly the 1-digit prompts), so GRPO gets a first signal at once,
and a 64/128 GRU learns it in a few hundred steps on two CPU cores. The fraction of prompts whose
8 answers are all right or all wrong starts near 1, dips while the policy learns and climbs back
once it is solved: DAPO's zero-variance filter has real work throughout. (Measured on this
machine: lr >= 3e-3 collapses onto fixed wrong answers; 4 digits with an end token never gets a
first success.)

Tokens: 0 = padding, 1 = the separator that ends a prompt, 2..11 = the digits 0..9. A prompt is
its digits then the separator; the response is as many digits as the prompt has. The policy's
head predicts only digits (10 classes), so every response token is a digit.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

PAD, SEP, DIGIT0 = 0, 1, 2
VOCAB = 12
N_DIGITS = 10
MAX_DIGITS = 3


def sample_prompts(rng: np.random.Generator, n: int) -> list[list[int]]:
    """`n` prompts of 1..3 random digits (the digits themselves, 0..9)."""
    lengths = rng.integers(1, MAX_DIGITS + 1, size=n)
    return [rng.integers(0, N_DIGITS, size=int(k)).tolist() for k in lengths]


def dataset_index(digits: list[int]) -> int:
    """The prompt's row in the task's dataset: all 1,110 prompts of 1..3 digits, shorter ones
    first, each length in numeric order ("0".."9" -> 0..9, "00".."99" -> 10..109, ...).

    Why: the buffer records it as the group's `prompt_id`, so the lake can say which prompts
    keep getting evicted. Prompts are drawn at random, so the same prompt comes back as many
    groups, which is what such a question needs."""
    if not 1 <= len(digits) <= MAX_DIGITS:
        raise ValueError(f"a prompt has 1 to {MAX_DIGITS} digits, not {len(digits)}")
    offset = sum(N_DIGITS ** k for k in range(1, len(digits)))
    return offset + int("".join(map(str, digits)))


def prompt_of(index: int) -> list[int]:
    """The prompt at dataset row ``index`` (the inverse of `dataset_index`): a resumed run reads
    an in-flight group's prompt back from the `prompt_id` it was registered with."""
    offset = 0
    for k in range(1, MAX_DIGITS + 1):
        if 0 <= index - offset < N_DIGITS ** k:
            return [int(c) for c in str(index - offset).zfill(k)]
        offset += N_DIGITS ** k
    raise ValueError(f"prompt id {index} is not a row of the task's dataset (0..{offset - 1})")


def prompt_ids(digits: list[int]) -> list[int]:
    return [d + DIGIT0 for d in digits] + [SEP]


def reward(digits: list[int], response_ids: list[int]) -> float:
    """1.0 for the exact reversal, else 0.0."""
    return float([t - DIGIT0 for t in response_ids] == digits[::-1])


class Policy(nn.Module):
    """Embedding(12, 64) -> GRU(64, 128) -> Linear(128, 10 digits)."""

    def __init__(self, embed: int = 64, hidden: int = 128):
        super().__init__()
        self.hidden = hidden
        self.embed = nn.Embedding(VOCAB, embed)
        self.gru = nn.GRU(embed, hidden, batch_first=True)
        self.head = nn.Linear(hidden, N_DIGITS)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Digit logits after every position: ``[B, L, 10]`` (right padding is harmless: a GRU
        reads left to right, so padding never reaches an earlier position)."""
        out, _ = self.gru(self.embed(input_ids))
        return self.head(out)

    def token_log_probs(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``[B, L]``: at each position, the log-prob of the token there given the tokens before
        it (0.0 at position 0 and wherever the token is not a digit)."""
        logp = torch.log_softmax(self(input_ids[:, :-1]), dim=-1)
        target = (input_ids[:, 1:] - DIGIT0).clamp(0, N_DIGITS - 1)
        out = torch.zeros(input_ids.shape, dtype=logp.dtype)
        out[:, 1:] = logp.gather(2, target.unsqueeze(-1)).squeeze(-1)
        return out


def generate(policy: Policy, prompts: list[list[int]], n: int, *,
             before_token: Callable[[], int], generator: torch.Generator | None = None,
             ) -> tuple[np.ndarray, np.ndarray, list[int], np.ndarray]:
    """Sample `n` responses per prompt at temperature 1, one token position at a time.

    ``before_token()`` runs before each position and returns the weight version the policy holds
    for it: a rollout worker loads newer weights there, so one response can be written by two
    versions (as a server that swaps weights mid-generation does). Prompts are left-padded and
    the GRU state is frozen on padding, so every row reaches its separator at the same time.
    Returns tokens ``[N, R]`` (token ids), their log-probs ``[N, R]``, the version of each
    position (``R`` of them) and each row's response length (= its prompt's digit count).
    """
    lengths = np.repeat([len(p) for p in prompts], n)
    width = int(lengths.max()) + 1
    ids = np.zeros((len(lengths), width), dtype=np.int64)
    for i, p in enumerate(prompts):
        ids[i * n:(i + 1) * n, width - len(p) - 1:] = prompt_ids(p)
    ids_t = torch.from_numpy(ids)
    real = (ids_t != PAD).T.unsqueeze(-1)                  # [width, N, 1]
    tokens, logps, versions = [], [], []
    with torch.no_grad():
        h = torch.zeros(1, len(lengths), policy.hidden)
        versions.append(before_token())
        for t in range(width):
            _, h_next = policy.gru(policy.embed(ids_t[:, t:t + 1]), h)
            h = torch.where(real[t], h_next, h)
        for k in range(int(lengths.max())):
            if k:
                versions.append(before_token())
            logp = torch.log_softmax(policy.head(h[0]), dim=-1)
            tok = torch.multinomial(logp.exp(), 1, generator=generator)
            tokens.append(tok[:, 0] + DIGIT0)
            logps.append(logp.gather(1, tok)[:, 0])
            _, h = policy.gru(policy.embed(tok + DIGIT0), h)
    return (torch.stack(tokens, 1).numpy(), torch.stack(logps, 1).numpy(), versions, lengths)


def version_spans(versions: list[int], length: int) -> list[dict[str, int]]:
    """Per-token versions of the first `length` positions as runs of (version, n_tokens)."""
    spans: list[dict[str, int]] = []
    for v in versions[:length]:
        if spans and spans[-1]["version"] == v:
            spans[-1]["n_tokens"] += 1
        else:
            spans.append({"version": v, "n_tokens": 1})
    return spans


def group_advantages(group: np.ndarray, rewards: torch.Tensor) -> torch.Tensor:
    """GRPO's outcome advantage: (reward - group mean) / (group std + 1e-6), std with n - 1."""
    _, inv, counts = np.unique(group, return_inverse=True, return_counts=True)
    idx = torch.from_numpy(inv)
    k = len(counts)
    n = torch.from_numpy(counts).to(rewards.dtype)
    mean = torch.zeros(k, dtype=rewards.dtype).index_add_(0, idx, rewards) / n
    dev = rewards - mean[idx]
    var = torch.zeros(k, dtype=rewards.dtype).index_add_(0, idx, dev * dev) / (n - 1).clamp(min=1)
    return dev / (var.sqrt()[idx] + 1e-6)


def trained_tokens(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """The tokens the loss counts, as float: ``loss_mask``, which `to_torch` returns as
    ``response_mask`` with the rows of groups trained masked (``--strategy mask``: over the
    staleness bound, kept in the batch with their loss switched off) zeroed; under every other
    strategy it equals ``response_mask``. A hand-built batch without it counts every response
    token."""
    return tensors.get("loss_mask", tensors["response_mask"]).to(torch.float32)


def grpo_loss(policy: Policy, tensors: dict[str, torch.Tensor], advantages: torch.Tensor,
              clip: float = 0.2) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip surrogate with per-token importance ratios against the rollout log-probs
    (the behaviour policy may be a version or two behind, or two versions within one
    response), averaged over the trained response tokens of the batch (token-mean over
    `trained_tokens`: a masked stale row adds nothing, to the loss or to the count)."""
    mask = trained_tokens(tensors)
    logp = policy.token_log_probs(tensors["input_ids"])
    ratio = torch.exp((logp - tensors["rollout_log_probs"]) * mask)
    adv = advantages.unsqueeze(1)
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
    tokens = mask.sum().clamp(min=1)
    loss = -(surrogate * mask).sum() / tokens
    if not mask.any():       # every row masked: the step trains nothing, and its ratios are no
        return loss, {"train/loss": float(loss)}   # figure (a mean over zero tokens)
    with torch.no_grad():
        clipped = ((ratio - 1).abs() > clip).to(torch.float32)
        mean = (ratio * mask).sum() / tokens
        stats = {"train/loss": float(loss),
                 "train/ratio_mean": float(mean),
                 # the spread of the trained tokens' ratios: how far the rollouts' behaviour is
                 # from the trainer's (0 when every token is on-policy)
                 "train/ratio_std": float((((ratio - mean) * mask) ** 2).sum().div(tokens).sqrt()),
                 "train/clip_fraction": float((clipped * mask).sum() / tokens)}
    return loss, stats
