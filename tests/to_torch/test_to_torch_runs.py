"""The compiled writer (pipeline/to_torch/_runs.c through pipeline/to_torch/runs.py): bit-identical
tensors to the numpy writers, the switch that turns it off, and every bad run refused before a
byte is written."""
from __future__ import annotations

from unittest import mock

import numpy as np
import pytest

from jobs.bench.to_torch import synthetic_batch
from pipeline.to_torch import runs as seg
from pipeline.to_torch.convert import batch_to_torch
from pipeline.to_torch.pool import TensorPool

needs_extension = pytest.mark.skipif(not seg.HAVE_EXTENSION,
                                     reason="the compiled extension was not built")
I64 = np.int64


def _ix(*values: int) -> np.ndarray:
    return np.array(values, I64)


def _bits(tensors: dict) -> dict:
    """Every tensor as raw bytes (float32 compared bit for bit, -0.0 and NaN included)."""
    return {k: (str(t.dtype), tuple(t.shape), t.contiguous().numpy().tobytes())
            for k, t in tensors.items()}


@needs_extension
@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_both_paths_write_the_same_bytes_on_a_sampled_batch(monkeypatch, layout: str) -> None:
    table = synthetic_batch(40, (100, 400), (200, 900), seed=3, rows_per_chunk=16)
    out = {}
    for path, value in (("compiled", "0"), ("numpy", "1")):
        monkeypatch.setenv(seg.ENV_PURE_PYTHON, value)
        pool = TensorPool()
        for _ in range(2):                   # the second call reuses the pool's buffers
            tensors = batch_to_torch(table, layout=layout, pool=pool)
            out[path] = _bits(tensors)
            pool.give_back(tensors)
    assert out["compiled"] == out["numpy"]


@needs_extension
@pytest.mark.parametrize("value, compiled", [(None, True), ("", True), ("0", True),
                                             ("1", False), ("yes", False)])
def test_the_environment_variable_switches_the_compiled_path_off(monkeypatch, value, compiled
                                                                 ) -> None:
    if value is None:
        monkeypatch.delenv(seg.ENV_PURE_PYTHON, raising=False)
    else:
        monkeypatch.setenv(seg.ENV_PURE_PYTHON, value)
    assert seg.compiled() is compiled
    table = synthetic_batch(4, (300, 300), (300, 300), rows_per_chunk=16)
    with mock.patch.object(seg, "write_rows", wraps=seg.write_rows) as calls:
        batch_to_torch(table, layout="packed")
        batch_to_torch(table, layout="padded")
    assert bool(calls.call_count) is compiled


@needs_extension
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32,
                                   np.int64, np.uint64, np.float32, np.float64])
def test_copies_convert_as_numpy_casts(dtype) -> None:
    rng = np.random.default_rng(1)
    info = np.iinfo(dtype) if np.issubdtype(dtype, np.integer) else None
    src = (rng.integers(info.min, info.max, 50, dtype=dtype, endpoint=True) if info
           else (rng.standard_normal(50) * 1e30).astype(dtype))
    targets = [np.float32] + ([np.int64] if info else [])
    for target in targets:
        assert seg.converts(np.dtype(dtype), target)
        dst = np.full(60, 7, target)
        seg.write_rows(dst, _ix(0, 30), [seg.copy(_ix(20, 30), [src[:25], src[20:]], _ix(1, 2),
                                                  _ix(5, 0))])
        want = np.full(60, 7, target)
        want[:20], want[30:] = src[5:25], src[20:50]
        assert dst.tobytes() == want.tobytes()


@needs_extension
def test_fills_positions_and_several_runs_per_row() -> None:
    dst = np.full(12, -9, I64)
    seg.write_rows(dst, _ix(0, 5), [seg.positions(_ix(2, 3)), seg.fill(_ix(1, 0), 4, I64),
                                    seg.copy(_ix(1, 2), [np.array([8, 9, 10], np.int32)],
                                             _ix(2), _ix(0, 1))])
    assert dst.tolist() == [0, 1, 4, 8, -9, 0, 1, 2, 9, 10, -9, -9]
    f = np.zeros(3, np.float32)
    seg.write_rows(f, _ix(0), [seg.fill(_ix(3), -0.5, np.float32)])
    assert f.tolist() == [-0.5] * 3


