"""Steps and weight versions are bounded at every entry (below 2**62), so the spans, staleness
and group spans the live buffer computes (polars, which wraps on overflow) and those DuckDB
computes over the lake (which refuses) are the same numbers: at the largest accepted step both
engines answer, and agree, down to the token-weighted sums (128 bits in both)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jobs.cli import app
from pipeline import ReplayBuffer
from pipeline.adapters.vllm.outputs import VllmOutputError, versions_row
from pipeline.analysis.views import connect
from pipeline.errors import ConfigError, IngestError
from sql.loader import run

LIMIT = 2**62
TOP = LIMIT - 1


def _row(uid: str, lo: int, hi: int, spans: list[tuple[int, int]] | None = None) -> dict:
    n = sum(k for _, k in spans) if spans else 2
    return {"partition": "train", "uid": uid, "session_id": 0, "min_global_steps": lo,
            "max_global_steps": hi, "reward": 1.0, "prompt_ids": [1],
            "response_ids": list(range(n)),
            "version_spans": None if spans is None else
            [{"version": v, "n_tokens": k} for v, k in spans]}


def test_a_step_of_2_62_is_refused_at_every_entry_naming_the_limit(tmp_path: Path) -> None:
    buf = ReplayBuffer.async_(lake=tmp_path / "lake")
    with pytest.raises(IngestError, match=r"global_steps.*< 2\*\*62 \(4611686018427387904\)"):
        buf.register(partition="train", uids=["a"], global_steps=LIMIT, n=1)
    buf.register(partition="train", uids=["a"], global_steps=0, n=1)
    for lo, hi, column in ((0, LIMIT, "max_global_steps"), (LIMIT, LIMIT, "min_global_steps")):
        with pytest.raises(IngestError, match=rf"'{column}', row 0: must be .* < 2\*\*62"):
            buf.put([_row("a", lo, hi)])
    for call in (lambda: buf.sample(LIMIT, "train", 1, timeout=0),
                 lambda: buf.wait_for_sampleable(LIMIT, "train", 1, timeout=0),
                 lambda: buf.get_sampleable_count(LIMIT, "train"),
                 lambda: buf.reissue(LIMIT),
                 lambda: buf.retire("train", ["a"], global_steps=LIMIT)):
        with pytest.raises(ConfigError, match=r"global_steps=4611686018427387904 must be .*2\*\*62"):
            call()
    assert buf.counts("train")["pending"] == 1 and buf.lookup("train", "a").removed is None
    buf.close()


def test_retire_refuses_a_step_that_is_not_one(tmp_path: Path) -> None:
    buf = ReplayBuffer.async_(lake=tmp_path / "lake")
    buf.register(partition="train", uids=["a"], global_steps=0, n=1)
    for bad in (-1, "3", 2.0, True):
        with pytest.raises(ConfigError, match="retire: global_steps="):
            buf.retire("train", ["a"], global_steps=bad)
    assert buf.lookup("train", "a").removed is None
    buf.close()


def test_at_the_largest_step_the_live_batch_and_the_lake_agree(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    buf = ReplayBuffer.async_(lake=lake, max_off_policy_threshold=None)
    buf.register(partition="train", uids=["old", "new"], global_steps=0, n=1)
    # a span of 2**62 - 1 versions, and 4 tokens whose staleness sum needs more than 64 bits
    buf.put([_row("old", 0, TOP - 1, [(0, 1), (TOP - 1, 3)]), _row("new", TOP - 1, TOP - 1)])
    buf.update_status(partition="train", uids=["old", "new"], status="finished")
    batch = buf.sample(TOP, "train", 2, timeout=5)
    live = {u: (s, st, g) for u, s, st, g in zip(*(batch.table.column(c).to_pylist() for c in (
        "uid", "span", "staleness", "group_span")))}
    assert live == {"old": (TOP, 0, LIMIT), "new": (1, 0, LIMIT)}
    metrics = batch.metrics
    buf.release(batch)
    buf.close()

    con = connect(lake)
    prov = con.sql("select uid, span, staleness, group_span, token_staleness_sum "
                   "from provenance order by uid").fetchall()
    assert prov == [("new", 1, 0, LIMIT, None), ("old", TOP, 0, LIMIT, TOP - 1)]
    (row,) = run(con, "off_policy").to_pylist()
    assert row["trajectory_spans_max"] == metrics["training/off_policy/trajectory_spans/max"] == TOP
    assert row["token_staleness_exact_mean"] == \
        metrics["training/off_policy/token_staleness_exact/mean"] == (TOP - 1) / 4
    assert row["token_staleness_mean"] == metrics["training/off_policy/token_staleness/mean"] == 0
    spans = dict(con.sql("select uid, span from trajectory_fates").fetchall())
    assert spans == {"old": TOP, "new": 1}
    res = CliRunner().invoke(app, ["sql", "--lake", str(lake), "--format", "json",
                                   "select token_staleness_sum as s from provenance where uid = 'old'"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == [{"s": TOP - 1}]     # a 128-bit sum is a JSON number


def test_the_vllm_adapter_refuses_a_weight_version_past_the_limit() -> None:
    assert versions_row([(TOP, 2)], 2, None, "c0")["max_global_steps"] == TOP
    with pytest.raises(VllmOutputError, match=r"c0: weight version 4611686018427387904 .*2\*\*62"):
        versions_row([(0, 1), (LIMIT, 1)], 2, None, "c0")
    with pytest.raises(VllmOutputError, match=r"c0: global_steps=4611686018427387904 .*2\*\*62"):
        versions_row(None, 2, LIMIT, "c0")


def test_the_verl_adapter_names_the_rows_whose_versions_pass_the_limit() -> None:
    """The rows are those of the keys read (the mirror names their TransferQueue keys and takes
    out just their groups: tests/adapters/verl/test_verl_refused.py)."""
    from pipeline.adapters.verl.rows import _table
    todo = [("a_0_0", ("a", 0, 0), 1), ("b_0_0", ("b", 0, 0), 1), ("c_0_0", ("c", 0, 0), 1)]
    tags = [{"min_global_steps": 0, "max_global_steps": TOP},
            {"min_global_steps": 0, "max_global_steps": 2**63},     # past int64 itself
            {"min_global_steps": LIMIT, "max_global_steps": LIMIT}]
    with pytest.raises(IngestError, match=r"rows 1, 2: .*< 2\*\*62") as error:
        _table("train", todo, tags, [0, 1, 2], [None] * 3, [None] * 3, {}, None)
    assert [p.rows for p in error.value.problems] == [(1, 2)]
    rows = _table("train", todo[:1], tags[:1], [0], [None], [None], {}, None)
    assert rows.column("max_global_steps").to_pylist() == [TOP]
