"""Batch table -> torch tensors: element-for-element equal to the naive pad_sequence path."""
from __future__ import annotations

import io
import warnings
from unittest import mock

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pipeline import ReplayBuffer, ReplayLakeError
from pipeline.to_torch import convert as to_torch
from pipeline.to_torch import ragged as to_torch_ragged
from pipeline.to_torch import rows as to_torch_rows
from pipeline.to_torch.convert import BatchFormatError, batch_to_torch
from tests.support.torch_reference import (
    assert_same_tensors,
    batch_table,
    drawn_shape,
    naive_to_torch,
    rechunk,
    row,
)
from tests.support.writer_paths import both_writers  # noqa: F401  (autouse: both writers)

PADDED = {"input_ids": torch.int64, "attention_mask": torch.int64, "position_ids": torch.int64,
          "response_mask": torch.int64, "rollout_log_probs": torch.float32,
          "responses": torch.int64, "responses_mask": torch.int64,
          "responses_log_probs": torch.float32, "loss_mask": torch.int64,
          "responses_loss_mask": torch.int64}
PACKED = {"input_ids": torch.int64, "position_ids": torch.int64, "response_mask": torch.int64,
          "rollout_log_probs": torch.float32, "cu_seqlens": torch.int32,
          "loss_mask": torch.int64}
PER_ROW = {"prompt_lengths": torch.int64, "response_lengths": torch.int64,
           "rewards": torch.float32, "global_steps": torch.int64, "min_global_steps": torch.int64,
           "max_global_steps": torch.int64, "staleness": torch.int64, "is_padding": torch.bool}

LITERAL = batch_table([
    row([5, 6], [7, 8, 9], [1, 0, 1], [-0.5, -1.0, -1.5], reward=1.0, gs=3, mn=1, mx=2,
        staleness=0),
    row([4], [], [], [], reward=0.0, gs=3, mn=2, mx=2, staleness=0, is_padding=True),
    row([], [3, 2], None, None, reward=0.5, gs=2, mn=0, mx=1, staleness=1),
])


@st.composite
def batch_rows(draw: st.DrawFn, min_rows: int = 1, max_rows: int = 10) -> list[dict]:
    """Rows with random lengths (empty prompts and responses included), null or explicit masks
    and log-probs, and padding rows."""
    rows = []
    for _ in range(draw(st.integers(min_rows, max_rows))):
        p = draw(st.integers(0, 6))
        r = draw(st.integers(0, 6))
        ids = st.lists(st.integers(0, 2**31 - 1), min_size=p, max_size=p)
        mask = draw(st.none() | st.lists(st.integers(0, 1), min_size=r, max_size=r))
        logp = draw(st.none() | st.lists(st.floats(-20, 0, width=32), min_size=r, max_size=r))
        rows.append(row(draw(ids), draw(st.lists(st.integers(0, 2**31 - 1), min_size=r,
                                                 max_size=r)),
                        mask, logp, reward=draw(st.floats(-1, 1)), gs=draw(st.integers(0, 9)),
                        mn=draw(st.integers(0, 4)), mx=draw(st.integers(4, 8)),
                        staleness=draw(st.integers(-1, 5)), is_padding=draw(st.booleans()),
                        is_stale=draw(st.booleans())))
    return rows


@st.composite
def batch_tables(draw: st.DrawFn) -> pa.Table:
    """The same kind of rows as one chunk, as chunks with their own buffers, or as a slice."""
    rows = draw(batch_rows())
    return drawn_shape(draw, batch_table(rows), batch_rows(0, 3),
                       st.lists(st.integers(0, len(rows)), max_size=4))


# Both writers on the same tables: ROW_COPY_MIN_TOKENS=0 sends every non-empty batch through the
# row-copy writer (concatenated views), a huge one through the mask writer.
WRITERS = st.sampled_from([0, 1 << 30])


