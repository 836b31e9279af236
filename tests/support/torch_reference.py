"""Helpers for the to_torch / export / bench tests: tiny Batch-shaped tables and a sampled lake.

- ``row(prompt, response, ...)``: one Batch row as a dict (payload + the provenance to_torch reads).
- ``batch_table(rows)``: those rows as an Arrow table with the lake's column types.
- ``rechunk(table, cuts)``: the same rows split into chunks with their own buffers at ``cuts``.
- ``embedded(table, before, after)``: the same rows as a slice of a bigger table (offsets that do
  not start at 0, child buffers holding values outside the slice).
- ``assert_same_tensors(a, b)``: same names, dtypes, shapes and every element.
- ``naive_to_torch(table, layout, pad)``: the reference tensors, built the slow obvious way.
- ``sampled_lake(lake, steps)``: drive a real ReplayBuffer over a lake directory and return the
  Batch tables it handed out (what an export of the lake must reproduce).
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from hypothesis import strategies as st
from torch.nn.utils.rnn import pad_sequence

from pipeline import ReplayBuffer

BATCH_SCHEMA = pa.schema([
    ("prompt_ids", pa.list_(pa.int32())),
    ("response_ids", pa.list_(pa.int32())),
    ("response_mask", pa.list_(pa.int8())),
    ("rollout_log_probs", pa.list_(pa.float32())),
    ("reward", pa.float64()),
    ("global_steps", pa.int64()),
    ("min_global_steps", pa.int64()),
    ("max_global_steps", pa.int64()),
    ("staleness", pa.int64()),
    ("is_padding", pa.bool_()),
    ("is_stale", pa.bool_()),
])


def row(prompt: Sequence[int], response: Sequence[int], mask: Sequence[int] | None = None,
        logp: Sequence[float] | None = None, *, reward: float = 0.0, gs: int = 1, mn: int = 0,
        mx: int = 0, staleness: int = 0, is_padding: bool = False, is_stale: bool = False
        ) -> dict[str, Any]:
    return {"prompt_ids": list(prompt), "response_ids": list(response),
            "response_mask": None if mask is None else list(mask),
            "rollout_log_probs": None if logp is None else list(logp), "reward": reward,
            "global_steps": gs, "min_global_steps": mn, "max_global_steps": mx,
            "staleness": staleness, "is_padding": is_padding, "is_stale": is_stale}


def batch_table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=BATCH_SCHEMA)


def rechunk(table: pa.Table, cuts: Sequence[int]) -> pa.Table:
    """Split at the row indices ``cuts``; every chunk gets its own buffers (like `take`)."""
    bounds = [0, *sorted(c for c in cuts if 0 < c < table.num_rows), table.num_rows]
    parts = [table.take(pa.array(np.arange(a, b), pa.int64())) for a, b in zip(bounds, bounds[1:])]
    return pa.concat_tables(parts) if parts else table


def embedded(table: pa.Table, before: list[dict[str, Any]], after: list[dict[str, Any]]
             ) -> pa.Table:
    """``table``'s rows, read back as a slice of [before + rows + after] (one chunk)."""
    whole = batch_table(before + table.to_pylist() + after).combine_chunks()
    return whole.slice(len(before), table.num_rows)


SHAPES = ("one chunk", "chunks", "slice", "slice of chunks")


def drawn_shape(draw: Any, table: pa.Table, extra_rows: Any, cuts: Any) -> pa.Table:
    """``table`` as a hypothesis test draws it: one chunk, chunks with their own buffers (chunk
    boundaries from the strategy ``cuts``), a slice of a longer table (rows before and after from
    the strategy ``extra_rows``), or a slice of chunks."""
    shape = draw(st.sampled_from(SHAPES))
    if shape in ("slice", "slice of chunks"):
        table = embedded(table, draw(extra_rows), draw(extra_rows))
    if shape in ("chunks", "slice of chunks"):
        table = rechunk(table, draw(cuts))
    return table


