"""Synthetic trajectories built straight as Arrow tables (for benchmarks, the demo and tests)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from schemas import TRAJECTORIES_INPUT


def length_range(text: str) -> tuple[int, int]:
    """A benchmark's token-length option, ``"lo:hi"`` (inclusive) or ``"n"`` for exactly n."""
    lo, _, hi = text.partition(":")
    return int(lo), int(hi or lo)


def token_lists(lengths: np.ndarray, rng: np.random.Generator, vocab: int = 32000) -> pa.ListArray:
    """A list<int32> column of random tokens with the given lengths, built from offsets."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = rng.integers(0, vocab, size=int(offsets[-1]), dtype=np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def trajectories(partition: str, uids: list[str], per_group: int, *, version: int,
                 rewards: np.ndarray, prompt_len: tuple[int, int], response_len: tuple[int, int],
                 rng: np.random.Generator, with_logprobs: bool = True) -> pa.Table:
    """``per_group`` trajectories for each uid, rewards given per trajectory, random lengths."""
    n = len(uids) * per_group
    p_len = rng.integers(prompt_len[0], prompt_len[1] + 1, size=n)
    r_len = rng.integers(response_len[0], response_len[1] + 1, size=n)
    resp = token_lists(r_len, rng)
    cols = {
        "partition": pa.array([partition] * n),
        "uid": pa.array(np.repeat(np.asarray(uids, dtype=object), per_group).tolist()),
        "session_id": pa.array(np.tile(np.arange(per_group, dtype=np.int32), len(uids))),
        "index": pa.array(np.zeros(n, dtype=np.int32)),
        "min_global_steps": pa.array(np.full(n, version, dtype=np.int64)),
        "max_global_steps": pa.array(np.full(n, version, dtype=np.int64)),
        "reward": pa.array(rewards.astype(np.float64)),
        "reward_info": pa.nulls(n, TRAJECTORIES_INPUT.field("reward_info").type),
        "prompt_ids": token_lists(p_len, rng),
        "response_ids": resp,
        "response_mask": pa.ListArray.from_arrays(resp.offsets, pa.array(
            np.ones(len(resp.values), dtype=np.int8))),
        "rollout_log_probs": pa.ListArray.from_arrays(resp.offsets, pa.array(
            -rng.random(len(resp.values), dtype=np.float32))) if with_logprobs
        else pa.nulls(n, pa.list_(pa.float32())),
        "version_spans": pa.nulls(n, TRAJECTORIES_INPUT.field("version_spans").type),
        "is_padding": pa.array(np.zeros(n, dtype=bool)),
        "versions_inferred": pa.array(np.zeros(n, dtype=bool)),
        "generation_s": pa.nulls(n, pa.float64()),
        "n_response_tokens": pa.nulls(n, pa.int64()),     # the tokens say it
    }
    return pa.Table.from_arrays([cols[f.name] for f in TRAJECTORIES_INPUT], schema=TRAJECTORIES_INPUT)
