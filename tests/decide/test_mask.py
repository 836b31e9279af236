"""`max_off_policy_strategy="mask"`: a chosen group over the staleness bound is trained with its
loss switched off instead of being evicted: the batch stays full, nothing is re-generated, its
rows carry `is_stale`, `to_torch` zeroes them in `loss_mask`, a metric counts them, the lake's
`select` row records the decision, and `certificate_holds` lists exactly the masked rows."""
from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from jobs.export.main import ExportConfig, export
from pipeline import ReplayBuffer
from pipeline.analysis.views import connect
from pipeline.config import STRATEGIES
from pipeline.decide.metrics import StepAggregator
from pipeline.errors import ConfigError
from sql.loader import run
from tests.support.policies import Refiller, group, make

MASKED = "training/off_policy/masked_samples"
EVICTED = "training/off_policy/evicted_samples"


def _at_the_bound(lake: Path, strategy: str, **kw) -> tuple[ReplayBuffer, Refiller, object]:
    """threshold 3 at step 5: `span3` (dispatched at 3) is exactly at the bound, `span4` (at 2)
    one step over; both finished, two trajectories each."""
    ref = Refiller(step=5)
    buf = make("async", ref, max_off_policy_threshold=3, max_off_policy_strategy=strategy,
               lake=lake, **kw)
    group(buf, "span3", 3, [0.0, 1.0])
    group(buf, "span4", 2, [0.0, 1.0])
    return buf, ref, buf.sample(5, "train", 2, timeout=5)


def test_mask_keeps_the_group_one_over_the_bound_masked_and_the_one_at_it_unmasked(
        tmp_path: Path) -> None:
    buf, ref, batch = _at_the_bound(tmp_path / "lake", "mask")
    buf.close()
    assert ref.calls == []                          # nothing re-generated
    assert batch.uids == ["span4", "span3"] and batch.masked == ["span4"]
    stale = dict(zip(batch.table["uid"].to_pylist(), batch.table["is_stale"].to_pylist()))
    assert stale == {"span4": True, "span3": False}
    assert batch.metrics[MASKED] == 2 and EVICTED not in batch.metrics
    assert (batch.bound, batch.strategy) == (3, "mask")
    con = connect(tmp_path / "lake")   # every decision: two selections, no eviction, no refill
    assert con.sql("select kind, uid, reason, group_span, bound, strategy from decisions "
                   "order by seq").fetchall() == [
        ("select", "span4", "stale", 4, 3, "mask"), ("select", "span3", None, 3, 3, "mask")]


def test_drop_at_the_same_boundary_evicts_the_group_one_over_and_refills_it(
        tmp_path: Path) -> None:
    buf, ref, batch = _at_the_bound(tmp_path / "lake", "drop")
    buf.close()
    assert ref.calls == [1]
    assert batch.uids == ["span3", "refill0"] and batch.masked == []
    assert not any(batch.table["is_stale"].to_pylist())
    assert batch.metrics[EVICTED] == 1 and MASKED not in batch.metrics


def test_certificate_holds_lists_exactly_the_masked_rows(tmp_path: Path) -> None:
    buf, _, batch = _at_the_bound(tmp_path / "lake", "mask")
    buf.close()
    t = batch.table
    masked_seqs = [s for s, x in zip(t["seq"].to_pylist(), t["is_stale"].to_pylist()) if x]
    assert len(masked_seqs) == 2
    found = run(connect(tmp_path / "lake"), "certificate_holds")
    assert found.column("seq").to_pylist() == masked_seqs
    assert set(found.column("strategy").to_pylist()) == {"mask"}
    assert batch.certificate.violations.column("seq").to_pylist() == masked_seqs


