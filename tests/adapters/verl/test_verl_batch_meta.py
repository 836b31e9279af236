"""The sampled batch's `KVBatchMeta`, built without TransferQueue's deepcopy over flat tags, must
equal the one its constructor builds and share nothing mutable with the caller's listing."""
from __future__ import annotations

import numpy as np
import pytest

from pipeline.adapters.verl.keys import batch_meta
from tests.support.extras import need

tq = need("transfer_queue", "verl")

_TAG = {"status": "success", "prompt_len": 6, "response_len": 8, "seq_len": 14,
        "global_steps": 10, "min_global_steps": 9, "max_global_steps": 9, "is_padding": False,
        "score": 0.5, "note": None}


def _listing(n: int) -> tuple[list[str], list[dict]]:
    keys = [f"u{i // 4}_{i % 4}_0" for i in range(n)]
    tags = [dict(_TAG, seq_len=i) for i in range(n)]
    tags[1] = {"spans": [1, 2], "version": np.int64(3), "nested": {"a": [0]}}   # mutable values
    tags[2] = {}
    return keys, tags


def test_the_batch_meta_equals_the_one_transferqueue_builds():
    keys, tags = _listing(256)
    ours = batch_meta("train", keys, tags)
    theirs = tq.KVBatchMeta(partition_id="train", keys=keys, tags=tags)
    assert type(ours) is type(theirs)
    assert (ours.keys, ours.tags, ours.partition_id, ours.fields, ours.extra_info) == \
        (theirs.keys, theirs.tags, theirs.partition_id, theirs.fields, theirs.extra_info)
    assert ours.size == theirs.size == len(ours) == 256
    assert ours.select_keys(keys[:8]).tags == theirs.select_keys(keys[:8]).tags


def test_the_batch_meta_shares_no_tag_with_the_listing():
    keys, tags = _listing(8)
    meta = batch_meta("train", keys, tags)
    assert all(a is not b for a, b in zip(meta.tags, tags))
    assert meta.tags[1]["spans"] is not tags[1]["spans"]
    assert meta.tags[1]["nested"]["a"] is not tags[1]["nested"]["a"]
    meta.tags[0]["status"] = "changed"
    meta.tags[1]["spans"].append(3)
    assert tags[0]["status"] == "success" and tags[1]["spans"] == [1, 2]


def test_duplicate_keys_are_refused_as_transferqueue_refuses_them():
    with pytest.raises(ValueError, match="duplicated keys"):
        batch_meta("train", ["a", "a"], [{}, {}])
