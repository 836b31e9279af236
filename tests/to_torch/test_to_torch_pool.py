"""to_torch with a TensorPool: the same tensors as without one, and a buffer on loan is never
handed out again until it is given back."""
from __future__ import annotations

import warnings

import numpy as np
import pyarrow as pa
import pytest
import torch

from pipeline.to_torch.convert import BatchFormatError, batch_to_torch
from pipeline.to_torch.pool import PoolError, TensorPool
from tests.support.torch_reference import assert_same_tensors, batch_table, naive_to_torch, row
from tests.support.writer_paths import both_writers  # noqa: F401  (autouse: both writers)

LAYOUTS = ["padded", "packed"]


def long_rows(seed: int, n: int, lo: int = 300, hi: int = 700) -> pa.Table:
    """Rows long enough for the row-copy writer, some with null masks and log-probs."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        p, r = int(rng.integers(lo // 2, hi // 2)), int(rng.integers(lo, hi))
        mask = None if i % 3 == 0 else rng.integers(0, 2, r).tolist()
        logp = None if i % 4 == 0 else (-rng.random(r, dtype=np.float32)).tolist()
        rows.append(row(rng.integers(0, 2**31 - 1, p).tolist(),
                        rng.integers(0, 2**31 - 1, r).tolist(), mask, logp, reward=float(i)))
    return batch_table(rows)


def short_rows(seed: int, n: int) -> pa.Table:
    """Rows short enough for the mask writer (it needs zeros it does not write itself)."""
    rng = np.random.default_rng(seed)
    return batch_table([row(rng.integers(1, 9, int(rng.integers(0, 4))).tolist(),
                            rng.integers(1, 9, r).tolist(), [1] * r, [-1.0] * r, reward=1.0)
                        for r in rng.integers(0, 5, n).tolist()])


def storages(tensors: dict[str, torch.Tensor]) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors.values()}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_pooled_tensors_equal_the_naive_path_across_calls_of_growing_and_shrinking_rows(
        layout: str) -> None:
    pool = TensorPool()
    tables = [long_rows(1, 12), long_rows(2, 20, 600, 1200), long_rows(3, 5), short_rows(4, 9),
              long_rows(5, 16)]
    for table in tables:
        out = batch_to_torch(table, layout=layout, pad_token_id=3, pool=pool)
        assert_same_tensors(out, naive_to_torch(table, layout, 3))
        pool.give_back(out)
    assert pool.loaned_bytes == 0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_mask_writer_zeroes_a_reused_buffer_that_holds_an_earlier_batch(layout: str) -> None:
    pool = TensorPool()
    first = batch_to_torch(long_rows(6, 8), layout=layout, pool=pool)
    for t in first.values():
        t.fill_(9)                       # garbage the next call must not leave behind
    used = storages(first)
    pool.give_back(first)
    table = short_rows(7, 30)
    second = batch_to_torch(table, layout=layout, pool=pool)
    assert storages(second) & used      # the buffers were reused
    assert_same_tensors(second, naive_to_torch(table, layout))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_buffer_on_loan_is_never_handed_out_again_until_given_back(layout: str) -> None:
    pool = TensorPool()
    t1, t2 = long_rows(8, 10), long_rows(9, 10)
    a = batch_to_torch(t1, layout=layout, pool=pool)
    b = batch_to_torch(t2, layout=layout, pool=pool)
    assert not storages(a) & storages(b)
    assert_same_tensors(a, naive_to_torch(t1, layout))      # b's call did not write into a
    pool.give_back(a)
    c = batch_to_torch(t1, layout=layout, pool=pool)
    pooled = storages(c) - {t.untyped_storage().data_ptr() for k, t in c.items()
                            if t.numel() <= t1.num_rows + 1}
    assert pooled and pooled <= storages(a)                   # a's buffers, not b's
    assert_same_tensors(b, naive_to_torch(t2, layout))       # b untouched by c's call
    assert_same_tensors(c, naive_to_torch(t1, layout))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_zero_rows_empty_rows_and_one_row_give_the_same_tensors_as_without_a_pool(
        layout: str) -> None:
    pool = TensorPool()
    for rows in ([], [row([], []), row([], [])], [row([1], [2, 3], [1, 0], [-1.0, -2.0])]):
        table = batch_table(rows)
        out = batch_to_torch(table, layout=layout, pool=pool)
        assert_same_tensors(out, batch_to_torch(table, layout=layout))
        pool.give_back(out)
    assert pool.loaned_bytes == 0


def test_giving_back_twice_a_view_or_a_stale_tensor_is_refused() -> None:
    pool = TensorPool()
    table = long_rows(10, 6)
    out = batch_to_torch(table, layout="packed", pool=pool)
    with pytest.raises(PoolError, match="did not hand out"):
        pool.give_back([out["input_ids"].squeeze(0)])
    pool.give_back([*out.values(), out["input_ids"]])     # the same tensor twice in one call
    with pytest.raises(PoolError, match="given back twice"):
        pool.give_back(out)
    again = batch_to_torch(table, layout="packed", pool=pool)
    assert storages(again) & storages(out)
    with pytest.raises(PoolError, match="earlier call"):
        pool.give_back(out)                  # stale: must not free the loan `again` holds
    assert pool.loaned_bytes > 0
    other = batch_to_torch(table, layout="packed", pool=pool)
    assert not storages(other) & storages(again)
    with pytest.raises(PoolError, match="takes tensors"):
        pool.give_back(["input_ids"])


def test_tensors_the_pool_did_not_make_are_ignored_on_give_back() -> None:
    pool = TensorPool()
    out = batch_to_torch(long_rows(11, 4), layout="padded", pool=pool)
    plain = batch_to_torch(long_rows(11, 4), layout="padded")
    pool.give_back(plain)                     # none of these are the pool's
    assert pool.loaned_bytes > 0
    pool.give_back(out)
    assert pool.loaned_bytes == 0 and pool.idle_bytes > 0


def test_a_failed_call_leaves_no_buffer_on_loan() -> None:
    pool = TensorPool()
    table = long_rows(12, 5)
    bad = table.set_column(table.schema.get_field_index("reward"), "reward",
                           pa.array([1.0, None, 1.0, 1.0, 1.0], pa.float64()))
    with pytest.raises(BatchFormatError, match="reward"):
        batch_to_torch(bad, layout="padded", pool=pool)
    assert pool.loaned_bytes == 0 and pool.idle_bytes > 0
    out = batch_to_torch(table, layout="padded", pool=pool)
    assert_same_tensors(out, naive_to_torch(table, "padded"))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_device_torch_cannot_use_is_refused_before_any_buffer_is_lent(layout: str) -> None:
    pool = TensorPool()
    absent = f"cuda:{torch.cuda.device_count()}"     # one past the last GPU, or any without CUDA
    for _ in range(3):
        with pytest.raises(BatchFormatError, match=f"device='{absent}'"):
            batch_to_torch(long_rows(21, 5), layout=layout, device=absent, pool=pool)
    assert pool.loaned_bytes == 0 and pool.idle_bytes == 0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_failed_copy_to_the_device_gives_the_staging_buffers_back(layout: str) -> None:
    # torch knows the xla device type but this build cannot reach it, and has no device module
    # to ask beforehand: the copy itself fails, after the buffers were lent
    pool = TensorPool()
    table = long_rows(22, 6)
    for _ in range(3):
        with pytest.raises(RuntimeError, match="xla"):
            batch_to_torch(table, layout=layout, device="xla", pool=pool)
        assert pool.loaned_bytes == 0 and pool.idle_bytes > 0
    idle = pool.idle_bytes
    out = batch_to_torch(table, layout=layout, pool=pool)     # served from the same buffers
    assert_same_tensors(out, naive_to_torch(table, layout))
    assert pool.idle_bytes + pool.loaned_bytes == idle


def test_max_bytes_bounds_what_the_pool_keeps_but_never_fails_a_call() -> None:
    table = long_rows(13, 10)
    size = sum(t.numel() * t.element_size() for t in batch_to_torch(table).values())
    pool = TensorPool(max_bytes=size // 4)
    a = batch_to_torch(table, pool=pool)
    b = batch_to_torch(table, pool=pool)                  # over the bound: still served
    assert_same_tensors(b, naive_to_torch(table, "padded"))
    pool.give_back(a)
    pool.give_back(b)
    assert pool.loaned_bytes == 0 and 0 < pool.idle_bytes <= size // 4
    with pytest.raises(PoolError, match="max_bytes"):
        TensorPool(max_bytes=-1)


def test_pool_must_be_a_tensor_pool() -> None:
    with pytest.raises(BatchFormatError, match="TensorPool"):
        batch_to_torch(long_rows(14, 2), pool="yes")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the fallback without an accelerator")
def test_pin_memory_with_a_pool_and_no_accelerator_warns_and_uses_pageable_buffers() -> None:
    pool = TensorPool()
    table = long_rows(15, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = batch_to_torch(table, layout="packed", pin_memory=True, pool=pool)
    assert any("pin_memory" in str(w.message) for w in caught)
    assert not any(t.is_pinned() for t in out.values())
    assert_same_tensors(out, naive_to_torch(table, "packed"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("layout", LAYOUTS)
def test_staging_buffers_for_the_gpu_return_to_the_pool_by_themselves(layout: str) -> None:
    pool = TensorPool()
    tables = [long_rows(16 + i, 12) for i in range(4)]
    outs = [batch_to_torch(t, layout=layout, device="cuda", pin_memory=True, pool=pool)
            for t in tables]
    assert pool.loaned_bytes == 0 and pool.idle_bytes > 0
    torch.cuda.synchronize()
    for t, out in zip(tables, outs):
        assert_same_tensors({k: v.cpu() for k, v in out.items()}, naive_to_torch(t, layout))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_copy_that_runs_out_of_gpu_memory_gives_the_staging_buffers_back() -> None:
    pool = TensorPool()
    table = long_rows(23, 400, 600, 1200)          # ~50 MB of tensors
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(torch.cuda.memory_reserved() / total)
    try:
        with pytest.raises(torch.OutOfMemoryError):
            batch_to_torch(table, device="cuda", pin_memory=True, pool=pool)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()
    assert pool.loaned_bytes == 0 and pool.idle_bytes > 0
    out = batch_to_torch(table, device="cuda", pin_memory=True, pool=pool)
    torch.cuda.synchronize()
    assert_same_tensors({k: v.cpu() for k, v in out.items()}, naive_to_torch(table, "padded"))