@given(table=batch_tables(), pad=st.sampled_from([0, 7, -1]),
       piece=st.sampled_from([1, 3, 1 << 14]), row_copy_min=WRITERS)
def test_padded_matches_naive_pad_sequence_element_for_element(table: pa.Table, pad: int,
                                                               piece: int,
                                                               row_copy_min: int) -> None:
    with mock.patch.object(to_torch_ragged, "MIN_PIECE_VALUES", piece), \
            mock.patch.object(to_torch_rows, "ROW_COPY_MIN_TOKENS", row_copy_min):
        ours = batch_to_torch(table, layout="padded", pad_token_id=pad)
    assert_same_tensors(ours, naive_to_torch(table, "padded", pad))


@given(table=batch_tables(), piece=st.sampled_from([1, 3, 1 << 14]), row_copy_min=WRITERS)
def test_packed_matches_naive_concatenation_element_for_element(table: pa.Table, piece: int,
                                                                row_copy_min: int) -> None:
    with mock.patch.object(to_torch_ragged, "MIN_PIECE_VALUES", piece), \
            mock.patch.object(to_torch_rows, "ROW_COPY_MIN_TOKENS", row_copy_min):
        ours = batch_to_torch(table, layout="packed")
    assert_same_tensors(ours, naive_to_torch(table, "packed"))


def test_long_rows_take_the_row_copy_writer_and_short_rows_the_mask_writer() -> None:
    assert to_torch_rows.use_row_copy("packed", 4, 4 * 3000, 3500)
    assert to_torch_rows.use_row_copy("padded", 64, 64 * 10, 4096)   # padding dominates
    assert not to_torch_rows.use_row_copy("packed", 64, 64 * 10, 4096)
    assert not to_torch_rows.use_row_copy("padded", 0, 0, 0)


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_long_rows_of_a_sampled_shape_match_the_naive_path(layout: str) -> None:
    # lengths above ROW_COPY_MIN_TOKENS without patching anything, in 16-row chunks like `sample`
    rng = np.random.default_rng(3)
    rows = []
    for i in range(40):
        p, r = int(rng.integers(200, 400)), int(rng.integers(300, 700))
        mask = None if i % 7 == 0 else rng.integers(0, 2, r).tolist()
        logp = None if i % 5 == 0 else (-rng.random(r, dtype=np.float32)).tolist()
        rows.append(row(rng.integers(0, 2**31 - 1, p).tolist(),
                        rng.integers(0, 2**31 - 1, r).tolist(), mask, logp, reward=float(i)))
    table = rechunk(batch_table(rows), list(range(16, 40, 16)))
    assert to_torch_rows.use_row_copy(layout, 40, 40 * 600, 1100)
    assert_same_tensors(batch_to_torch(table, layout=layout, pad_token_id=5),
                        naive_to_torch(table, layout, 5))


def test_padded_tensors_have_the_documented_names_dtypes_and_shapes() -> None:
    out = batch_to_torch(LITERAL, layout="padded")
    assert {k: v.dtype for k, v in out.items()} == {**PADDED, **PER_ROW}
    B, L, R = 3, 5, 3
    for name in ("input_ids", "attention_mask", "position_ids", "response_mask",
                 "rollout_log_probs"):
        assert out[name].shape == (B, L)
    for name in ("responses", "responses_mask", "responses_log_probs"):
        assert out[name].shape == (B, R)
    for name in PER_ROW:
        assert out[name].shape == (B,)


def test_packed_tensors_have_the_documented_names_dtypes_and_shapes() -> None:
    out = batch_to_torch(LITERAL, layout="packed")
    assert {k: v.dtype for k, v in out.items()} == {**PACKED, **PER_ROW}
    for name in ("input_ids", "position_ids", "response_mask", "rollout_log_probs"):
        assert out[name].shape == (1, 8)
    assert out["cu_seqlens"].shape == (4,)


