"""to_torch reads list chunks straight from their buffers: the layouts Arrow allows for the same
rows (a child array that starts inside its buffer, 64-bit offsets, empty chunks, nulls) give the
same tensors as the naive path."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pipeline.to_torch.convert import batch_to_torch
from tests.support.torch_reference import assert_same_tensors, batch_table, naive_to_torch, row
from tests.support.writer_paths import both_writers  # noqa: F401  (autouse: both writers)

LAYOUTS = ["padded", "packed"]


def rows_table(seed: int, n: int, nulls: bool = False) -> pa.Table:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        p, r = int(rng.integers(0, 400)), int(rng.integers(0, 600))
        null = nulls and i % 3 == 1
        rows.append(row(rng.integers(0, 2**31 - 1, p).tolist(),
                        rng.integers(0, 2**31 - 1, r).tolist(),
                        None if null else rng.integers(0, 2, r).tolist(),
                        None if null else (-rng.random(r, dtype=np.float32)).tolist(),
                        reward=float(i)))
    return batch_table(rows)


def child_offset(table: pa.Table, skip: int = 5) -> pa.Table:
    """Every list column rebuilt over a child array sliced out of a larger one (a child offset of
    ``skip`` values, and values after the last row)."""
    cols = {}
    for name in table.column_names:
        col = table.column(name).combine_chunks()
        if not pa.types.is_list(col.type):
            cols[name] = col
            continue
        child = col.flatten()
        padded = pa.concat_arrays([pa.array(np.ones(skip), child.type), child,
                                   pa.array(np.ones(3), child.type)])
        offsets = pa.array(np.asarray(col.offsets) - col.offsets[0].as_py(), pa.int32())
        cols[name] = pa.ListArray.from_arrays(offsets, padded.slice(skip, len(child) + 3),
                                              mask=col.is_null())
    return pa.table(cols)


def large_lists(table: pa.Table) -> pa.Table:
    return table.cast(pa.schema([
        pa.field(f.name, pa.large_list(f.type.value_type)) if pa.types.is_list(f.type) else f
        for f in table.schema]))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("nulls", [False, True])
def test_a_child_array_that_starts_inside_its_buffer_is_read_from_its_own_start(
        layout: str, nulls: bool) -> None:
    table = rows_table(1, 12, nulls)
    moved = child_offset(table)
    assert moved.column("prompt_ids").chunks[0].values.offset == 5
    assert_same_tensors(batch_to_torch(moved, layout=layout, pad_token_id=2),
                        naive_to_torch(table, layout, 2))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_large_lists_with_64_bit_offsets_give_the_same_tensors(layout: str) -> None:
    table = rows_table(2, 10, nulls=True)
    big = large_lists(table)
    assert pa.types.is_large_list(big.schema.field("response_ids").type)
    assert_same_tensors(batch_to_torch(big, layout=layout), naive_to_torch(table, layout))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_empty_chunks_between_chunks_of_rows_are_skipped(layout: str) -> None:
    table = rows_table(3, 9)
    parts = [table.slice(0, 0), table.slice(0, 4), table.slice(4, 0), table.slice(4, 5),
             table.slice(9, 0)]
    chunked = pa.concat_tables(parts)
    assert chunked.column("prompt_ids").num_chunks == 5
    assert_same_tensors(batch_to_torch(chunked, layout=layout), naive_to_torch(table, layout))
