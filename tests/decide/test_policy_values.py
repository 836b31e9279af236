"""Policies and partitions are values the poll loop asks, never modes it tests: a validation
partition's configuration has no rule, no refill and no bound; each refill policy declares the
name the lake records; the loop holds no `if` on a mode string or a partition name."""
from __future__ import annotations

import ast
import inspect
from dataclasses import replace

from pipeline import ReplayBuffer
from pipeline.config import async_config, sync_config
from pipeline.decide import poll, selection
from pipeline.decide.policies import (
    POLICIES,
    DapoCredit,
    NoRefill,
    RefillFailedWhileShort,
    ReplaceEvicted,
    WaitGate,
    policy_name,
)
from pipeline.lake import config as lake_config
from pipeline.lake import read_table
from tests.support import python_ast
from tests.support.policies import Refiller, group


def _refill(n: int) -> None:
    pass


def test_a_validation_partitions_configuration_has_no_rule_no_refill_and_no_bound() -> None:
    cfg = async_config(max_off_policy_threshold=3, filter_groups_metric="reward",
                       refill_fn=_refill)
    val = cfg.for_partition("val")
    assert cfg.rules and cfg.bound() == 3 and isinstance(cfg.refill, ReplaceEvicted)
    assert (val.rules, val.refill, val.bound()) == ((), NoRefill(), None)
    assert cfg.for_partition("train") is cfg and cfg.for_partition("other") is cfg


def test_a_validation_partition_keeps_the_wait_gate_and_the_sync_empty_batch_is_no_error() -> None:
    wait = async_config(max_off_policy_threshold=2, max_off_policy_strategy="wait")
    assert wait.for_partition("val").gate == wait.gate == WaitGate(2)
    sync = sync_config()
    assert sync.empty_batch_is_error and not sync.for_partition("val").empty_batch_is_error


def test_the_strategy_is_read_once_into_a_gate_or_none() -> None:
    assert async_config(max_off_policy_strategy="drop").gate is None
    assert async_config(max_off_policy_threshold=None, max_off_policy_strategy="wait").gate is None
    assert sync_config(max_off_policy_strategy="wait").gate is None


def test_each_refill_policy_declares_a_snake_case_name_like_the_eviction_reasons() -> None:
    assert [p.name for p in (NoRefill(), ReplaceEvicted(), RefillFailedWhileShort(),
                             DapoCredit(1, 1))] == \
        ["no_refill", "replace_evicted", "refill_failed_while_short", "dapo_credit"]
    assert all(p.about for p in POLICIES.values())      # a line the report shows
    assert sorted(POLICIES) == sorted(["no_refill", "replace_evicted",
                                       "refill_failed_while_short", "dapo_credit"])


def test_an_old_lakes_camel_case_refill_name_reads_as_todays_name() -> None:
    assert [policy_name(n) for n in ("ReplaceEvicted", "DapoCredit", "NoRefill",
                                     "RefillFailedWhileShort")] == \
        ["replace_evicted", "dapo_credit", "no_refill", "refill_failed_while_short"]
    assert policy_name("replace_evicted") == "replace_evicted"     # today's names stay
    assert policy_name("my_refill") == "my_refill"                 # a user's own policy too
    assert policy_name(None) is None


def test_a_renamed_policy_class_writes_the_declared_name_into_the_lake(tmp_path) -> None:
    Renamed = type("RenamedReplaceEvicted", (ReplaceEvicted,), {})   # noqa: N806
    ref = Refiller(step=1)
    cfg = replace(async_config(filter_groups_metric="reward", refill_fn=ref), refill=Renamed())
    buf = ReplayBuffer(cfg, lake=tmp_path)
    ref.buf = buf
    group(buf, "flat", 1, [1.0, 1.0])
    group(buf, "ok", 1, [0.0, 1.0])
    buf.sample(1, "train", 1, timeout=5)
    buf.close()
    dec = read_table(tmp_path, "decisions").to_pylist()
    assert [r["reason"] for r in dec if r["kind"] == "refill"] == ["replace_evicted"]
    assert lake_config.describe(cfg)["refill"]["policy"] == "replace_evicted"


def _string_tests(fn) -> list[str]:
    """`if` tests (and conditional expressions) of ``fn``'s source that compare something with
    a string or read a mode (`validation`, `drains`, `strategy`, a partition)."""
    tree = python_ast.parse(inspect.getsource(fn))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.IfExp, ast.While)):
            for sub in ast.walk(node.test):
                if isinstance(sub, ast.Compare) and any(
                        isinstance(x, ast.Constant) and isinstance(x.value, str)
                        for x in (sub.left, *sub.comparators)):
                    found.append(ast.unparse(node.test))
                if isinstance(sub, ast.Attribute) and sub.attr in ("validation", "drains",
                                                                   "strategy", "partition"):
                    found.append(ast.unparse(node.test))
    return found


def test_the_poll_loop_and_the_selection_test_no_mode_string_and_no_partition_name() -> None:
    assert _string_tests(poll) == []
    assert _string_tests(selection) == []