def test_padded_literal_batch_is_prompt_then_response_right_padded() -> None:
    out = batch_to_torch(LITERAL, layout="padded", pad_token_id=-1)
    assert out["input_ids"].tolist() == [[5, 6, 7, 8, 9], [4, -1, -1, -1, -1],
                                         [3, 2, -1, -1, -1]]
    assert out["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0]]
    assert out["position_ids"].tolist() == [[0, 1, 2, 3, 4], [0, 0, 0, 0, 0], [0, 1, 0, 0, 0]]
    # the loss mask sits on the response tokens' positions; a null mask means all ones
    assert out["response_mask"].tolist() == [[0, 0, 1, 0, 1], [0] * 5, [1, 1, 0, 0, 0]]
    assert out["rollout_log_probs"].tolist() == [[0, 0, -0.5, -1.0, -1.5], [0] * 5, [0] * 5]
    assert out["responses"].tolist() == [[7, 8, 9], [-1, -1, -1], [3, 2, -1]]
    assert out["responses_mask"].tolist() == [[1, 0, 1], [0, 0, 0], [1, 1, 0]]
    assert out["responses_log_probs"].tolist() == [[-0.5, -1.0, -1.5], [0] * 3, [0] * 3]
    assert out["prompt_lengths"].tolist() == [2, 1, 0]
    assert out["response_lengths"].tolist() == [3, 0, 2]
    assert out["rewards"].tolist() == [1.0, 0.0, 0.5]
    assert out["global_steps"].tolist() == [3, 3, 2]
    assert out["min_global_steps"].tolist() == [1, 2, 0]
    assert out["max_global_steps"].tolist() == [2, 2, 1]
    assert out["staleness"].tolist() == [0, 0, 1]
    assert out["is_padding"].tolist() == [False, True, False]


def test_packed_cu_seqlens_delimit_every_row_and_positions_restart() -> None:
    out = batch_to_torch(LITERAL, layout="packed")
    cu = out["cu_seqlens"].tolist()
    assert cu == [0, 5, 6, 8]
    ids = out["input_ids"][0]
    assert [ids[a:b].tolist() for a, b in zip(cu, cu[1:])] == [[5, 6, 7, 8, 9], [4], [3, 2]]
    assert out["position_ids"].tolist() == [[0, 1, 2, 3, 4, 0, 0, 1]]
    assert out["response_mask"].tolist() == [[0, 0, 1, 0, 1, 0, 1, 1]]


@given(rows=batch_rows())
def test_packed_cu_seqlens_are_the_running_sum_of_row_lengths(rows: list[dict]) -> None:
    out = batch_to_torch(batch_table(rows), layout="packed")
    lengths = [len(r["prompt_ids"]) + len(r["response_ids"]) for r in rows]
    assert out["cu_seqlens"].tolist() == [0, *np.cumsum(lengths).tolist()]
    assert out["input_ids"].shape == (1, sum(lengths))


def test_a_null_list_that_still_owns_values_is_read_as_null() -> None:
    # Arrow lets a null slot span values (here row 1 spans 3 garbage values): they must be skipped.
    table = batch_table([row([1], [2, 3]), row([4], [5, 6, 7]), row([8], [9])])
    mask = pa.ListArray.from_arrays(pa.array([0, 2, 5, 6], pa.int32()),
                                    pa.array([1, 0, 9, 9, 9, 0], pa.int8()),
                                    mask=pa.array([False, True, False]))
    table = table.set_column(2, "response_mask", mask)
    out = batch_to_torch(table)
    assert out["responses_mask"].tolist() == [[1, 0, 0], [1, 1, 1], [0, 0, 0]]
    assert_same_tensors(out, naive_to_torch(table))


def test_single_row_and_all_empty_rows() -> None:
    one = batch_table([row([1], [2, 3], [1, 1], [-1.0, -2.0])])
    assert_same_tensors(batch_to_torch(one), naive_to_torch(one))
    empty_rows = batch_table([row([], []), row([], [])])
    out = batch_to_torch(empty_rows)
    assert out["input_ids"].shape == (2, 0) and out["responses"].shape == (2, 0)
    assert batch_to_torch(empty_rows, layout="packed")["cu_seqlens"].tolist() == [0, 0, 0]


def test_zero_rows_give_empty_tensors() -> None:
    out = batch_to_torch(batch_table([]))
    assert out["input_ids"].shape == (0, 0) and out["rewards"].shape == (0,)
    packed = batch_to_torch(batch_table([]), layout="packed")
    assert packed["input_ids"].shape == (1, 0) and packed["cu_seqlens"].tolist() == [0]


def test_outputs_are_writable_copies_that_never_touch_the_arrow_buffers() -> None:
    table = batch_table([row([1, 2], [3], [1], [-1.0], reward=2.0)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")        # torch warns when it wraps a read-only array
        out = batch_to_torch(table)
    for t in out.values():
        t.zero_()
    assert table.column("prompt_ids").to_pylist() == [[1, 2]]
    assert table.column("reward").to_pylist() == [2.0]


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_outputs_survive_torch_save_and_load(layout: str) -> None:
    out = batch_to_torch(LITERAL, layout=layout)
    buf = io.BytesIO()
    torch.save(out, buf)
    buf.seek(0)
    assert_same_tensors(torch.load(buf), out)


def test_unknown_layout_is_a_batch_format_error() -> None:
    with pytest.raises(BatchFormatError, match="layout='ragged'.*padded, packed"):
        batch_to_torch(LITERAL, layout="ragged")
    assert issubclass(BatchFormatError, ReplayLakeError)


def test_missing_columns_are_named_in_the_error() -> None:
    with pytest.raises(BatchFormatError, match="staleness, is_padding"):
        batch_to_torch(LITERAL.drop_columns(["staleness", "is_padding"]))


def test_mask_of_the_wrong_length_names_the_column_and_rows() -> None:
    bad = batch_table([row([1], [2, 3], [1, 1]), row([1], [2, 3], [1])])
    with pytest.raises(BatchFormatError, match=r"response_mask.*rows \[1\]"):
        batch_to_torch(bad)


def test_null_token_lists_and_null_items_are_rejected() -> None:
    null_prompt = LITERAL.set_column(0, "prompt_ids",
                                     pa.array([[1], None, [2]], pa.list_(pa.int32())))
    with pytest.raises(BatchFormatError, match=r"prompt_ids.*rows \[1\]"):
        batch_to_torch(null_prompt)
    null_item = LITERAL.set_column(0, "prompt_ids",
                                   pa.array([[1, None], [1], []], pa.list_(pa.int32())))
    with pytest.raises(BatchFormatError, match="null items"):
        batch_to_torch(null_item)
    # a null item outside the slice a table holds is none of its business
    assert batch_to_torch(null_item.slice(1, 2))["input_ids"].tolist() == [[1, 0], [3, 2]]


def test_device_cpu_keeps_tensors_on_the_host() -> None:
    out = batch_to_torch(LITERAL, device="cpu")
    assert all(t.device.type == "cpu" for t in out.values())


@pytest.mark.parametrize("layout", ["padded", "packed"])
@pytest.mark.parametrize("pad", [2**63, -(2**63) - 1, np.uint64(2**63)])
def test_a_pad_token_id_past_int64_is_refused_in_both_layouts(layout: str, pad: int) -> None:
    with pytest.raises(BatchFormatError, match=r"pad_token_id=.*does not fit the int64 token"):
        batch_to_torch(LITERAL, layout=layout, pad_token_id=pad)


def test_the_int64_extremes_are_valid_pad_token_ids() -> None:
    for pad in (2**63 - 1, -(2**63)):
        out = batch_to_torch(LITERAL, layout="padded", pad_token_id=pad)
        assert out["input_ids"][1, 1:].tolist() == [pad] * 4
        assert out["responses"][1].tolist() == [pad] * 3


def test_a_device_that_is_not_a_torch_device_is_refused_by_name() -> None:
    with pytest.raises(BatchFormatError, match="device='gpu0' is not a device torch can use"):
        batch_to_torch(LITERAL, device="gpu0")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the fallback without an accelerator")
def test_pin_memory_without_an_accelerator_warns_and_returns_ordinary_memory() -> None:
    with pytest.warns(UserWarning, match="no accelerator") as direct:
        out = batch_to_torch(LITERAL, pin_memory=True)
    assert_same_tensors(out, batch_to_torch(LITERAL))
    from pipeline import ReplayBuffer
    from tests.support.policies import group
    buf = ReplayBuffer.sync()
    group(buf, "a", 1, [0.0, 1.0])
    with pytest.warns(UserWarning, match="no accelerator") as via_batch:
        buf.sample(1, "train", 1).to_torch(pin_memory=True)
    # the warning names the caller's line (it named pipeline/decide/batch.py for Batch.to_torch)
    assert [w.filename for w in (*direct, *via_batch)] == [__file__, __file__]


@pytest.mark.parametrize("row_copy_min", [0, 1 << 30])
@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_the_pinned_path_writes_its_buffers_in_place_like_the_plain_path(layout: str,
                                                                         row_copy_min: int
                                                                         ) -> None:
    # Without CUDA nothing can be pinned, so let the pinning calls hand back ordinary memory: what
    # is tested is that buffers torch allocates (not numpy) are filled exactly like the plain ones.
    real_zeros, real_empty = torch.zeros, torch.empty

    def zeros(*args, pin_memory: bool = False, **kw):
        assert pin_memory
        return real_zeros(*args, **kw)

    def empty(*args, pin_memory: bool = False, **kw):
        assert pin_memory
        return real_empty(*args, **kw)

    table = rechunk(batch_table([row([1, 2], [3], [0], None), row([], [4, 5], None, [-1.0, -2.0]),
                                 row([6], [])]), [1])
    with mock.patch.object(to_torch, "_can_pin", return_value=True), \
            mock.patch.object(to_torch.torch, "zeros", zeros), \
            mock.patch.object(to_torch.torch, "empty", empty), \
            mock.patch.object(to_torch_rows, "ROW_COPY_MIN_TOKENS", row_copy_min), \
            mock.patch.object(torch.Tensor, "pin_memory", lambda self: self.clone()), \
            mock.patch.object(to_torch_ragged, "MIN_PIECE_VALUES", 1):
        out = batch_to_torch(table, layout=layout, pin_memory=True, pad_token_id=-7)
    assert_same_tensors(out, naive_to_torch(table, layout, -7))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_pinned_host_tensors_copy_to_the_gpu_unchanged(layout: str) -> None:
    host = batch_to_torch(LITERAL, layout=layout, pin_memory=True)
    assert all(t.is_pinned() for t in host.values())
    dev = batch_to_torch(LITERAL, layout=layout, device="cuda", pin_memory=True)
    torch.cuda.synchronize()
    assert all(t.device.type == "cuda" for t in dev.values())
    assert_same_tensors({k: v.cpu() for k, v in dev.items()}, naive_to_torch(LITERAL, layout))


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_replay_buffer_sample_to_torch_matches_the_naive_path(tmp_path, layout: str) -> None:
    with ReplayBuffer.sync(lake=tmp_path / "lake", poll_interval=0.05) as buf:
        for uid, gs in (("a", 1), ("b", 1), ("c", 2)):
            buf.register(partition="train", uids=[uid], global_steps=gs, n=2)
            buf.put([{"partition": "train", "uid": uid, "session_id": s, "min_global_steps": 0,
                      "max_global_steps": gs - 1, "reward": float(s),
                      "prompt_ids": [1, 2, s], "response_ids": list(range(s + gs)),
                      "response_mask": [1] * (s + gs) if s else None,
                      "rollout_log_probs": None if s else [-0.25] * gs} for s in range(2)])
            buf.update_status(partition="train", uids=[uid], status="running")
            buf.update_status(partition="train", uids=[uid], status="finished")
        batch = buf.sample(2, "train", 3)
        out = batch.to_torch(layout=layout, pad_token_id=3)
        assert_same_tensors(out, naive_to_torch(batch.table, layout, 3))
        assert out["staleness"].tolist() == [1, 1, 1, 1, 0, 0]
        assert out["global_steps"].tolist() == [1, 1, 1, 1, 2, 2]
        buf.release(batch)


def test_rows_whose_payload_retention_dropped_are_refused_naming_them() -> None:
    """A row read back from a lake past its retention horizon keeps `n_response_tokens` while
    retention empties its token lists (EMPTIED) and nulls the per-token fields (NULLED): it is
    refused, where it became empty tensors. A row that never had tokens converts as before."""
    from pipeline import ReplayBuffer
    from pipeline.lake.retention import EMPTIED, NULLED
    from tests.support.policies import group
    buf = ReplayBuffer.async_(max_off_policy_threshold=None)
    group(buf, "g", 1, [0.0, 1.0])
    table = buf.sample(1, "train", 1, timeout=5).table
    assert batch_to_torch(table)["response_lengths"].tolist() == [
        len(r) for r in table.column("response_ids").to_pylist()]
    retained = table
    for name in EMPTIED:
        typ = table.schema.field(name).type
        retained = retained.set_column(retained.schema.get_field_index(name), name,
                                       pa.array([[] for _ in range(table.num_rows)], typ))
    for name in NULLED:
        typ = table.schema.field(name).type
        retained = retained.set_column(retained.schema.get_field_index(name), name,
                                       pa.nulls(table.num_rows, typ))
    for layout in ("packed", "padded"):
        with pytest.raises(BatchFormatError, match=r"response_ids.*rows \[0, 1\].*retain"):
            batch_to_torch(retained, layout=layout)
    never = retained.set_column(retained.schema.get_field_index("n_response_tokens"),
                                "n_response_tokens", pa.array([0, 0], pa.int64()))
    assert batch_to_torch(never)["response_lengths"].tolist() == [0, 0]


def test_rows_sent_as_a_response_length_without_tokens_are_refused_saying_so() -> None:
    """A producer that keeps the tokens elsewhere (the verl adapter without `full`) sends the
    length alone: such a batch has no tensors to give, and the error says why."""
    from tests.support.lake import traj
    buf = ReplayBuffer.async_(max_off_policy_threshold=None)
    buf.register(partition="train", uids=["g"], global_steps=1)
    buf.put([traj("g", s, reward=float(s), response=(), n_response_tokens=3) for s in (0, 1)])
    buf.update_status(partition="train", uids=["g"], status="finished")
    batch = buf.sample(1, "train", 1, timeout=5)
    assert batch.table["n_response_tokens"].to_pylist() == [3, 3]
    with pytest.raises(BatchFormatError, match=r"rows \[0, 1\].*never sent.*sent the response "
                                                r"length alone.*mirror_fields='full'"):
        batch.to_torch()


def test_a_reward_beyond_float32_is_refused_and_inf_or_the_largest_float32_pass() -> None:
    """The rewards tensor is float32: 1e39 became inf there, silently."""
    big = batch_table([row([1], [2], [1], reward=1.0), row([1], [2], [1], reward=-1e39),
                       row([1], [2], [1], reward=1e39)])
    with pytest.raises(BatchFormatError, match=r"'reward' is beyond float32's range .* rows "
                       r"\[1, 2\]"):
        batch_to_torch(big)
    top = float(np.finfo(np.float32).max)
    ok = batch_table([row([1], [2], [1], reward=top), row([1], [2], [1], reward=float("inf"))])
    assert batch_to_torch(ok)["rewards"].tolist() == [top, float("inf")]