def _refused(dst: np.ndarray, row_at: np.ndarray, parts: list, error: type, match: str) -> None:
    before = dst.copy()
    with pytest.raises(error, match=match):
        seg.write_rows(dst, row_at, parts)
    assert dst.tobytes() == before.tobytes()        # nothing written


@needs_extension
def test_runs_outside_the_output_are_refused_before_anything_is_written() -> None:
    dst = np.zeros(10, I64)
    ok = seg.fill(_ix(2, 2), 1, I64)
    _refused(dst, _ix(0, 9), [ok], IndexError, r"row 1: .* pass the output's end \(10 elements\)")
    _refused(dst, _ix(0, -1), [ok], IndexError, "row 1")
    _refused(dst, _ix(0, 11), [seg.fill(_ix(2, 0), 1, I64)], IndexError, "row 1")
    _refused(dst, _ix(0, 4), [ok, seg.positions(_ix(0, 5))], IndexError, "row 1")
    _refused(dst, _ix(0, 4), [seg.fill(_ix(2, -1), 1, I64)], ValueError, "negative length")
    huge = np.iinfo(I64).max
    _refused(dst, _ix(0, 4), [seg.fill(_ix(2, huge), 1, I64), ok], IndexError, "row 1")


@needs_extension
def test_runs_outside_a_source_and_bad_bounds_are_refused() -> None:
    dst = np.zeros(10, I64)
    src = [np.arange(4, dtype=np.int32), np.arange(3, dtype=np.int32)]

    def copy(src_at: np.ndarray, bounds: np.ndarray | None = None, sources: list = src) -> list:
        return [seg.copy(_ix(2, 2), sources, _ix(1, 2) if bounds is None else bounds, src_at)]

    _refused(dst, _ix(0, 4), copy(_ix(0, 2)), IndexError, r"row 1: source elements \[2, 2 \+ 2\)")
    _refused(dst, _ix(0, 4), copy(_ix(3, 0)), IndexError, "row 0: source")
    _refused(dst, _ix(0, 4), copy(_ix(-1, 0)), IndexError, "row 0: source")
    _refused(dst, _ix(0, 4), copy(_ix(0, 0), _ix(1, 1)), ValueError, "bounds end at row 1")
    _refused(dst, _ix(0, 4), copy(_ix(0, 0), _ix(2, 1)), ValueError, "non-decreasing")
    _refused(dst, _ix(0, 4), copy(_ix(0, 0), _ix(2)), ValueError, r"holds 1 entries, expected 2")
    _refused(dst, _ix(0, 4), copy(_ix(0, 0, 0)), ValueError, "src_at holds 3 entries")
    _refused(dst, _ix(0, 4), copy(_ix(0, 0), _ix(1, 2), [src[0], np.zeros(3, np.float32)]),
             TypeError, "float32, not copied into int64")


@needs_extension
def test_buffers_of_the_wrong_kind_are_refused() -> None:
    dst = np.zeros(4, I64)
    _refused(dst, np.array([0], np.int32), [seg.positions(_ix(1))], TypeError, "int64")
    _refused(dst, _ix(0), [seg.positions(np.array([1], np.int32))], TypeError, "int64")
    _refused(dst, _ix(0), [("gather", _ix(1))], ValueError, "unknown kind")
    _refused(dst, _ix(0), [("fill", _ix(1))], TypeError, "takes 3 items")
    _refused(dst, _ix(0), [("fill", _ix(1), 1.5)], TypeError, "integer")
    f = np.zeros(4, np.float32)
    _refused(f, _ix(0), [seg.positions(_ix(1))], TypeError, "positions")
    _refused(np.zeros(4, np.int32), _ix(0), [seg.positions(_ix(1))], TypeError, "int64 or float32")
    ro = np.zeros(4, I64)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        seg.write_rows(ro, _ix(0), [seg.positions(_ix(1))])
    with pytest.raises(ValueError, match="contiguous"):
        seg.write_rows(np.zeros(8, I64)[::2], _ix(0), [seg.positions(_ix(1))])


def test_fill_values_the_tensor_cannot_hold_fail_as_in_numpy() -> None:
    with pytest.raises(OverflowError) as ours:
        seg.fill(_ix(1), 2**63, I64)
    with pytest.raises(OverflowError) as numpy:
        np.full(1, 2**63, I64)
    assert str(ours.value) == str(numpy.value)
