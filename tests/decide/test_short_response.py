"""The opt-in short_response rule, switched on only through the `rules=` mapping: a finished group
in which some response is shorter than `min_response_length` is evicted; a response of exactly
that length is kept (`response_tokens_min < min_response_length`), on both engines."""
from __future__ import annotations

from pathlib import Path

import pytest

from pipeline import ConfigError, ReplayBuffer
from pipeline.analysis import connect
from sql.loader import run
from tests.support.lake import traj

KEY = "training/short_response/evicted_samples"
RULES = {"short_response": {"min_response_length": 3}}
# responses per group: "short" has one of 2 tokens (< 3), "exact" its shortest of exactly 3
LENGTHS = {"short": [2, 9], "exact": [3, 9], "long": [5, 6]}


def _group(buf: ReplayBuffer, uid: str, lengths: list[int], partition: str = "train") -> None:
    buf.register(partition=partition, uids=[uid], global_steps=1)
    buf.put([traj(uid, s, partition=partition, reward=float(s), response=[7] * n)
             for s, n in enumerate(lengths)])
    buf.update_status(partition=partition, uids=[uid], status="finished")


def test_a_response_shorter_than_the_minimum_evicts_its_group_and_exactly_the_minimum_is_kept(
        tmp_path: Path):
    asked: list[int] = []
    buf = ReplayBuffer.async_(lake=tmp_path / "lake", rules=RULES, refill_fn=asked.append,
                              poll_interval=0.01)
    with buf:
        for uid, lengths in LENGTHS.items():
            _group(buf, uid, lengths)
        # the lake's engine: DuckDB runs the rule file as written over the lake's candidates
        con = connect(tmp_path / "lake")
        lake_hits = run(con, "short_response", min_response_length=3).column("uid").to_pylist()
        # the polars engine: the compiled rule, in a sample call
        batch = buf.sample(1, "train", 2, timeout=5)
    assert lake_hits == ["short"]
    assert batch.uids == ["exact", "long"]
    assert batch.metrics[KEY] == 1 and asked == [1]


def test_the_rule_is_off_by_default_and_on_a_validation_partition():
    buf = ReplayBuffer.async_(poll_interval=0.01)
    _group(buf, "short", [0, 1])
    assert buf.sample(1, "train", 1, timeout=5).uids == ["short"]
    val = ReplayBuffer.async_(rules=RULES, poll_interval=0.01)
    _group(val, "v", [0, 1], partition="val")
    assert val.sample(1, "val", 1, timeout=5).uids == ["v"]


def test_sync_dapo_counts_a_short_group_like_a_filtered_one():
    asked: list[int] = []

    def refill(n: int) -> None:
        asked.append(n)
        for i in range(n):
            _group(buf, f"r{len(asked)}_{i}", [4, 5])

    buf = ReplayBuffer.sync(filter_groups_metric="reward", refill_fn=refill, train_batch_size=1,
                            gen_batch_size=1, rules=RULES, poll_interval=0.01)
    _group(buf, "short", [1, 9])
    batch = buf.sample(1, "train", 1, timeout=5)
    assert asked == [1] and batch.metrics[KEY] == 1   # credit 2, one free in-flight slot


def test_its_knob_is_checked_against_its_declaration():
    with pytest.raises(ConfigError, match="the rule short_response declares min_response_length "
                                          "BIGINT >= 1; pass an int >= 1"):
        ReplayBuffer.async_(rules={"short_response": {"min_response_length": 2.5}})
    with pytest.raises(ConfigError, match=r"\['min_response_length'\]=0: .* pass an int >= 1"):
        ReplayBuffer.async_(rules={"short_response": {"min_response_length": 0}})
    with pytest.raises(ConfigError, match="did you mean 'min_response_length'"):
        ReplayBuffer.async_(rules={"short_response": {"min_response_lenght": 2}})
