"""Per-dataset staleness bounds: `max_off_policy_threshold={"math": 2, "code": 4, "*": 3}`
checked like every other setting, and the `stale` rule judging each group by its own dataset's
bound (a group exactly at its bound is kept, one over it evicted), live and over the lake."""
from __future__ import annotations

from pathlib import Path

import pytest

from pipeline import ConfigError, ReplayBuffer, async_config, sync_config
from pipeline.analysis.views import connect, recorded_lookups
from pipeline.analysis.whatif.rerun import replay
from pipeline.config.stale_bounds import DEFAULT_KEY, ThresholdError
from pipeline.errors import LakeError
from sql.loader import run
from tests.support.policies import group

BOUNDS = {"math": 2, "code": 4, "*": 3}
STEP = 6
# (uid, dataset, group span at STEP): each dataset at its bound and one over it
GROUPS = [("math-at", "math", 2), ("math-over", "math", 3), ("code-at", "code", 4),
          ("code-over", "code", 5), ("web-at", "web", 3), ("web-over", "web", 4),
          ("none-at", None, 3), ("none-over", None, 4)]
OVER = {"math-over", "code-over", "web-over", "none-over"}


# --- the setting ---------------------------------------------------------------------------------

def test_a_mapping_with_a_default_gives_each_dataset_its_bound() -> None:
    cfg = async_config(max_off_policy_threshold=BOUNDS)
    assert DEFAULT_KEY == "*"
    assert [cfg.bound_of(d) for d in ("math", "code", "web", None)] == [2, 4, 3, 3]
    assert cfg.stale.given() == BOUNDS
    assert cfg.bound() == 4                      # the loosest; each group keeps its own
    assert async_config(max_off_policy_threshold={"*": 5}).bound_of("math") == 5


@pytest.mark.parametrize(("value", "message"), [
    ({"math": 2}, r"=\{'math': 2\} has no '\*' entry; give the bound of every dataset not "
                  r"named .*e\.g\. \{'math': 2, '\*': 8\}"),
    ({"math": 0, "*": 3}, r"max_off_policy_threshold\['math'\]=0; each bound is a positive int"),
    ({"math": -1, "*": 3}, r"\['math'\]=-1"),
    ({"math": 2.5, "*": 3}, r"\['math'\]=2.5"),
    ({"math": True, "*": 3}, r"\['math'\]=True"),
    ({"*": None}, r"\['\*'\]=None"),
    ({"": 2, "*": 3}, "has the key ''; keys are dataset names"),
    ({3: 2, "*": 3}, "has the key 3"),
    ("math", "max_off_policy_threshold='math'; use a positive int, None .* or a mapping"),
])
def test_a_bad_mapping_is_refused_naming_the_entry(value: object, message: str) -> None:
    for make in (async_config, sync_config):     # sync validates the setting too
        with pytest.raises(ThresholdError, match="Invalid max off policy threshold: .*" + message):
            make(max_off_policy_threshold=value)


@pytest.mark.parametrize("strategy", ["wait", "mask"])
def test_per_dataset_bounds_with_wait_or_mask_are_refused(strategy: str) -> None:
    with pytest.raises(ConfigError, match=f"strategy='{strategy}': per-dataset bounds apply to "
                                          "'drop' and 'admit'"):
        async_config(max_off_policy_threshold=BOUNDS, max_off_policy_strategy=strategy)
    async_config(max_off_policy_threshold={"*": 3}, max_off_policy_strategy=strategy)  # one bound


def test_admission_counts_places_under_the_tightest_bound() -> None:
    mapped = ReplayBuffer.async_(max_off_policy_threshold=BOUNDS, train_batch_size=4,
                                 max_off_policy_strategy="admit")
    flat = ReplayBuffer.async_(max_off_policy_threshold=2, train_batch_size=4,
                               max_off_policy_strategy="admit")
    assert mapped.dispatch_capacity(3, "train") == flat.dispatch_capacity(3, "train") == 2 * 4


# --- the rule, live ------------------------------------------------------------------------------

def _buffer(lake: Path | None = None) -> ReplayBuffer:
    buf = ReplayBuffer.async_(max_off_policy_threshold=BOUNDS, lake=lake)
    for uid, dataset, span in GROUPS:
        group(buf, uid, STEP - span + 1, [0.0, 1.0], dataset=dataset)
    return buf


def test_each_group_is_kept_at_exactly_its_dataset_bound_and_evicted_one_over() -> None:
    buf = _buffer()
    assert buf.get_sampleable_count(STEP, "train") == len(GROUPS) - len(OVER)
    batch = buf.sample(global_steps=STEP, partition_id="train", batch_size=4)
    assert set(batch.uids) == {u for u, _, _ in GROUPS} - OVER
    assert batch.metrics["training/off_policy/evicted_samples"] == len(OVER)