@pytest.mark.parametrize("strategy", ["drop", "admit", "wait"])
def test_no_row_is_masked_under_the_other_strategies(tmp_path: Path, strategy: str) -> None:
    buf, _, batch = _at_the_bound(tmp_path / "lake", strategy, train_batch_size=2)
    buf.close()
    found = run(connect(tmp_path / "lake"), "certificate_holds")
    # drop and admit evict span4; wait gates in-flight groups only, so the finished span4 is
    # trained over the bound, unmasked, and the audit names both its rows
    assert found.column("uid").to_pylist() == (["span4"] * 2 if strategy == "wait" else [])
    assert not any(batch.table["is_stale"].to_pylist())
    assert batch.masked == []


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_loss_mask_is_the_response_mask_with_the_masked_rows_zeroed(tmp_path: Path,
                                                                     layout: str) -> None:
    buf, _, batch = _at_the_bound(tmp_path / "lake", "mask")
    buf.close()
    out = batch.to_torch(layout=layout)
    stale = batch.table["is_stale"].to_pylist()
    assert any(stale) and not all(stale)
    if layout == "padded":
        keep = torch.tensor([not s for s in stale], dtype=torch.int64)[:, None]
        assert torch.equal(out["loss_mask"], out["response_mask"] * keep)
        assert torch.equal(out["responses_loss_mask"], out["responses_mask"] * keep)
    else:
        cu = out["cu_seqlens"].tolist()
        for i, s in enumerate(stale):
            piece = slice(cu[i], cu[i + 1])
            want = torch.zeros_like(out["response_mask"][0, piece]) if s else \
                out["response_mask"][0, piece]
            assert torch.equal(out["loss_mask"][0, piece], want)
    assert out["response_mask"].sum() > out["loss_mask"].sum() > 0


def test_loss_mask_equals_the_response_mask_when_nothing_is_masked(tmp_path: Path) -> None:
    buf, _, batch = _at_the_bound(tmp_path / "lake", "drop")
    buf.close()
    out = batch.to_torch()
    assert torch.equal(out["loss_mask"], out["response_mask"])
    assert out["loss_mask"].data_ptr() != out["response_mask"].data_ptr()   # a copy


def test_the_masked_count_is_a_sum_across_calls_and_excludes_padding() -> None:
    buf = make("async", max_off_policy_threshold=1, max_off_policy_strategy="mask")
    buf.register(partition="train", uids=["p"], global_steps=0)
    buf.put([{"partition": "train", "uid": "p", "session_id": s, "min_global_steps": 0,
              "max_global_steps": 0, "reward": float(s), "prompt_ids": [1],
              "response_ids": [2], "is_padding": s == 2} for s in range(3)])
    buf.update_status(partition="train", uids=["p"], status="running")
    buf.update_status(partition="train", uids=["p"], status="finished")
    group(buf, "q", 0, [0.0, 1.0])
    agg = StepAggregator()
    first = buf.sample(3, "train", 1, timeout=5)
    second = buf.sample(3, "train", 1, timeout=5)
    assert first.table["is_stale"].to_pylist() == [True, True, True]
    assert (first.metrics[MASKED], second.metrics[MASKED]) == (2, 2)
    agg.add(first)
    agg.add(second)
    assert agg.result()[MASKED] == 4


def test_a_validation_partition_masks_nothing_and_records_no_bound() -> None:
    buf = make("async", max_off_policy_threshold=1, max_off_policy_strategy="mask")
    group(buf, "v", 0, [0.0, 1.0], partition="val")
    batch = buf.sample(9, "val", 1, timeout=5)
    assert not any(batch.table["is_stale"].to_pylist())
    assert (batch.bound, batch.strategy, batch.masked) == (None, None, [])
    assert "validation/off_policy/masked_samples" not in batch.metrics


def test_mask_without_a_threshold_is_unbounded_and_the_strategy_is_listed() -> None:
    buf = make("async", max_off_policy_threshold=None, max_off_policy_strategy="mask")
    group(buf, "old", 0, [0.0, 1.0])
    batch = buf.sample(100, "train", 1, timeout=5)
    assert (batch.bound, batch.masked) == (None, [])
    assert "mask" in STRATEGIES
    with pytest.raises(ConfigError, match="'mask'"):
        make("async", max_off_policy_strategy="masked")


def test_an_export_of_a_masked_run_marks_the_rows_the_batch_marked(tmp_path: Path) -> None:
    buf, _, batch = _at_the_bound(tmp_path / "lake", "mask")
    buf.close()
    export(ExportConfig(lake=tmp_path / "lake", out=tmp_path / "out", progress=False,
                        partitions=("train",)))
    rows = pq.read_table(sorted((tmp_path / "out" / "train").glob("shard-*.parquet")))
    got = sorted(zip(rows["uid"].to_pylist(), rows["session_id"].to_pylist(),
                     rows["is_stale"].to_pylist()))
    want = sorted(zip(batch.table["uid"].to_pylist(), batch.table["session_id"].to_pylist(),
                      batch.table["is_stale"].to_pylist()))
    assert got == want and sum(s for *_, s in got) == 2