def assert_same_tensors(ours: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> None:
    assert sorted(ours) == sorted(ref)
    for name in ref:
        a, b = ours[name], ref[name]
        assert a.dtype == b.dtype, (name, a.dtype, b.dtype)
        assert a.shape == b.shape, (name, tuple(a.shape), tuple(b.shape))
        assert torch.equal(a, b), (name, a, b)


def naive_to_torch(table: pa.Table, layout: str = "padded", pad_token_id: int = 0
                   ) -> dict[str, torch.Tensor]:
    """The tensors of `batch_to_torch`, built the slow obvious way (Python lists + pad_sequence).

    Kept deliberately simple: the tests compare `batch_to_torch` with it element for element."""
    cols = {c: table.column(c).to_pylist() for c in
            ("prompt_ids", "response_ids", "response_mask", "rollout_log_probs")}
    seqs, pos, attn, rmask, rlogp, resp, rmask_r, rlogp_r = ([] for _ in range(8))
    for prompt, response, mask, logp in zip(*cols.values()):
        p, r = len(prompt), len(response)
        m = torch.tensor(mask if mask is not None else [1] * r, dtype=torch.int64)
        lp = torch.tensor(logp if logp is not None else [0.0] * r, dtype=torch.float32)
        seqs.append(torch.tensor(prompt + response, dtype=torch.int64))
        pos.append(torch.arange(p + r, dtype=torch.int64))
        attn.append(torch.ones(p + r, dtype=torch.int64))
        rmask.append(torch.cat([torch.zeros(p, dtype=torch.int64), m]))
        rlogp.append(torch.cat([torch.zeros(p, dtype=torch.float32), lp]))
        resp.append(torch.tensor(response, dtype=torch.int64))
        rmask_r.append(m)
        rlogp_r.append(lp)
    lengths = [len(s) for s in seqs]
    if layout == "padded":
        def pad(xs: list, value: float = 0) -> Any:
            return pad_sequence(xs, batch_first=True, padding_value=value)
        out = {"input_ids": pad(seqs, pad_token_id), "attention_mask": pad(attn),
               "position_ids": pad(pos), "response_mask": pad(rmask),
               "rollout_log_probs": pad(rlogp), "responses": pad(resp, pad_token_id),
               "responses_mask": pad(rmask_r), "responses_log_probs": pad(rlogp_r)}
    else:
        out = {"input_ids": torch.cat(seqs)[None], "position_ids": torch.cat(pos)[None],
               "response_mask": torch.cat(rmask)[None], "rollout_log_probs": torch.cat(rlogp)[None],
               "cu_seqlens": torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int32)}
    out["prompt_lengths"] = torch.tensor([len(x) for x in cols["prompt_ids"]], dtype=torch.int64)
    out["response_lengths"] = torch.tensor([len(x) for x in cols["response_ids"]],
                                           dtype=torch.int64)
    out["rewards"] = torch.tensor(table.column("reward").to_pylist(), dtype=torch.float32)
    for c in ("global_steps", "min_global_steps", "max_global_steps", "staleness"):
        out[c] = torch.tensor(table.column(c).to_pylist(), dtype=torch.int64)
    out["is_padding"] = torch.tensor(table.column("is_padding").to_pylist(), dtype=torch.bool)
    # the loss mask: the response mask with every row marked stale zeroed
    stale = (table.column("is_stale").to_pylist() if "is_stale" in table.column_names
             else [False] * table.num_rows)
    keep = torch.tensor([not s for s in stale], dtype=torch.int64)
    if layout == "padded":
        out["loss_mask"] = out["response_mask"] * keep[:, None]
        out["responses_loss_mask"] = out["responses_mask"] * keep[:, None]
    else:
        out["loss_mask"] = out["response_mask"] * torch.repeat_interleave(
            keep, torch.tensor(lengths, dtype=torch.int64))[None]
    return out


def sampled_lake(lake: Path, steps: int = 4, *, groups_per_step: int = 3, batch_groups: int = 2,
                 seed: int = 0, roll_bytes: int | None = None,
                 min_response: int = 0) -> dict[str, list[pa.Table]]:
    """Run a sync buffer over ``lake`` for ``steps`` steps and return its Batch tables per partition.

    Each step registers ``groups_per_step`` train groups (2 sessions each, random lengths, some
    null masks / log-probs) and samples ``batch_groups`` of them, so groups are left behind that
    were never trained on; every other step also samples one `val` group. ``roll_bytes=1``
    finishes a lake segment after every call (a lake of many small files); ``min_response``
    tokens are added to every response (rows of about 9 bytes a token: Parquet row groups of a
    few rows).
    """
    rng = np.random.default_rng(seed)
    out: dict[str, list[pa.Table]] = {"train": [], "val": []}
    with ReplayBuffer.sync(lake=lake, poll_interval=0.05) as buf:
        if roll_bytes is not None:
            buf.lake.roll_bytes = roll_bytes
        for step in range(1, steps + 1):
            for partition, count in (("train", groups_per_step), ("val", 1 if step % 2 else 0)):
                uids = [f"{partition}-{step}-{i}" for i in range(count)]
                if not uids:
                    continue
                buf.register(partition=partition, uids=uids, global_steps=step, n=2)
                rows = []
                for uid in uids:
                    for session in range(2):
                        r = min_response + int(rng.integers(0, 6))
                        rows.append({
                            "partition": partition, "uid": uid, "session_id": session,
                            "min_global_steps": step - 1, "max_global_steps": step - 1,
                            "reward": float(session),
                            "prompt_ids": rng.integers(0, 99, int(rng.integers(1, 5))).tolist(),
                            "response_ids": rng.integers(0, 99, r).tolist(),
                            "response_mask": None if session else rng.integers(0, 2, r).tolist(),
                            "rollout_log_probs": (-rng.random(r)).tolist() if session else None,
                        })
                buf.put(rows)
                buf.update_status(partition=partition, uids=uids, status="running")
                buf.update_status(partition=partition, uids=uids, status="finished")
            batch = buf.sample(step, "train", batch_groups)
            out["train"].append(batch.table)
            buf.release(batch)
            if step % 2:
                val = buf.sample(step, "val", 1)
                out["val"].append(val.table)
                buf.release(val)
    return out