def test_one_step_earlier_every_group_is_within_its_bound() -> None:
    buf = _buffer()
    # at STEP - 1 every span is one less: each `-over` group is exactly at its bound, so kept
    assert buf.get_sampleable_count(STEP - 1, "train") == len(GROUPS)
    batch = buf.sample(global_steps=STEP - 1, partition_id="train", batch_size=1)   # the oldest
    assert batch.uids == ["code-over"]
    # a step later the other three are one over
    assert buf.get_sampleable_count(STEP, "train") == len(GROUPS) - 1 - (len(OVER) - 1)


# --- the lake ------------------------------------------------------------------------------------

def test_the_lake_records_the_mapping_and_its_rule_run_agrees(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    with _buffer(lake) as buf:
        buf.sample(global_steps=STEP, partition_id="train", batch_size=4)
    con = connect(lake)
    evicted = {r[0] for r in con.sql(
        "select uid from decisions where kind = 'evict' and reason = 'stale'").fetchall()}
    assert evicted == OVER
    # the rule file over the lake's state before that call, with the run's recorded bounds
    with _buffer(tmp_path / "again") as buf:
        pass
    con = connect(tmp_path / "again")
    con.register("stale_bounds", recorded_lookups(tmp_path / "again")["stale_bounds"])
    got = run(con, "stale", step=STEP, threshold=3, tightest=2).column("uid").to_pylist()
    assert set(got) == OVER


def test_a_restart_keeps_the_mapping_and_refuses_another(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    with ReplayBuffer.async_(max_off_policy_threshold=BOUNDS, lake=lake):
        pass
    with ReplayBuffer.async_(max_off_policy_threshold=dict(BOUNDS), lake=lake) as buf:
        assert buf.config.bound_of("math") == 2
    with pytest.raises(LakeError, match="max_off_policy_threshold"):
        ReplayBuffer.async_(max_off_policy_threshold={**BOUNDS, "math": 3}, lake=lake)


def test_a_what_if_replays_a_recorded_run_under_per_dataset_bounds(tmp_path: Path) -> None:
    """A run recorded with one loose bound, replayed with math's bound at 2: only the math group
    over it is evicted; the one exactly at it and every code group stay."""
    with ReplayBuffer.async_(max_off_policy_threshold=100, lake=tmp_path / "lake") as buf:
        for uid, dataset, gs in (("m-over", "math", 0), ("c-old", "code", 0),
                                 ("m-at", "math", 3), ("c-new", "code", 3)):
            group(buf, uid, gs, [0.0, 1.0], dataset=dataset)
        buf.release(buf.sample(global_steps=4, partition_id="train", batch_size=4))
    replay(tmp_path / "lake", tmp_path / "out", max_off_policy_threshold={"math": 2, "*": 8})
    evicted = connect(tmp_path / "out" / "lake").sql(
        "select uid from decisions where kind = 'evict' and reason = 'stale'").fetchall()
    assert evicted == [("m-over",)]


# --- the certificate -----------------------------------------------------------------------------

def test_each_row_is_certified_under_its_own_datasets_bound_live_and_in_the_lake(
        tmp_path: Path) -> None:
    """The four groups left are each exactly at their bound (math 2, code 4, and the default 3
    for `web`, which the mapping does not name, and for a group without a dataset): every row
    is recorded under its own bound, not the loosest (4), and holds."""
    lake = tmp_path / "lake"
    with _buffer(lake) as buf:
        batch = buf.sample(global_steps=STEP, partition_id="train", batch_size=4)
    want = {u: (BOUNDS.get(d, BOUNDS[DEFAULT_KEY]) if d else BOUNDS[DEFAULT_KEY], span)
            for u, d, span in GROUPS if u not in OVER}
    assert {u: b for u, (b, _) in want.items()} == {"math-at": 2, "code-at": 4, "web-at": 3,
                                                      "none-at": 3}
    assert all(b == span for b, span in want.values())          # each one exactly at its bound
    cert = batch.certificate
    got = {r["uid"]: (r["bound"], r["group_span"]) for r in cert.rows.to_pylist()}
    assert got == want
    assert batch.group_bounds == {u: b for u, (b, _) in want.items()}
    assert (cert.bound, batch.bound, cert.strategy) == (4, 4, "drop")  # the loosest of the batch
    assert cert.holds
    con = connect(lake)
    assert con.sql("select * from certificates order by seq").to_arrow_table().to_pylist() == \
        cert.rows.to_pylist()
    assert dict(con.sql("select uid, bound from decisions where kind = 'select'").fetchall()) == \
        {u: b for u, (b, _) in want.items()}
    assert con.sql("select bound from batches").fetchall() == [(4,)]
    assert run(con, "certificate_holds").num_rows == 0
