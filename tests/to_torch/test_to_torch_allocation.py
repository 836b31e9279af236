"""Every large output of a call without a pool or pinning comes from numpy's allocator (which
serves it from memory an earlier batch freed), none from torch's (which maps fresh pages for every
large tensor and faults each one in again): the loss mask once came from torch's, and cost a
packed B=1024 batch ~5,000 extra page faults a call."""
from __future__ import annotations

import pytest
import torch

from jobs.bench.to_torch import synthetic_batch
from pipeline.to_torch.convert import batch_to_torch

LARGE = 4096      # elements: every token tensor of the batch below is larger, no per-row one is


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_no_large_unpinned_output_is_allocated_by_torch(layout: str, monkeypatch) -> None:
    made: list[tuple] = []
    for name in ("empty", "zeros"):
        real = getattr(torch, name)

        def spy(*shape, _real=real, _name=name, **kw):
            t = _real(*shape, **kw)
            if t.numel() >= LARGE and not kw.get("pin_memory", False):
                made.append((_name, tuple(t.shape)))
            return t

        monkeypatch.setattr(torch, name, spy)
    out = batch_to_torch(synthetic_batch(16, (100, 200), (300, 600), seed=1), layout=layout)
    assert {"loss_mask", "response_mask", "input_ids"} <= out.keys()
    assert out["loss_mask"].numel() >= LARGE
    assert made == []
